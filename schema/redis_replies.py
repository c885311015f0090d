"""The one table of Redis error replies: which a retry cures, which ask for room, which never succeed.

Worker (every write: claim, append, terminal, ack, lease renewal, intake), publisher
(``/readyz``), ``fanout health`` and the ``fanout.redis.errors`` metric all classify a
Redis reply through :func:`rule_for` of its code (:func:`reply_code`), via
:func:`infra.redis_faults.classify`, which adds what only the client knows (connection
errors, timeouts, redis-py's exception classes).

Source: Redis, "Redis error messages" (an error reply starts with an uppercase word, the
error prefix; ``ERR`` is the generic one), the shared error replies of Redis 7.0's
``server.c`` and the pages of what produces each code:

===============  ============  ==================================================================
code             kind          produced by
===============  ============  ==================================================================
``LOADING``      transient     a restart, ``DEBUG RELOAD``, a replica's full sync loading the dataset
``BUSY``         transient     a script or function running past ``busy-reply-threshold``
                               (``lua-time-limit``); it ends by itself or by ``SCRIPT KILL``
``NOREPLICAS``   transient     ``min-replicas-to-write`` with fewer good replicas than asked
                               (``min-replicas-max-lag``): a replica restarting or lagging
``MASTERDOWN``   transient     a replica cut off from its master with ``replica-serve-stale-data no``
``READONLY``     transient     a write to a replica: a failover in progress, a demoted master
``TRYAGAIN``     transient     a multi-key command on a slot being migrated (Cluster specification)
``CLUSTERDOWN``  transient     a slot not served, a cluster without quorum (Cluster specification)
``UNBLOCKED``    transient     a blocked read ended by a role change or by its key's deletion
``NOSCRIPT``     transient     the script cache was emptied (a restart): loading it again cures it
``OOM``          pressure      ``maxmemory`` reached with ``noeviction``
``MISCONF``      pressure      a failed RDB save with ``stop-writes-on-bgsave-error yes``
``MOVED``,       permanent     a key of another node: redis-py's cluster client follows these
``ASK``                        itself, so one that reaches fanout means a plain client talks to
                               a Cluster node (``FANOUT_REDIS_CLUSTER`` does not match)
``WRONGTYPE``    permanent     a key holding another type than fanout wrote
``NOGROUP``      permanent     a consumer group that is gone (intake recreates it itself)
``NOPERM``,      permanent     ACL and authentication: fixed by configuration, not by time
``NOAUTH``,
``WRONGPASS``
``ERR`` and the  permanent     a command Redis will refuse again (syntax, a foreign stream entry,
rest of the                    a script error)
table
===============  ============  ==================================================================

A code that is not in the table is **permanent**, deliberately: the table holds every
reply Redis documents as one a retry can cure, so an unknown code is a module's error or
a reply no Redis version here sends. Treated as transient it would hold the stream for a
whole retry window, then leave the job to be claimed again, and each claim with only
``stream.start`` stored would call the provider again; permanent, it ends the stream at
once with a message naming the code (``Redis answered <CODE>``), which is how an operator
learns to add it here.

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple

FaultKind = Literal["transient", "pressure", "permanent"]
"""``transient``: retried within the window, then left for the next owner; ``pressure``:
retried within the window, then the stream ends ``failed``; ``permanent``: ends it at once."""


class ReplyRule(NamedTuple):
    """How fanout treats one Redis error code."""

    kind: FaultKind
    """See :data:`FaultKind`."""
    cause: str
    """A short phrase safe to show anyone (``/readyz``): no address, no server text."""


REPLY_RULES: Final[dict[str, ReplyRule]] = {
    "LOADING": ReplyRule("transient", "loading its dataset"),
    "BUSY": ReplyRule("transient", "busy running a script"),
    "NOREPLICAS": ReplyRule("transient", "replicas missing"),
    "MASTERDOWN": ReplyRule("transient", "replica cut off from its master"),
    "READONLY": ReplyRule("transient", "read-only replica"),
    "TRYAGAIN": ReplyRule("transient", "slot being migrated"),
    "CLUSTERDOWN": ReplyRule("transient", "cluster down"),
    "UNBLOCKED": ReplyRule("transient", "blocked read interrupted"),
    "NOSCRIPT": ReplyRule("transient", "script cache empty"),
    "OOM": ReplyRule("pressure", "refuses writes: out of memory"),
    "MISCONF": ReplyRule("pressure", "refuses writes: snapshot failed"),
    "MOVED": ReplyRule("permanent", "key on another cluster node"),
    "ASK": ReplyRule("permanent", "key on another cluster node"),
    "CROSSSLOT": ReplyRule("permanent", "keys in different slots"),
    "WRONGTYPE": ReplyRule("permanent", "a key holds another type"),
    "NOGROUP": ReplyRule("permanent", "consumer group missing"),
    "BUSYGROUP": ReplyRule("permanent", "consumer group exists"),
    "BUSYKEY": ReplyRule("permanent", "key exists"),
    "NOPERM": ReplyRule("permanent", "ACL denies a command"),
    "NOAUTH": ReplyRule("permanent", "authentication required"),
    "WRONGPASS": ReplyRule("permanent", "wrong user or password"),
    "NOPROTO": ReplyRule("permanent", "protocol version refused"),
    "EXECABORT": ReplyRule("permanent", "transaction aborted"),
    "NOTBUSY": ReplyRule("permanent", "no script running"),
    "UNKILLABLE": ReplyRule("permanent", "script cannot be killed"),
    "ERR": ReplyRule("permanent", "command refused"),
}
"""Error code → rule (module table)."""

UNKNOWN_RULE: Final = ReplyRule("permanent", "unknown refusal")
"""The rule of a code not in :data:`REPLY_RULES` (module docstring: why permanent)."""

_SCRIPT_WRAPPER: Final = re.compile(r"^(?:ERR )?Error running script \(call to [^)]*\): @[\w-]+:\d+: ")
"""Redis 6.2's wrapper around an error raised inside a script (7.0 passes the error's own code first)."""
_CODE: Final = re.compile(r"[A-Z][A-Z_]*\Z")


def reply_code(text: str) -> str:
    """Return the error code of an error reply's text (its first word, e.g. ``NOREPLICAS``), else ''.

    Args:
        text: The reply without its ``-``, as the server sent it or as a client kept it.
            An error raised inside a script on Redis 6.2 (``Error running script (call to
            f_<sha>): @user_script:12: WRONGTYPE ...``) gives the code of the error inside.

    Returns:
        The uppercase first word, or '' when the text does not start with one (a client
        that strips the generic ``ERR``, as redis-py does, leaves such a text).
    """
    body = _SCRIPT_WRAPPER.sub("", text.strip())
    word = body.split(" ", 1)[0] if body else ""
    return word if _CODE.match(word) else ""


def rule_for(code: str) -> ReplyRule:
    """Return the rule of error ``code`` (:data:`REPLY_RULES`; '' is ``ERR``; unknown: :data:`UNKNOWN_RULE`)."""
    return REPLY_RULES.get(code or "ERR", UNKNOWN_RULE)
