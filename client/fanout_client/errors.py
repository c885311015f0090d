"""The root of every fanout error, the client's own errors, and the command line's exit statuses.

:class:`FanoutError` is the root the whole project shares (the server's tree is drawn in
``schema/errors.py``); it lives here so the client distribution needs nothing else.
The client raises :class:`StreamUnavailableError` (the publisher refused a stream;
:class:`HistoryResetError` when the stream was written again as another generation),
:class:`PublisherUnreachableError` (no connection), :class:`SSEProtocolError` (a body that
is not the publisher's SSE), and its commands :class:`CommandError` (a user mistake,
printed as one line with an exit status). Pure: imports only the contract.
"""

from __future__ import annotations

from typing import Any, Final

from fanout_client.contract import ErrorCategory

EXIT_OK: Final = 0
"""The command did what was asked (a followed stream ended ``completed`` or ``incomplete``)."""
EXIT_REFUSED: Final = 1
"""The publisher refused the call, a replayed body broke an invariant, or a health check failed."""
EXIT_USAGE: Final = 2
"""Bad input: a flag, a variable, a file, a port already in use (argparse uses 2 as well)."""
EXIT_STREAM_ERROR: Final = 3
"""A followed stream ended in ``stream.error`` (``failed``, ``interrupted``, ``cancelled``)."""
EXIT_UNREACHABLE: Final = 4
"""A service the command needs does not answer: the publisher (``FANOUT_URL``) or Redis (``REDIS_URL``)."""
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C (SIGINT) in a command that does not drain on it, as shells report it."""
EXIT_BROKEN_PIPE: Final = 141
"""Standard output was closed early (``fanout tail ... | head``): the command stops quietly, as SIGPIPE would."""


class FanoutError(Exception):
    """Root of every fanout error.

    Attributes:
        category: The contract error category this maps to.
        retryable: Whether retrying the same job may succeed.
    """

    category: ErrorCategory = "internal"
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        category: ErrorCategory | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if category is not None:
            self.category = category
        if retryable is not None:
            self.retryable = retryable


class CommandError(FanoutError):
    """A command cannot go on; ``fanout`` prints the message as one line and exits.

    Args:
        message: What is wrong and what to do, one line, no secret.
        exit_status: One of the ``EXIT_*`` statuses above.
    """

    def __init__(self, message: str, *, exit_status: int = EXIT_USAGE) -> None:
        super().__init__(message, category="invalid_request")
        self.exit_status = exit_status


class SSEProtocolError(FanoutError):
    """The publisher's body is not its SSE: a line past ``max_line_bytes`` (:class:`fanout_client.sse.SSEParser`)."""

    category: ErrorCategory = "protocol"


class StreamUnavailableError(FanoutError):
    """The publisher refused the stream (404 unknown, 410 history gone, 401/403 token).

    Attributes:
        status: The HTTP status.
        problem: The RFC 9457 problem body, when one was sent.
    """

    def __init__(self, message: str, *, status: int, problem: dict[str, Any] | None = None) -> None:
        super().__init__(message, category="not_found" if status == 404 else "invalid_request")
        self.status = status
        self.problem = problem or {}


class HistoryResetError(StreamUnavailableError):
    """``410 history-reset``: the stream was written again as another generation (contract 1.1).

    The events the caller holds are not the stream's history any more (Redis was restored
    from an older snapshot and the job ran again). Start over: read the stream again
    from the beginning, without a ``Last-Event-ID``, and drop what was assembled so far.
    ``problem["epoch"]`` is the stream's current epoch.
    """


class PublisherUnreachableError(StreamUnavailableError):
    """No connection to the publisher could be made (refused, unknown host, TLS), or none kept.

    Raised at once when the first connection of a call fails so; after more than
    ``max_reconnects`` failed reconnects of :meth:`fanout_client.FanoutClient.events`.
    ``status`` is 503.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503)
