"""Classify any failed Redis call by the one table of :mod:`schema.redis_replies`.

:func:`classify` is the only classifier of Redis failures: the worker's writes
(:func:`infra.storage.with_retry`: claim, append, terminal, ack), its lease renewals and
intake (logged by kind), the publisher's ``/readyz`` and ``fanout health``
(:func:`readiness_cause`) and the ``fanout.redis.errors`` metric
(:func:`infra.otel_setup.redis_error_kind`) all call it.

What the table cannot know comes from the client: a connection refused, reset or closed,
a socket timeout (both transient: Redis restarting, a failover), an authentication error
(permanent), the cluster client's own errors (no slot map yet: transient). redis-py turns
some codes into classes and drops the code from the message (``READONLY`` becomes
``ReadOnlyError("You can't write ...")``, and the generic ``ERR`` prefix is stripped),
so those classes are mapped back to their codes (:data:`CLASS_CODES`, from redis-py 8.1's
``_parsers/base.py`` ``EXCEPTION_CLASSES``) before the table is read.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import redis.exceptions as rex

from schema.logs import quoted
from schema.redact import safe_message
from schema.redis_replies import FaultKind, reply_code, rule_for

CLASS_CODES: Final[tuple[tuple[type[Exception], str], ...]] = (
    (rex.BusyLoadingError, "LOADING"),  # a ConnectionError subclass: before the connection errors
    (rex.ReadOnlyError, "READONLY"),
    (rex.MasterDownError, "MASTERDOWN"),  # a ClusterDownError subclass: first
    (rex.ClusterDownError, "CLUSTERDOWN"),
    (rex.TryAgainError, "TRYAGAIN"),
    (rex.MovedError, "MOVED"),  # an AskError subclass: first
    (rex.AskError, "ASK"),
    (rex.ClusterCrossSlotError, "CROSSSLOT"),
    (rex.OutOfMemoryError, "OOM"),
    (rex.NoScriptError, "NOSCRIPT"),
    (rex.ExecAbortError, "EXECABORT"),
    (rex.NoPermissionError, "NOPERM"),
)
"""redis-py exception class → the error code it replaced, most specific class first."""

_AUTH: Final = (rex.AuthenticationError, rex.AuthorizationError, rex.AuthenticationWrongNumberOfArgsError)


class RedisFault(NamedTuple):
    """What one failed Redis call was."""

    kind: FaultKind
    """``transient``, ``pressure`` or ``permanent`` (:data:`schema.redis_replies.FaultKind`)."""
    code: str
    """The reply's error code (``NOREPLICAS``), or '' for a failure without a reply."""
    cause: str
    """Short, safe to show anyone: no address, no server text (``replicas missing``)."""


def error_code(exc: BaseException) -> str:
    """Return the Redis error code behind ``exc`` (``READONLY`` for a ``ReadOnlyError``), else ''.

    A plain ``ResponseError`` keeps the code in its message (:func:`schema.redis_replies.reply_code`,
    which also reads through Redis 6.2's script-error wrapper).
    """
    for cls, code in CLASS_CODES:
        if isinstance(exc, cls):
            return code
    return reply_code(str(exc)) if isinstance(exc, rex.ResponseError) else ""


def classify(exc: BaseException) -> RedisFault:
    """Return the kind, code and cause of one failed Redis call (module docstring).

    Args:
        exc: What the call raised: a redis-py error of either client, ``OSError``, or a
            ``TimeoutError`` (asyncio's or redis-py's).

    Returns:
        The fault; a reply error's kind and cause are its code's rule in
        :data:`schema.redis_replies.REPLY_RULES`.
    """
    if isinstance(exc, _AUTH):
        return RedisFault("permanent", reply_code(str(exc)), "authentication failed")
    code = error_code(exc)
    if code:
        rule = rule_for(code)
        return RedisFault(rule.kind, code, rule.cause)
    if isinstance(exc, TimeoutError | rex.TimeoutError):
        return RedisFault("transient", "", "no answer in time")
    if isinstance(exc, rex.ConnectionError | rex.InvalidResponse | OSError):
        return RedisFault("transient", "", "unreachable")
    if isinstance(exc, rex.RedisClusterException | rex.ClusterError):
        return RedisFault("transient", "", "cluster slot map unavailable")
    if isinstance(exc, rex.ResponseError):
        rule = rule_for("")
        return RedisFault(rule.kind, "ERR", rule.cause)
    return RedisFault("permanent", "", "client error")


def refuses_the_url(exc: BaseException) -> bool:
    """Return whether Redis answered but refused what the URL says: its user or password, or its database.

    An authentication error (``WRONGPASS``, ``NOAUTH``) or ``DB index is out of range``:
    starting Redis would not help, the URL must change (:func:`schema.cli.redis_refused`).
    """
    return isinstance(exc, _AUTH) or (isinstance(exc, rex.ResponseError) and "DB index" in str(exc))


def fault_kind(exc: BaseException) -> FaultKind:
    """Return :attr:`RedisFault.kind` of :func:`classify` (``transient``, ``pressure``, ``permanent``)."""
    return classify(exc).kind


def readiness_cause(exc: BaseException) -> tuple[str, FaultKind]:
    """Return what ``/readyz`` and ``fanout health`` say of a failed check, and its kind.

    Returns:
        ``("unreachable", "transient")``, ``("replicas missing (NOREPLICAS)", "transient")``,
        ``("refuses writes: out of memory (OOM)", "pressure")``, ``("a key holds another
        type (WRONGTYPE)", "permanent")``...: the table's cause and the code, never the
        server's text or an address.
    """
    fault = classify(exc)
    return (f"{fault.cause} ({fault.code})" if fault.code else fault.cause), fault.kind


def fault_fields(exc: BaseException) -> str:
    """Return ``kind=<kind> code=<code or -> error=<class> message="<masked text>"`` for a log line.

    The message part is :func:`worker.error_policy.redis_error_fields` (credentials
    masked, quoted); log lines keep the server's text, ``/readyz`` never does.
    """
    fault = classify(exc)
    return f"kind={fault.kind} code={fault.code or '-'} {redis_error_fields(exc)}"


def redis_error_fields(exc: BaseException) -> str:
    """Return ``error=<class> message="<text>"`` for a log line: the server's message, masked and quoted.

    The text is :func:`safe_message` of ``str(exc)`` (credentials masked, cut), quoted by
    :func:`schema.logs.quoted` (backslashes, double quotes and line breaks escaped), so
    the key=value line stays one line.
    """
    return f"error={type(exc).__name__} message={quoted(safe_message(str(exc)), always=True)}"
