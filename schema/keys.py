"""Redis key layout, the meta-hash fields and the stream-entry codec shared by worker and publisher.

Layout (ARCHITECTURE.md, "Redis layout"), with ``P`` the deployment's key prefix
(``FANOUT_REDIS_PREFIX``, default ``fanout``) and every per-stream key hash-tagged
``{<stream_id>}`` so one stream's keys share a Redis Cluster slot:

=============================  ========  ===================================================
key                            type      content
=============================  ========  ===================================================
``P:jobs:{<n>}``               stream    jobs shard ``n`` (``FANOUT_JOB_SHARDS``): one entry per job in
                                         flight, field ``j`` = Job JSON; group ``workers``; the entry is
                                         deleted once the job's terminal event is stored
``P:jobshards``                set       every shard count a publisher used (decimal), for the workers
``P:jobs``                     stream    legacy unsharded jobs stream: served while it exists, never written
``P:{id}:events``              stream    entry id ``0-<seq>``, field ``c`` = the event's compact stored
                                         form (:mod:`schema.stored`); streams stored before it: field
                                         ``e`` = the event JSON
``P:{id}:meta``                hash      see :data:`META_FIELDS`
``P:{id}:live``                channel   PUBLISH (SPUBLISH on a Redis 7 cluster) after each append
``P:{id}:cancel``              string    ``1`` once a client asked to cancel; TTL ``cancel_ttl_s``
``P:{id}:tomb``                hash      ``last_seq``, ``status``, ``epoch`` kept after the events expire
``P:done``                     stream    one summary per finished stream (``MAXLEN ~``), for analytics
``P:cancels``                  channel   PUBLISH of a stream id whose cancel was requested
``P:probe``                    string    readiness write probe (``SET ... PX``), short-lived
``P:compact``                  zset      finished streams due for compaction (score: due ms), swept by workers
=============================  ========  ===================================================

Protocol between the two sides (TTL settings: worker ``FANOUT_STREAM_TTL_S`` default
86400 s, ``FANOUT_TOMBSTONE_TTL_S`` default 604800 s, ``FANOUT_DONE_MAXLEN`` default
100000; publisher ``FANOUT_CANCEL_TTL_S`` default 86400 s):

* Submission (publisher, :mod:`publisher.api.submit`). One script on the stream's slot (KEYS
  meta, tomb, events) answers ``same``/``conflict`` when meta exists (same or other
  ``body_hash``) and ``used`` when only a tombstone or events remain; else it creates
  ``meta`` with ``body_hash``, ``state=queued``, ``provider``, ``model``,
  ``created_ms``, ``last_seq=0`` and no TTL. Then ``XADD P:jobs:{<n>} * j <Job JSON>``
  with ``n = shard_of(stream_id, FANOUT_JOB_SHARDS)`` (CRC-32 modulo the count; no cap:
  the shards hold only jobs in flight), then ``HSETNX meta job_id <job ref>`` (``<jobs
  stream>/<entry id>``). The two writes are separate commands in separate slots. Every
  publisher also records its shard count (``SADD P:jobshards <n>``) at start and at most
  every 30 s of submissions, and creates its shards' groups at start. When the ``XADD``
  raises a Redis error the publisher deletes the fresh meta (``DEL``, so a retry with
  the same stream id can submit again) and re-raises (503 ``redis-unavailable``). If
  that ``DEL`` fails too, or the publisher dies between the meta script and the
  ``XADD``, the ``queued`` meta stays without a job. A resubmission of the same body
  more than 30 s later (``ORPHAN_AFTER_MS`` of :mod:`publisher.api.submit`) finds it
  (``orphan``: queued, no ``job_id``), refreshes ``created_ms`` in the same script so
  concurrent retries cannot both win, and enqueues the job. An ``XADD`` that raised
  although Redis applied it leaves a job whose meta was deleted; the worker's claim
  recreates the fields it needs (below).
* Intake (worker, :mod:`worker.intake`): every worker reads every shard ``0 ..
  max(own FANOUT_JOB_SHARDS, P:jobshards) - 1`` and the legacy ``P:jobs`` while it exists,
  one blocking ``XREADGROUP`` per stream, and recreates a missing group (``NOGROUP``).
* Claim (worker, :mod:`worker.lease`, one script on the stream's slot, KEYS meta, tomb).
  A tombstone or meta ``state=done`` means finished: nothing is written and the job is
  acked and deleted (below). Otherwise ``HINCRBY token 1`` (the fencing token),
  ``HSET owner <consumer> state running job_id <job ref>``, and ``HSETNX`` (only where missing, e.g. no
  publisher meta) ``started_ms <now>`` (so it keeps the first claim's time),
  ``last_seq 0``, ``provider``, ``model``. No TTL while running.
* Ack (worker, :mod:`worker.lease`, one script on the jobs shard's slot): ``XACK`` and
  ``XDEL`` of the job entry together, once its terminal event is stored, when it can
  never run (undecodable, invalid) or when the claim found it done. No request body
  outlives its stream: meta, tombstone, events and ``P:done`` hold no request.
* Appends (worker, :mod:`worker.appender`, one script on the stream's slot, KEYS
  events, meta, tomb, live) must present that token, so an older owner is fenced out;
  they write ``0-<seq>`` entries, advance ``last_seq`` (with seq 1 they store the writer's
  ``epoch``; after it they must name meta's) and ``PUBLISH`` it on ``live``
  (``SPUBLISH`` on a Redis 7 cluster: ``infra.live_pubsub.live_mode``). On a
  terminal event they set ``state=done``, ``status``, ``ended_ms``, ``EXPIRE`` events and
  meta ``stream_ttl_s``, and write the tombstone with ``EXPIRE tombstone_ttl_s``. The
  summary then goes to ``P:done`` by a separate ``XADD MAXLEN ~ done_maxlen`` (another
  slot); a crash in between loses that summary line, never an event.
* Lease (worker): renewal resets the job's pending-entry idle time (``XCLAIM <shard>
  workers <me> 0 <id> JUSTID``) after checking meta ``token``; it writes no meta. Release
  at shutdown writes no meta either: ``XCLAIM ... IDLE <lease_ms> JUSTID`` makes the
  still-pending entry look a whole lease idle, so the next ``XAUTOCLAIM`` of any worker
  takes it at once; meta keeps ``state=running`` and the old ``owner``/``token`` until
  that claim overwrites them.
* Cancel (publisher, :mod:`publisher.api.status`, only for a known stream not yet done): a
  plain ``SET P:{id}:cancel 1 EX cancel_ttl_s``, then ``PUBLISH P:cancels <id>`` (two
  commands: a cluster pipeline refuses ``PUBLISH``). The owning worker aborts and writes ``stream.error`` ``cancelled``;
  the flag is also read at claim and at every lease renewal (a missed notification),
  and is never deleted: it expires with its TTL.

Redis Cluster: every server-side script touches the keys of ONE slot and names each of
them in ``KEYS`` (tests/worker/test_cluster_scripts.py checks both); each jobs shard
(its own hash tag ``{<n>}``), ``P:jobs``, ``P:jobshards``, ``P:done`` and ``P:cancels``
have their own slots and are only reached by plain commands or by a script of their
own on one key. Classic pub/sub (``P:cancels``; ``P:{id}:live`` on a single node and on
Redis 6.2) reaches every node; on a Redis 7 cluster ``P:{id}:live`` is a shard channel of
its stream's slot (``SPUBLISH``/``SSUBSCRIBE``), heard only at that slot's owner.

Pure: no redis import.
"""

