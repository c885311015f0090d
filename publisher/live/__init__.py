"""The live fan-out: one subscription per stream per process, topics, readers, sessions, audits.

:mod:`~publisher.live.hub` owns the pub/sub links (:mod:`~publisher.live.pubsub`,
:mod:`~publisher.live.shard_links`) and the topics (:mod:`~publisher.live.topic`) whose
readers (:mod:`~publisher.live.reader`) are served by sessions
(:mod:`~publisher.live.session`, :mod:`~publisher.live.read_ahead`); notifications are
parsed by :mod:`~publisher.live.notification`, batched reads made by
:mod:`~publisher.live.reads`, idle topics checked by :mod:`~publisher.live.audit`.

May import :mod:`publisher.history`, :mod:`publisher.wire`, :mod:`infra` and
:mod:`schema`. Must not import :mod:`publisher.api`, :mod:`worker` or :mod:`tools`.
"""
