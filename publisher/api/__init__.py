"""The publisher's HTTP surface: the route table, handlers, auth and read tokens, limits, problems, middleware.

Handlers (:mod:`~publisher.api.submit`, :mod:`~publisher.api.status`,
:mod:`~publisher.api.events`, :mod:`~publisher.api.ui_stream`, :mod:`~publisher.api.agui_stream`,
:mod:`~publisher.api.durable`, :mod:`~publisher.api.readiness`) turn requests into answers; everything a request needs
to know about credentials, limits and errors lives beside them.

May import :mod:`publisher.live`, :mod:`publisher.history`, :mod:`publisher.wire`, the
publisher's settings/state/telemetry, :mod:`infra` and :mod:`schema`. Must not import
:mod:`worker` or :mod:`tools`.
"""
