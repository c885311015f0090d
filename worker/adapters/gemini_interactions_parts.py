"""Gemini Interactions API tables and helpers used by :mod:`worker.adapters.gemini_interactions`.

One job: the pure lookups the adapter needs: which step types are blocks, which delta
type each block kind takes, the interaction's final ``status`` → terminal, the ``error``
object → contract error, and ``usage`` → :class:`~schema.contract.Usage`. Follows the
revision pinned in :data:`API_REVISION` (python-genai ``google/genai/_gaos/types/interactions``:
``step.py``, ``stepdeltadata.py``, ``stepstop.py``, ``interactionstatusupdate.py``,
``errorevent.py``; UPSTREAMS.md E.3). Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Any, Final

from schema.contract import BlockKind, DoneStatus, ErrorCategory, FinishReason, Usage
from worker.adapters.gemini_parts import ERROR_BY_CODE, ERROR_BY_STATUS, error_info

API_REVISION: Final = "2026-05-20"
"""The ``Api-Revision`` header fanout sends: the event set this adapter reads (``step.*`` events).
Older revisions (``interaction.start``, ``content.*``) are not read (UPSTREAMS.md E.3)."""

BLOCK_STEPS: Final[dict[str, BlockKind]] = {
    "model_output": "text",
    "thought": "reasoning",
    "function_call": "tool_call",
}
"""Step ``type`` → block kind; every other step (built-in tool calls and results, user input) is no block."""

DELTA_FIELDS: Final[dict[str, tuple[BlockKind, str]]] = {
    "text": ("text", "text"),
    "thought_summary": ("reasoning", "content"),
    "arguments_delta": ("tool_call", "arguments"),
}
"""``step.delta`` ``delta.type`` → (block kind it belongs to, field holding its content).
``thought_summary`` holds ``content: {type: "text", text}``; ``arguments_delta`` holds a
JSON fragment string (**unconfirmed**: field name from a wire capture, not the SDK's model)."""

SIGNATURE_DELTA: Final = "thought_signature"
"""``delta.type`` carrying ``signature`` for the step's block (**unconfirmed** field name)."""

FINAL_STATUS: Final[dict[str, tuple[DoneStatus, FinishReason]]] = {
    "completed": ("completed", "stop"),
    "requires_action": ("completed", "tool_calls"),
    "incomplete": ("incomplete", "length"),
    "budget_exceeded": ("incomplete", "other"),
}
"""``interaction.status`` at ``interaction.completed`` → (status, finish_reason). ``incomplete`` is
taken as a token limit (**unconfirmed**: the interaction carries no reason); ``failed`` and
``cancelled`` end ``stream.error`` (see the adapter)."""

FILTER_CODES: Final = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY",
                                 "RECITATION"})
"""Error codes of a blocked prompt or output: ``content_filter`` (**unconfirmed** values; Gemini's)."""


def obj(value: object) -> dict[str, Any]:
    """Return ``value`` when it is a JSON object, else ``{}``."""
    return value if isinstance(value, dict) else {}


def text(value: object) -> str:
    """Return ``value`` when it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def interactions_error(error: object) -> tuple[ErrorCategory, str | None, str]:
    """Map an Interactions ``error`` value to (category, provider_code, message).

    Args:
        error: ``{"code": str | int, "message": str}``; a string ``code`` is a Google RPC
            status (``RESOURCE_EXHAUSTED``) or a block reason (``SAFETY``); a ``status`` key
            is read as Gemini's.

    Returns:
        As :func:`worker.adapters.gemini_parts.error_info`; a block reason is ``content_filter``.
    """
    fields = obj(error) if isinstance(error, dict) else {"message": error}
    code = fields.get("code")
    if isinstance(code, str) and not fields.get("status"):
        if code.isdigit() and int(code) in ERROR_BY_CODE:
            fields = {**fields, "code": int(code)}
        elif code in FILTER_CODES:
            return "content_filter", code, text(fields.get("message")) or "the provider blocked the content"
        elif code in ERROR_BY_STATUS:
            fields = {**fields, "status": code}
    return error_info(fields)


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_of(value: object) -> Usage | None:
    """Map an Interactions ``usage`` (cumulative) to usage; ``None`` when it holds no token count.

    ``output_tokens`` = ``total_output_tokens`` + ``total_thought_tokens`` (outputs exclude
    thoughts, as Gemini's ``candidatesTokenCount``); ``reasoning_tokens`` = ``total_thought_tokens``.
    """
    usage = obj(value)
    keys = ("total_input_tokens", "total_output_tokens", "total_thought_tokens", "total_cached_tokens")
    if not any(_count(usage, k) is not None for k in keys):
        return None
    output, thoughts = _count(usage, "total_output_tokens"), _count(usage, "total_thought_tokens")
    return Usage(input_tokens=_count(usage, "total_input_tokens"), output_tokens=(output or 0) + (thoughts or 0),
                 cached_input_tokens=_count(usage, "total_cached_tokens"), reasoning_tokens=thoughts)
