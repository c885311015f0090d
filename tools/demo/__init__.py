"""``fanout demo``: the demo page and its routes, the case catalogue, the terminal view and the whole-stack launcher."""
