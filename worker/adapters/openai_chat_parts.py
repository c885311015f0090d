"""Field readers and mapping tables of the OpenAI Chat Completions adapter.

One job: turn single fields of a ``chat.completion.chunk`` (or of an error payload) into
contract values: payload shapes, finish reasons, usage, error categories, reasoning
text, tool arguments and signatures (the blocks they feed:
:mod:`worker.adapters.openai_chat_blocks`). Every function here is pure and total over
JSON input; a value of the wrong shape raises
:class:`~schema.errors.UpstreamProtocolError` or reads as "absent". Follows PROVIDERS.md
sections 2 and 6. Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import msgspec

from schema.contract import DoneStatus, ErrorCategory, FinishReason, Usage
from schema.errors import UpstreamProtocolError

FINISH: Final[dict[str, tuple[DoneStatus, FinishReason]]] = {
    "stop": ("completed", "stop"),
    "eos": ("completed", "stop"),
    "eos_token": ("completed", "stop"),
    "tool_calls": ("completed", "tool_calls"),
    "function_call": ("completed", "tool_calls"),
    "length": ("incomplete", "length"),
    "content_filter": ("incomplete", "content_filter"),
}
"""Raw ``finish_reason`` → (status, normalized finish); anything else is ``incomplete``/``other``.
``eos`` (Together AI) and ``eos_token`` (TGI-style servers) are a normal end (PROVIDERS.md 2.1, 6)."""

ERROR_NAMES: Final[dict[str, ErrorCategory]] = {
    "server_error": "upstream_error",
    "internal_error": "upstream_error",
    "internalservererror": "upstream_error",
    "api_error": "upstream_error",
    "rate_limit_exceeded": "rate_limited",
    "rate_limit_error": "rate_limited",
    "ratelimiterror": "rate_limited",
    "insufficient_quota": "rate_limited",
    "context_length_exceeded": "context_length_exceeded",
    "invalid_request_error": "invalid_request",
    "badrequesterror": "invalid_request",
    "authentication_error": "authentication",
    "authenticationerror": "authentication",
    "invalid_api_key": "authentication",
    "permission_error": "permission",
    "permissiondeniederror": "permission",
    "not_found_error": "not_found",
    "notfounderror": "not_found",
    "model_not_found": "not_found",
    "overloaded": "upstream_overloaded",
    "overloaded_error": "upstream_overloaded",
    "service_unavailable": "upstream_overloaded",
    "server_overloaded": "upstream_overloaded",
    "content_filter": "content_filter",
    "content_policy_violation": "content_filter",
}
"""OpenAI-style error ``code``/``type`` strings (lower-cased) → category; vLLM's
exception class names are included."""

ERROR_STATUSES: Final[dict[int, ErrorCategory]] = {
    400: "invalid_request",
    401: "authentication",
    402: "rate_limited",
    403: "permission",
    404: "not_found",
    408: "upstream_error",
    429: "rate_limited",
    503: "upstream_overloaded",
    529: "upstream_overloaded",
}
"""Numeric codes (OpenRouter and vLLM put the HTTP status in ``code``) → category;
other 4xx are ``invalid_request``, everything else ``upstream_error``."""

NOT_RETRYABLE_CODE: Final = "insufficient_quota"
"""The code of an exhausted quota: rate_limited, yet a retry will not pass."""
NOT_RETRYABLE_STATUS: Final = 402
"""OpenRouter's "insufficient credits": rate_limited, yet a retry will not pass."""


class ErrorReport(NamedTuple):
    """An upstream error object read into contract terms."""

    category: ErrorCategory
    """The contract error category."""
    retryable: bool | None
    """``None`` to use the category's default."""
    provider_code: str | None
    """The provider's ``code`` if a string, else its ``type``, else the numeric code."""
    message: str
    """The provider's message (the normalizer masks secrets and cuts it)."""


