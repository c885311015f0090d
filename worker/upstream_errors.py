"""A provider's non-2xx answer → :class:`~schema.errors.UpstreamHTTPError` (category, retryable).

One job: read the status, the error body and ``Retry-After`` of a refused request and
name the contract error. Status first (PROVIDERS.md section 6, the providers' error
pages), then the body: a 400 whose body says the prompt is too long is
``context_length_exceeded``; ``provider_code`` is OpenAI ``error.code`` (else
``error.type``), Anthropic ``error.type``, Gemini ``error.status``, Bedrock the header
``x-amzn-ErrorType`` (its known types mapped as its exception frames are,
:data:`worker.bedrock_frames.EXCEPTIONS`).

=====================  ===========================  =========
HTTP status            category                     retryable
=====================  ===========================  =========
429                    rate_limited                 yes
500, 502, 504, 408     upstream_error               yes
503, 529               upstream_overloaded          yes
401                    authentication               no
403                    permission                   no
404                    not_found                    no
400, 413, 422          invalid_request              no
3xx (never followed)   upstream_error               no
other 4xx / 5xx        invalid_request / upstream_error
=====================  ===========================  =========

An error body nested past the JSON decoder's recursion limit is treated as no body.

Pure: no aiohttp, asyncio or redis; the caller passes the status, headers and body bytes.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from schema.contract import ErrorCategory
from schema.errors import UpstreamHTTPError
from worker.bedrock_frames import EXCEPTIONS, failure_of

STATUS_CATEGORY: Final[dict[int, tuple[ErrorCategory, bool]]] = {
    400: ("invalid_request", False),
    401: ("authentication", False),
    403: ("permission", False),
    404: ("not_found", False),
    408: ("upstream_error", True),
    413: ("invalid_request", False),
    422: ("invalid_request", False),
    429: ("rate_limited", True),
    500: ("upstream_error", True),
    502: ("upstream_error", True),
    503: ("upstream_overloaded", True),
    504: ("upstream_error", True),
    529: ("upstream_overloaded", True),
}
"""HTTP status → (category, retryable); unlisted 4xx are invalid_request, 5xx upstream_error."""

MAX_ERROR_BODY_BYTES: Final = 64 * 1024
"""Only this much of an error body is read and parsed."""

_CONTEXT_TOO_LONG: Final = re.compile(
    r"(?i)prompt is too long|context[_ ]length|context window|maximum context"
    r"|input token count|exceeds the maximum number of tokens|too many (?:input )?tokens"
)
_CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "string_above_max_length"})
_json: Final = msgspec.json.Decoder()
_DELAY_SECONDS: Final = re.compile(r"[0-9]+\.?[0-9]*|\.[0-9]+", re.ASCII)


def category_of_status(status: int) -> tuple[ErrorCategory, bool]:
    """Return (category, retryable) for an HTTP status by :data:`STATUS_CATEGORY`.

    A redirect is never followed (it would carry the provider key elsewhere), so a 3xx is
    a misconfigured endpoint: ``upstream_error``, not retryable.
    """
    if status in STATUS_CATEGORY:
        return STATUS_CATEGORY[status]
    if status < 400:
        return ("upstream_error", False)
    return ("upstream_error", True) if status >= 500 else ("invalid_request", False)


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Return the delay a provider asked for, in seconds, or ``None``.

    Reads ``retry-after-ms`` (OpenAI) first, then ``Retry-After`` as delay-seconds or an
    HTTP-date (RFC 9110, 10.2.3). Negative or past values give 0; unparsable ones
    (non-ASCII digits included) ``None``.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms", "").strip()
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after", "").strip()
    if not value:
        return None
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _error_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = _json.decode(body[:MAX_ERROR_BODY_BYTES])
    except (msgspec.DecodeError, RecursionError):
        return {}
    if isinstance(parsed, list) and parsed and isinstance(parsed[0], dict):
        parsed = parsed[0]  # Gemini answers a JSON array when called without alt=sse
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return parsed  # vLLM-style {"object":"error","message":...,"code":...}
    if isinstance(parsed, dict) and isinstance(parsed.get("Message"), str):
        return {"message": parsed["Message"]}  # AWS (Bedrock) errors also spell it Message
    return {}


def _says_context_too_long(error: Mapping[str, Any], detail: str) -> bool:
    return error.get("code") in _CONTEXT_CODES or bool(_CONTEXT_TOO_LONG.search(detail))


def _provider_code(provider: str, error: Mapping[str, Any]) -> str | None:
    order = {"anthropic": ("type",), "gemini": ("status",),
             "gemini_interactions": ("status",)}.get(provider, ("code", "type"))
    for name in order:
        value = error.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _aws_error_type(headers: Mapping[str, str]) -> str | None:
    """Return the error name of an AWS ``x-amzn-ErrorType`` header (``Name:uri`` or ``ns#Name`` → ``Name``)."""
    value = next((v for k, v in headers.items() if k.lower() == "x-amzn-errortype"), "")
    name = value.rpartition("#")[2].partition(":")[0].strip()
    return name or None


def http_error(
    provider: str,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: datetime | None = None,
) -> UpstreamHTTPError:
    """Name the contract error of a non-2xx answer received before any body event.

    Args:
        provider: Provider API (``openai_chat``, ``openai_responses``, ``anthropic``,
            ``gemini``); decides where the error body keeps its code.
        status: The HTTP status code (not 2xx).
        headers: Response headers (any case); ``Retry-After`` is read from them.
        body: The error body, possibly empty, possibly not JSON; only the first
            :data:`MAX_ERROR_BODY_BYTES` are looked at.
        now: Current time for HTTP-date ``Retry-After`` values (tests).

    Returns:
        The error to end the stream with (the caller retries first when ``retryable``).
        Its message names the provider's own message; the normalizer masks secrets in it.
    """
    category, retryable = category_of_status(status)
    error = _error_object(body)
    code = _provider_code(provider, error)
    raw = error.get("message")
    detail = raw if isinstance(raw, str) else ""
    aws_type = _aws_error_type(headers)
    known = aws_type is not None and aws_type.lower() in EXCEPTIONS
    if aws_type:  # Bedrock: the type names the error, as in its exception frames
        code = aws_type
        if known:
            category, retryable = failure_of(aws_type, detail)
    if status == 400 and not known and _says_context_too_long(error, detail):
        category, retryable = "context_length_exceeded", False
    message = f"provider answered HTTP {status}" + (f": {detail}" if detail else "")
    return UpstreamHTTPError(
        message, status=status, category=category, retryable=retryable, provider_code=code,
        retry_after_s=parse_retry_after(headers, now=now),
    )
