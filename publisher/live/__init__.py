"""The live fan-out: one subscription per stream per process, topics, readers, sessions, audits.

:mod:`~publisher.live.hub` owns the topics (:mod:`~publisher.live.topic`) and their
subscriptions: one classic pub/sub connection (:mod:`~publisher.live.classic_link`) or one
sharded link per primary (:mod:`~publisher.live.shard_links`, :mod:`~publisher.live.shard`),
each over :mod:`~publisher.live.pubsub`. Readers (:mod:`~publisher.live.reader`) are
served by sessions (:mod:`~publisher.live.session`, which writes through
:mod:`~publisher.live.writer` and reads ahead with :mod:`~publisher.live.read_ahead`);
notifications are parsed by :mod:`~publisher.live.notification`, batched reads made by
:mod:`~publisher.live.reads`, idle topics checked by :mod:`~publisher.live.audit`.

May import :mod:`publisher.history`, :mod:`publisher.wire`, :mod:`infra` and
:mod:`schema`. Must not import :mod:`publisher.api`, :mod:`worker` or :mod:`tools`.
"""
