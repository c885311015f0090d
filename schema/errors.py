"""The exception tree shared by every fanout process, split by whose fault it is.

::

    FanoutError                     root; carries a contract ``category`` and ``retryable``
    ├── UpstreamError               the provider misbehaved or refused
    │   ├── UpstreamProtocolError   malformed or impossible upstream bytes or sequence
    │   │   └── FrameTooLargeError  an SSE line/frame or JSON element past its byte limit
    │   └── UpstreamHTTPError       a non-2xx answer before the body (worker)
    ├── ClientError                 a bad request to our edge (publisher)
    └── InternalError               our bug, or Redis unreachable

Foreign exceptions are translated where they enter (``raise ... from exc``).
Pure: imports only the contract.
"""

from __future__ import annotations

from schema.contract import ErrorCategory


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


class UpstreamError(FanoutError):
    """The provider misbehaved or refused; ends the stream as ``failed``."""

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


class ClientError(FanoutError):
    """A bad request to our edge; answered with an RFC 9457 problem, never stored."""

    category: ErrorCategory = "invalid_request"


class InternalError(FanoutError):
    """Our own bug or an unreachable dependency (Redis)."""

    category: ErrorCategory = "internal"
