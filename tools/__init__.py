"""Developer and operator tools around the product: the demo, the fake provider, an embedded Redis, offline commands.

:mod:`tools.demo` (``fanout demo``: the page, its routes as a publisher plug-in, the
whole-stack launcher), :mod:`tools.upstream` (``fanout upstream``: recorded bodies served
as the providers would), :mod:`tools.embedded_redis`, :mod:`tools.replay` and
:mod:`tools.replay_cli` (``fanout replay``), :mod:`tools.export` and
:mod:`tools.export_cli` (``fanout export``), :mod:`tools.health` (``fanout health``).

May import anything of the product. The product (:mod:`worker`, :mod:`publisher`,
:mod:`infra`, :mod:`schema`) never imports this package; the publisher serves the demo
routes only through the plug-in :func:`tools.demo.routes.install` that ``fanout
publisher`` hands it.
"""