def map_finish(raw: str) -> tuple[DoneStatus, FinishReason]:
    """Return (status, finish_reason) for a raw ``finish_reason`` (PROVIDERS.md 6, 7.1)."""
    return FINISH.get(raw, ("incomplete", "other"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sub(obj: dict[str, Any], name: str, field: str) -> int | None:
    inner = obj.get(name)
    return _int(inner.get(field)) if isinstance(inner, dict) else None


def map_usage(raw: dict[str, Any]) -> Usage:
    """Map an OpenAI ``usage`` object; fields not sent (or ``null`` details) are ``None``.

    DeepSeek's ``prompt_cache_hit_tokens`` stands in for the cached count only when
    ``prompt_tokens_details`` carries none.
    """
    cached = _sub(raw, "prompt_tokens_details", "cached_tokens")
    return Usage(
        input_tokens=_int(raw.get("prompt_tokens")),
        output_tokens=_int(raw.get("completion_tokens")),
        cached_input_tokens=cached if cached is not None else _int(raw.get("prompt_cache_hit_tokens")),
        reasoning_tokens=_sub(raw, "completion_tokens_details", "reasoning_tokens"),
    )


def usage_of(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """Return the chunk's usage object: top-level ``usage``, else Groq's ``x_groq.usage``."""
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        return usage
    groq = chunk.get("x_groq")
    inner = groq.get("usage") if isinstance(groq, dict) else None
    return inner if isinstance(inner, dict) else None


def _status_of(code: Any) -> int | None:
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return _int(code)


def _category(code: Any, kind: Any) -> ErrorCategory:
    for name in (code, kind):
        if isinstance(name, str) and name.lower() in ERROR_NAMES:
            return ERROR_NAMES[name.lower()]
    status = _status_of(code)
    if status is None:
        return "upstream_error"
    if status in ERROR_STATUSES:
        return ERROR_STATUSES[status]
    return "invalid_request" if 400 <= status < 500 else "upstream_error"


def _provider_code(code: Any, kind: Any) -> str | None:
    if isinstance(code, str) and code:
        return code
    if isinstance(kind, str) and kind:
        return kind
    return str(code) if _int(code) is not None else None


def read_error(error: Any) -> ErrorReport:
    """Read an error object: ``{"message","type","code",...}`` or a bare message string.

    Only ``message`` is passed on: ``metadata`` (OpenRouter) may quote the prompt.
    """
    if not isinstance(error, dict):
        text = error if isinstance(error, str) and error else "upstream reported an error"
        return ErrorReport("upstream_error", None, None, text)
    code, kind = error.get("code"), error.get("type")
    provider_code = _provider_code(code, kind)
    message = error.get("message")
    exhausted = NOT_RETRYABLE_CODE in (code, kind) or _status_of(code) == NOT_RETRYABLE_STATUS
    return ErrorReport(
        _category(code, kind), False if exhausted else None, provider_code,
        message if isinstance(message, str) and message else "upstream reported an error",
    )


def _reasoning_content(delta: dict[str, Any]) -> str:
    value = delta.get("reasoning_content")
    if isinstance(value, dict):
        value = value.get("text")
    return value if isinstance(value, str) else ""


def _reasoning(delta: dict[str, Any]) -> str:
    value = delta.get("reasoning")
    return value if isinstance(value, str) else ""


def _reasoning_details(delta: dict[str, Any]) -> str:
    items = delta.get("reasoning_details")
    if not isinstance(items, list):
        return ""
    pieces = (item.get("text", item.get("summary")) for item in items if isinstance(item, dict))
    return "".join(p for p in pieces if isinstance(p, str))


def _copilot_reasoning_text(delta: dict[str, Any]) -> str:
    value = delta.get("reasoning_text")
    return value if isinstance(value, str) else ""


def reasoning_text(delta: dict[str, Any]) -> str:
    """Return the delta's reasoning text from ONE source, never two (PROVIDERS.md 2.5).

    Precedence: ``reasoning_content`` (a string, or an object with ``text``), then
    ``reasoning``, then GitHub Copilot's ``reasoning_text`` (amended 2.5;
    BerriAI/litellm#35021), then the ``text``/``summary`` of ``reasoning_details``
    items; the first that yields text wins. Encrypted detail items carry no text and
    are skipped.
    """
    for read in (_reasoning_content, _reasoning, _copilot_reasoning_text, _reasoning_details):
        text = read(delta)
        if text:
            return text
    return ""


def reasoning_opaque(delta: dict[str, Any]) -> str:
    """Return GitHub Copilot's ``delta.reasoning_opaque``, or ``""``.

    The opaque round-trip value of the reasoning that precedes it (Copilot sends it in
    its own chunk after the last ``reasoning_text``, or beside the first content or
    tool call); it becomes a ``signature`` delta on that reasoning block (PROVIDERS.md
    2.5, amended; BerriAI/litellm#35021, ericc-ch/copilot-api PR #152).
    """
    value = delta.get("reasoning_opaque")
    return value if isinstance(value, str) else ""


def text_of(delta: dict[str, Any], field: str) -> str:
    """Return a string field of the delta, ``""`` when absent, ``null`` or not a string."""
    value = delta.get(field)
    return value if isinstance(value, str) else ""


def arguments_text(value: Any) -> str:
    """Return a tool fragment's ``arguments`` as text.

    Omitted or ``null`` is ``""``; a JSON object sent unquoted (some servers) is
    serialized once.

    Raises:
        UpstreamProtocolError: Arguments that are neither text nor a JSON object; the
            stream ends ``failed``/``protocol``.

    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return msgspec.json.encode(value).decode()
    raise UpstreamProtocolError("upstream sent tool arguments that are neither text nor an object")


def nonempty(value: Any) -> str | None:
    """Return ``value`` if it is a non-empty string, else ``None``."""
    return value if isinstance(value, str) and value else None


def thought_signature(fragment: dict[str, Any]) -> str:
    """Return a tool fragment's Gemini ``extra_content.google.thought_signature``, or ``""``.

    Gemini's OpenAI-compatible layer puts it there and rejects the next turn without it,
    so it rides on the tool_call block as a ``signature`` delta.
    """
    extra = fragment.get("extra_content")
    google = extra.get("google") if isinstance(extra, dict) else None
    value = google.get("thought_signature") if isinstance(google, dict) else None
    return value if isinstance(value, str) else ""


def payload_shape(payload: dict[str, Any]) -> str:
    """Name a payload by its shape, the adapter's dispatch key.

    ``flat_error`` (vLLM ``object: error``); ``chunk`` (has ``choices`` or ``usage``; an
    ``error`` on it is read after its deltas); ``error`` (a top-level error object);
    else its own ``object``/``type`` label, or ``unknown_payload``.
    """
    if payload.get("object") == "error":
        return "flat_error"
    if "choices" in payload or "usage" in payload:
        return "chunk"
    if payload.get("error") is not None:
        return "error"
    label = payload.get("object") or payload.get("type")
    return label if isinstance(label, str) and label else "unknown_payload"