from __future__ import annotations

import zlib
from typing import Final

EVENT_FIELD: Final = b"e"
"""Field of an events-stream entry that holds the event JSON (the form before :mod:`schema.stored`; still read)."""
JOB_FIELD: Final = b"j"
"""Field of a jobs-stream entry that holds the Job JSON."""
JOBS_GROUP: Final = "workers"
"""Consumer group the workers share on every jobs stream."""
MAX_JOB_SHARDS: Final = 1024
"""Largest ``FANOUT_JOB_SHARDS``."""

META_FIELDS: Final = {
    "state": "queued | running | done",
    "status": "terminal status once done (completed, incomplete, failed, interrupted, cancelled)",
    "last_seq": "seq of the last stored event, 0 before stream.start",
    "token": "fencing token of the current owner (incremented on every claim)",
    "owner": "consumer name of the worker that claimed the stream last",
    "provider": "provider API of the job",
    "model": "requested model",
    "created_ms": "submission time (ms since the Unix epoch)",
    "started_ms": "first claim time (HSETNX: later claims keep it)",
    "ended_ms": "terminal event time",
    "body_hash": "hash of the submitted body, for idempotent resubmission",
    "job_id": "ref of the job entry that runs the stream (set after the XADD only when missing, and at every claim); "
              "a claim from another entry while the stream runs is a duplicate (the XADD re-sent after a lost reply)",
    "batch": "random id of the last stored batch (an append retried after a lost reply finds it: landed)",
    "epoch": "the generation stored (contract 1.1): set with seq 1 by the writer of stream.start; later batches must "
             "name it (a Redis restored from an older snapshot no longer holds it: their writer is fenced out)",
    "error_category": "set only when storage refused the terminal event: the terminal's error category",
    "error_message": "set only when storage refused the terminal event: the terminal's error message",
    "compacted": "set once the finished stream's events were rewritten compacted (worker.compactor): its entry count",
    "bg_id": "background mode only: the provider's response id, set by the append script with the batch",
    "bg_cursor": "background mode only: the last provider sequence_number normalized into stored events",
    "bg_endpoint": "background mode only: the upstreams-file endpoint that holds the response",
}
"""Fields of the ``meta`` hash and what they hold."""


