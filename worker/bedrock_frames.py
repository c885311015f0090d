"""Bedrock framing: event-stream messages in, the frames the provider adapters consume out.

One job: turn the :class:`~worker.eventstream.EventStreamMessage` objects of a Bedrock
streaming body into :class:`~worker.frames.JSONFrame` / :class:`~worker.frames.SSEFrame`
provider events and :class:`~worker.frames.ErrorFrame` errors. Two operations
(UPSTREAMS.md C.3, C.4; botocore ``data/bedrock-runtime/2023-09-30/service-2.json``,
shapes ``ResponseStream`` and ``ConverseStreamOutput``):

* ``invoke`` (InvokeModelWithResponseStream): each ``chunk`` event's JSON payload holds
  ``bytes`` = base64 of one Anthropic Messages streaming event; that event becomes a
  ``JSONFrame`` for the Anthropic adapter (other payload fields, such as a ``p``
  padding, are ignored). Another ``:event-type`` becomes an ``SSEFrame`` named after
  it, which the adapter counts and ignores.
* ``converse`` (ConverseStream): each event (``messageStart``, ``contentBlockDelta``,
  ...) becomes ``SSEFrame(event=<:event-type>, data=<payload JSON>)``, the shape of a
  named SSE event, for :mod:`worker.adapters.bedrock_converse`.

``exception`` messages (modeled errors, :data:`EXCEPTIONS`) and ``error`` messages
(unmodeled, ``:error-code``/``:error-message``) inside the 200 body become an
``ErrorFrame``: the adapter ends the stream ``failed`` with that category. Pure:
imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Final, Literal, NamedTuple

import msgspec

from schema.contract import ErrorCategory
from schema.errors import UpstreamProtocolError
from worker.eventstream import DEFAULT_MAX_MESSAGE_BYTES, EventStreamDecoder, EventStreamEnd, EventStreamMessage
from worker.frames import AnyFrame, ErrorFrame, JSONFrame, SSEFrame

Operation = Literal["invoke", "converse"]
"""Which Bedrock streaming operation answered: InvokeModelWithResponseStream or ConverseStream."""


class Failure(NamedTuple):
    """Contract category and retryability of one Bedrock exception type."""

    category: ErrorCategory
    retryable: bool


EXCEPTIONS: Final[dict[str, Failure]] = {
    "throttlingexception": Failure("rate_limited", retryable=True),
    "servicequotaexceededexception": Failure("rate_limited", retryable=False),
    "serviceunavailableexception": Failure("upstream_overloaded", retryable=True),
    "modelnotreadyexception": Failure("upstream_overloaded", retryable=True),
    "internalserverexception": Failure("upstream_error", retryable=True),
    "modelstreamerrorexception": Failure("upstream_error", retryable=True),
    "modeltimeoutexception": Failure("upstream_error", retryable=True),
    "modelerrorexception": Failure("upstream_error", retryable=True),
    "validationexception": Failure("invalid_request", retryable=False),
    "accessdeniedexception": Failure("permission", retryable=False),
    "resourcenotfoundexception": Failure("not_found", retryable=False),
    "unrecognizedclientexception": Failure("authentication", retryable=False),
    "expiredtokenexception": Failure("authentication", retryable=False),
}
"""Exception type or error code (lower-cased, namespace dropped) → contract failure.

