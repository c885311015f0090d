"""``fanout demo``: the page, its routes, the case catalogue, the view, the streams and the stack launcher."""