class Keys:
    """Key names for one deployment prefix.

    Args:
        prefix: Leading namespace of every key (``FANOUT_REDIS_PREFIX``); tests use a
            unique one each so their keys never meet.
    """

    def __init__(self, prefix: str = "fanout") -> None:
        self.prefix = prefix
        self.jobs = f"{prefix}:jobs"
        """The legacy (unsharded) jobs stream of earlier releases: still served, no longer written."""
        self.job_shards = f"{prefix}:jobshards"
        """Set of every ``FANOUT_JOB_SHARDS`` value a publisher used (decimal members)."""
        self.done = f"{prefix}:done"
        """The capped stream of finished-stream summaries."""
        self.cancels = f"{prefix}:cancels"
        """Channel announcing cancel requests (payload: stream id)."""
        self.compact_due = f"{prefix}:compact"
        """Sorted set of finished streams awaiting compaction: member stream id, score due ms."""
        self.probe = f"{prefix}:probe"
        """Key the readiness checks write (``SET ... PX``) to prove Redis takes writes."""

    def jobs_shard(self, shard: int) -> str:
        """Key of jobs stream ``shard`` (``P:jobs:{<n>}``: the hash tag spreads shards over slots)."""
        return f"{self.prefix}:jobs:{{{shard}}}"

    def jobs_streams(self, shards: int) -> list[str]:
        """Keys of jobs streams ``0 .. shards - 1``."""
        return [self.jobs_shard(n) for n in range(shards)]

    def job_ref(self, jobs_key: str, entry_id: str) -> str:
        """Return the reference of one job entry: ``<jobs stream key>/<entry id>`` (meta ``job_id``)."""
        return f"{jobs_key}/{entry_id}"

    def parse_job_ref(self, ref: str) -> tuple[str, str]:
        """Return ``(jobs stream key, entry id)`` of a :meth:`job_ref`; a bare entry id names :attr:`jobs`."""
        key, sep, entry_id = ref.rpartition("/")
        return (key, entry_id) if sep else (self.jobs, ref)

    def events(self, stream_id: str) -> str:
        """Key of the Redis stream holding the events of ``stream_id``."""
        return f"{self.prefix}:{{{stream_id}}}:events"

    def meta(self, stream_id: str) -> str:
        """Key of the stream's meta hash (:data:`META_FIELDS`)."""
        return f"{self.prefix}:{{{stream_id}}}:meta"

    def live(self, stream_id: str) -> str:
        """Channel notified with the last stored seq after each append."""
        return f"{self.prefix}:{{{stream_id}}}:live"

    def cancel(self, stream_id: str) -> str:
        """Key of the stream's cancel flag."""
        return f"{self.prefix}:{{{stream_id}}}:cancel"

    def tomb(self, stream_id: str) -> str:
        """Key of the tombstone (``last_seq``, ``status``) that outlives the events."""
        return f"{self.prefix}:{{{stream_id}}}:tomb"


DEFAULT_KEYS: Final = Keys()
"""Keys under the default ``fanout`` prefix."""


def shard_of(stream_id: str, shards: int) -> int:
    """Jobs shard of ``stream_id``: CRC-32 of its UTF-8 bytes modulo ``shards`` (stable across processes)."""
    return zlib.crc32(stream_id.encode()) % shards


def entry_id(seq: int) -> str:
    """Redis stream entry id of event ``seq``: ``0-<seq>``."""
    return f"0-{seq}"


def seq_of(entry: bytes | str) -> int:
    """Return the seq of a ``0-<seq>`` entry id.

    Raises:
        ValueError: Not an id of that shape.
    """
    text = entry.decode() if isinstance(entry, bytes) else entry
    head, _, tail = text.partition("-")
    if head != "0" or not tail.isdigit():
        raise ValueError(f"not an event entry id: {text!r}")
    return int(tail)
