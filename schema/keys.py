"""Redis key layout, the meta-hash fields and the stream-entry codec shared by worker and publisher.

Layout (ARCHITECTURE.md, "Redis layout"), with ``P`` the deployment's key prefix
(``FANOUT_REDIS_PREFIX``, default ``fanout``) and every per-stream key hash-tagged
``{<stream_id>}`` so one stream's keys share a Redis Cluster slot:

=============================  ========  ===================================================
key                            type      content
=============================  ========  ===================================================
``P:jobs``                     stream    one entry per job, field ``j`` = Job JSON; group ``workers``
``P:{id}:events``              stream    entry id ``0-<seq>``, field ``e`` = the event JSON
``P:{id}:meta``                hash      see :data:`META_FIELDS`
``P:{id}:live``                channel   PUBLISH of the last stored seq (decimal) after each append
``P:{id}:cancel``              string    ``1`` once a client asked to cancel
``P:{id}:tomb``                hash      ``last_seq``, ``status`` kept after the events expire
``P:done``                     stream    one summary per finished stream (capped), for analytics
``P:cancels``                  channel   PUBLISH of a stream id whose cancel was requested
=============================  ========  ===================================================

Protocol between the two sides:

* The publisher creates ``meta`` at submission (``state=queued``, ``provider``, ``model``,
  ``created_ms``, ``body_hash``, ``last_seq=0``) and then XADDs the job.
* A worker claims a stream by incrementing ``token`` (the fencing token) and setting
  ``owner``, ``state=running``; every append must present that token, so an older owner
  is fenced out. Appends write ``0-<seq>`` entries, advance ``last_seq``, and on a
  terminal event set ``state=done`` and ``status``, write the tombstone and set TTLs.
* Cancel: the publisher sets the ``cancel`` key and PUBLISHes the stream id on
  ``P:cancels``; the owning worker aborts and writes ``stream.error`` ``cancelled``.

Pure: no redis import.
"""

from __future__ import annotations

from typing import Final

EVENT_FIELD: Final = b"e"
"""Field of an events-stream entry that holds the event JSON."""
JOB_FIELD: Final = b"j"
"""Field of a jobs-stream entry that holds the Job JSON."""
JOBS_GROUP: Final = "workers"
"""Consumer group the workers share on the jobs stream."""

META_FIELDS: Final = {
    "state": "queued | running | done",
    "status": "terminal status once done (completed, incomplete, failed, interrupted, cancelled)",
    "last_seq": "seq of the last stored event, 0 before stream.start",
    "token": "fencing token of the current owner (incremented on every claim)",
    "owner": "consumer name of the owning worker",
    "provider": "provider API of the job",
    "model": "requested model",
    "created_ms": "submission time (ms since epoch)",
    "started_ms": "first claim time",
    "ended_ms": "terminal event time",
    "body_hash": "hash of the submitted body, for idempotent resubmission",
    "job_id": "entry id of the job in the jobs stream",
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
        """The jobs stream."""
        self.done = f"{prefix}:done"
        """The capped stream of finished-stream summaries."""
        self.cancels = f"{prefix}:cancels"
        """Channel announcing cancel requests (payload: stream id)."""

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
