"""The exception tree shared by every fanout process, split by whose fault it is.

Every exception class the project defines is in one of the two trees below (a test
compares them with the code). The classes defined in this module are marked ``*``;
the others live next to the only code that raises them and name their module.

::

    FanoutError                       fanout_client.errors: root; carries a contract ``category`` and ``retryable``
    ├── UpstreamError                 * the provider misbehaved, refused or could not be reached
    │   ├── UpstreamProtocolError     * malformed or impossible upstream bytes or sequence
    │   │   └── FrameTooLargeError    * an SSE line/frame or JSON element past its byte limit
    │   ├── UpstreamHTTPError         * a non-2xx answer before the body (worker)
    │   ├── UpstreamTransportError    * connection refused, reset or closed mid-body (worker)
    │   ├── UpstreamTimeoutError      * a named upstream timeout fired: connect, idle, progress, total (worker)
    │   └── CredentialError           worker.auth: an endpoint's key, Google token or AWS credentials unavailable
    ├── ClientError                   * a bad request to our edge (publisher)
    │   ├── ProblemError              publisher.api.problems: answered as an RFC 9457 problem document
    │   │   ├── ShareExceededError    publisher.api.fair_share: the credential (or address) holds its limit: a 429
    │   │   └── RateExceededError     publisher.api.fair_share: the credential's status reads outpace its bucket: a 429
    │   ├── OffsetError               publisher.wire.durable: a Durable Streams offset this server did not mint: a 400
    │   ├── TokenInvalidError         publisher.api.tokens: malformed read token or bad signature
    │   └── TokenExpiredError         publisher.api.tokens: a well-signed read token past its ``exp``
    ├── InternalError                 * our bug, or Redis unreachable
    │   ├── AppendRefusedError        * the append script refused a batch; nothing of it was stored (worker)
    │   │   ├── FencedError           * another worker took the stream (meta ``token`` moved on)
    │   │   │   └── EpochFencedError  * meta holds another generation than the writer's (``epoch``)
    │   │   ├── SeqConflictError      * meta ``last_seq + 1`` is not the batch's first seq
    │   │   └── StreamClosedError     * the stream already has its terminal event
    │   ├── StorageRefusedError       * Redis refused a write for good: WRONGTYPE, foreign entry, long OOM (worker)
    │   ├── HistoryChangedError       publisher.history.store: the stream was written again mid-read
    │   └── PlanRefusedError          worker.compaction_plan: a finished stream cannot be compacted losslessly
    ├── SettingsError                 schema.settings: a missing or malformed variable; the process cannot start
    ├── CommandError                  fanout_client.errors: a user mistake, reported as one line and an exit status
    ├── SSEProtocolError              fanout_client.errors: the publisher's SSE body broke its framing or line limit
    └── StreamUnavailableError        fanout_client.errors: the publisher refused a stream (404, 410, 401/403)
        ├── HistoryResetError         fanout_client.errors: 410 history-reset: the stream is another generation now
        └── PublisherUnreachableError fanout_client.errors: no connection to the publisher could be made or kept

Control signals, not errors: they unwind a job's own call stack and never leave it, so
they stay outside :class:`FanoutError` (and carry no contract category)::

    Exception
    ├── Stopped                       worker.control: the job's Stopper fired (cancel, fenced, lost, shutdown)
    ├── RetryAttempt                  worker.attempt: an attempt failed retryably before any output was stored
    ├── ReplayLost                    worker.reattach: a background response cannot be re-read: worker_lost
    ├── ReplayDisagrees               worker.reattach: a re-read event differs from the stored one at its seq
    └── TailEndedError                publisher.api.durable_live: a live Durable Streams read ends (gap, reset, closed)
        └── _StopAfterError           publisher.api.durable_live: hand out these entries, then end the read

The worker's modules re-export what they raise (``worker.upstream.UpstreamTimeoutError``,
``worker.appender.FencedError``, ...), so both import paths name the same class. No
class shadows a builtin name (``TimeoutError``, ``ConnectionError``, ...).

Foreign exceptions are translated where they enter (``raise ... from exc``).
The root and the client's own errors live in the client distribution (``fanout_client.errors``),
so every fanout error, server or client side, shares one root. Pure: imports only the contract.
"""

from __future__ import annotations

from fanout_client.errors import FanoutError as FanoutError
from schema.contract import ErrorCategory


class UpstreamError(FanoutError):
    """The provider misbehaved, refused or could not be reached; ends the stream as ``failed``."""

    category: ErrorCategory = "upstream_error"
    retryable = True


class UpstreamProtocolError(UpstreamError):
    """Upstream bytes or events that break the provider's protocol (``failed``/``protocol``)."""

    category: ErrorCategory = "protocol"
    retryable = False


class FrameTooLargeError(UpstreamProtocolError):
    """An SSE line or frame, or a JSON-array element, grew past its configured byte limit."""


class UpstreamHTTPError(UpstreamError):
    """A non-2xx HTTP answer from the provider before any body was read.

    Attributes:
        status: The HTTP status code.
        provider_code: The provider's error code or type, when its body named one.
        retry_after_s: Seconds from ``Retry-After``, when sent.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        category: ErrorCategory,
        retryable: bool,
        provider_code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, category=category, retryable=retryable)
        self.status = status
        self.provider_code = provider_code
        self.retry_after_s = retry_after_s


class UpstreamTransportError(UpstreamError):
    """The connection failed or broke (refused, reset, closed mid-body): ``interrupted``/``transport``."""

    category: ErrorCategory = "transport"
    retryable = True


class UpstreamTimeoutError(UpstreamError):
    """A named upstream timeout fired (connect, idle, progress, total): ``interrupted``/``timeout``.

    Attributes:
        kind: Which timeout: ``connect``, ``idle``, ``progress`` or ``total``.
    """

    category: ErrorCategory = "timeout"
    retryable = True

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ClientError(FanoutError):
    """A bad request to our edge; answered with an RFC 9457 problem, never stored."""

    category: ErrorCategory = "invalid_request"


class InternalError(FanoutError):
    """Our own bug or an unreachable dependency (Redis)."""

    category: ErrorCategory = "internal"


class AppendRefusedError(InternalError):
    """The append script refused a batch; nothing of it was stored. Stop writing this stream."""


class FencedError(AppendRefusedError):
    """Another worker took the stream (meta ``token`` changed): abort the upstream request, do not ack."""


class EpochFencedError(FencedError):
    """Meta no longer holds this writer's epoch: the generation it extends is gone.

    Redis was restored from an older snapshot, say, and the job will run again as a new
    generation. Handled as :class:`FencedError`.
    """


class SeqConflictError(AppendRefusedError):
    """Meta ``last_seq + 1`` is not the batch's first seq (a bug, or a write we lost track of).

    Attributes:
        stored_seq: The ``last_seq`` Redis holds.
    """

    def __init__(self, message: str, *, stored_seq: int) -> None:
        super().__init__(message)
        self.stored_seq = stored_seq


class StreamClosedError(AppendRefusedError):
    """The stream already has its terminal event; nothing may follow it. Ack the job."""


class StorageRefusedError(InternalError):
    """Redis refused one of the stream's writes for good: end the stream ``failed``/``internal``.

    Raised for ``WRONGTYPE`` on one of the stream's keys, an ``XADD 0-<seq>`` below a
    foreign entry, or out of memory lasting past the write's retry window. The job
    stores what it still can (the terminal event, else a terminal status in meta and
    tombstone) and is acked, so it never loops.

    Attributes:
        reason: Short, user-safe cause (names Redis, never a key or a value).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