From the service model's error shapes and their HTTP status: throttling (429) and
service quota (400, a quota the same job keeps exceeding) are ``rate_limited``;
service unavailable (503) and model not ready (429) ``upstream_overloaded``; internal
server (500), model stream error (424, the model failed mid-stream), model timeout
(408) and model error (424) ``upstream_error``; validation (400) ``invalid_request``
(``context_length_exceeded`` when its message says the input is too long); access
denied (403) ``permission``; resource not found (404) ``not_found``; the IAM codes
``authentication``. Any other type is ``upstream_error``, retryable."""

UNKNOWN: Final = Failure("upstream_error", retryable=True)
"""The failure of an exception type or error code not in :data:`EXCEPTIONS`."""

_TOO_LONG: Final = re.compile(
    r"too long|context (?:length|window|limit)|too many (?:input )?tokens|maximum context"
    r"|exceeds? the (?:model'?s? )?(?:maximum|context)",
    re.IGNORECASE,
)
_json: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def failure_of(name: str | None, message: str) -> Failure:
    """Map an exception type or ``:error-code`` to a contract failure.

    ``ns#Name`` and ``Name:uri`` forms are reduced to ``Name`` (as botocore does with
    ``x-amzn-ErrorType``) and compared case-insensitively.
    """
    key = (name or "").rpartition("#")[2].partition(":")[0].lower()
    failure = EXCEPTIONS.get(key, UNKNOWN)
    if failure.category == "invalid_request" and _TOO_LONG.search(message):
        return Failure("context_length_exceeded", retryable=False)
    return failure


def _object(payload: bytes) -> dict[str, Any]:
    try:
        value = _json.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def exception_frame(name: str | None, payload: bytes) -> ErrorFrame:
    """Build the error of an ``exception`` message from its type and JSON payload.

    The message is the payload's ``message`` (or ``Message``); a model stream error adds
    the model's own status and message (``originalStatusCode``, ``originalMessage``).
    """
    body = _object(payload)
    text = body.get("message") or body.get("Message")
    message = text if isinstance(text, str) and text else f"Bedrock sent {name or 'an exception'}"
    status, original = body.get("originalStatusCode"), body.get("originalMessage")
    if isinstance(status, int) or (isinstance(original, str) and original):
        message += f" (model answered {status if isinstance(status, int) else 'an error'}"
        message += f": {original})" if isinstance(original, str) and original else ")"
    failure = failure_of(name, message)
    return ErrorFrame(category=failure.category, retryable=failure.retryable, provider_code=name,
                      message=message)


def error_frame(code: str | None, text: str | None) -> ErrorFrame:
    """Build the error of an ``error`` message from its ``:error-code`` and ``:error-message``."""
    message = text or f"Bedrock sent error {code or 'without a code'}"
    failure = failure_of(code, message)
    return ErrorFrame(category=failure.category, retryable=failure.retryable, provider_code=code, message=message)


def chunk_frame(payload: bytes) -> JSONFrame:
    """Unwrap one InvokeModelWithResponseStream ``chunk``: base64 ``bytes`` → the provider event.

    Raises:
        UpstreamProtocolError: The payload is not a JSON object with a base64 ``bytes``
            string. The stream ends ``failed``/``protocol``.
    """
    encoded = _object(payload).get("bytes")
    if not isinstance(encoded, str):
        raise UpstreamProtocolError("Bedrock sent a chunk without a base64 bytes field")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UpstreamProtocolError("Bedrock sent a chunk whose bytes are not base64") from exc
    return JSONFrame(text=raw.decode("utf-8", "replace"))


def frame_of(message: EventStreamMessage, operation: Operation) -> AnyFrame:
    """Turn one event-stream message into the frame its adapter consumes (module docstring).

    Raises:
        UpstreamProtocolError: An unknown ``:message-type``, or a malformed ``chunk``.
    """
    kind = message.message_type
    if kind == "exception":
        return exception_frame(message.exception_type, message.payload)
    if kind == "error":
        return error_frame(message.error_code, message.error_message)
    if kind != "event":
        raise UpstreamProtocolError(f"Bedrock sent an event-stream message of :message-type {kind!r}")
    event = message.event_type or "message"
    if operation == "invoke" and event == "chunk":
        return chunk_frame(message.payload)
    return SSEFrame(event=event, data=message.payload.decode("utf-8", "replace"))


class BedrockBody:
    """Sans-I/O decoder of one Bedrock streaming body: bytes in, adapter frames out.

    Args:
        operation: ``invoke`` or ``converse`` (see the module docstring).
        max_message_bytes: Limit of one event-stream message (``FANOUT_MAX_FRAME_BYTES``).

    Has the shape of :class:`~worker.sse.SSEDecoder`: ``feed`` returns the frames a
    read completed, an error after earlier frames of the same read is raised by the
    next call, ``close`` reports truncation.
    """

    def __init__(self, operation: Operation, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._operation: Operation = operation
        self._decoder = EventStreamDecoder(max_message_bytes=max_message_bytes)
        self._failure: UpstreamProtocolError | None = None

    def feed(self, chunk: bytes) -> list[AnyFrame]:
        """Consume one network read and return the frames its messages give, in order.

        Raises:
            UpstreamProtocolError: As :meth:`EventStreamDecoder.feed`, or a message that
                :func:`frame_of` refuses. The adapter ends the stream ``failed``/``protocol``.
        """
        if self._failure is not None:
            raise self._failure
        frames: list[AnyFrame] = []
        try:
            for message in self._decoder.feed(chunk):
                frames.append(frame_of(message, self._operation))
        except UpstreamProtocolError as exc:
            self._failure = exc
            if not frames:
                raise
        return frames

    def close(self) -> EventStreamEnd:
        """End the body; ``truncated`` when it ended inside a message.

        Raises:
            UpstreamProtocolError: An error deferred by :meth:`feed`.
        """
        if self._failure is not None:
            raise self._failure
        return self._decoder.close()
