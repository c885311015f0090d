"""Tables and small pure helpers of the Bedrock ConverseStream adapter.

Holds what :mod:`worker.adapters.bedrock_converse` looks up: the ``stopReason`` table
and the usage mapping (UPSTREAMS.md C.4; botocore
``data/bedrock-runtime/2023-09-30/service-2.json``, shapes ``StopReason``,
``TokenUsage``, ``ConverseStreamOutput``). Pure: imports no asyncio, aiohttp, redis or
opentelemetry.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from schema.contract import DoneStatus, FinishReason, Usage
from schema.errors import UpstreamProtocolError


class Stop(NamedTuple):
    """What one ``stopReason`` proves."""

    status: DoneStatus
    finish: FinishReason
    truncation: bool
    """A token-limit stop: open blocks are closed instead of failing the stream."""


STOP_REASONS: Final[dict[str, Stop]] = {
    "end_turn": Stop("completed", "stop", truncation=False),
    "stop_sequence": Stop("completed", "stop", truncation=False),
    "tool_use": Stop("completed", "tool_calls", truncation=False),
    "max_tokens": Stop("incomplete", "length", truncation=True),
    "model_context_window_exceeded": Stop("incomplete", "length", truncation=True),
    "guardrail_intervened": Stop("incomplete", "content_filter", truncation=False),
    "content_filtered": Stop("incomplete", "content_filter", truncation=False),
    "malformed_model_output": Stop("incomplete", "other", truncation=False),
    "malformed_tool_use": Stop("incomplete", "other", truncation=False),
}
"""``messageStop.stopReason`` → terminal meaning (the service model's ``StopReason`` enum).

``guardrail_intervened`` and ``content_filtered`` withhold output: ``content_filter``
(PROVIDERS.md 6's column for policy stops); the two ``malformed_*`` values are the
model's failure to produce valid output, ``other`` like Gemini's
``MALFORMED_FUNCTION_CALL``. Both kinds are ``incomplete`` (PROVIDERS.md 7.1)."""

UNKNOWN_STOP: Final = Stop("incomplete", "other", truncation=False)
"""A stop reason this version does not know."""


def stop_of(reason: str) -> Stop:
    """Return the terminal meaning of a raw ``stopReason``."""
    return STOP_REASONS.get(reason, UNKNOWN_STOP)


def _count(report: dict[str, Any], field: str) -> int | None:
    value = report.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(report: object) -> Usage | None:
    """Map ``metadata.usage`` (``TokenUsage``) to contract usage; ``None`` when absent.

    As for Anthropic (PROVIDERS.md section 6), ``inputTokens`` counts the uncached
    input only, so ``input_tokens`` = ``inputTokens + cacheReadInputTokens +
    cacheWriteInputTokens`` (missing cache counts 0; ``null`` without ``inputTokens``),
    ``cached_input_tokens`` = ``cacheReadInputTokens``. Converse reports no reasoning
    split: ``reasoning_tokens`` is ``null``.
    """
    if not isinstance(report, dict):
        return None
    base = _count(report, "inputTokens")
    cache_read = _count(report, "cacheReadInputTokens")
    total = None
    if base is not None:
        total = base + (cache_read or 0) + (_count(report, "cacheWriteInputTokens") or 0)
    return Usage(input_tokens=total, output_tokens=_count(report, "outputTokens"),
                 cached_input_tokens=cache_read, reasoning_tokens=None)


def block_index(payload: dict[str, Any], event: str) -> int:
    """Read ``contentBlockIndex``.

    Raises:
        UpstreamProtocolError: Missing or not a non-negative integer.
    """
    index = payload.get("contentBlockIndex")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise UpstreamProtocolError(f"upstream sent {event} without a valid contentBlockIndex")
    return index


def only_key(value: object) -> tuple[str, Any]:
    """Return the one member of a union object (``{"text": ...}``, ``{"toolUse": {...}}``).

    Bedrock's unions carry exactly one member; an empty object names ``empty``, and with
    several the first is taken (the others are counted by the caller as unknown).

    Raises:
        UpstreamProtocolError: Not a JSON object.
    """
    if not isinstance(value, dict):
        raise UpstreamProtocolError("upstream sent a Converse union that is not an object")
    for key, member in value.items():
        return key, member
    return "empty", None
