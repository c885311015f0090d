"""Tables and small pure helpers of the Anthropic Messages adapter.

Holds what :mod:`worker.adapters.anthropic` looks up: the stop-reason table, the
error-type table, the delta table, the usage arithmetic (PROVIDERS.md sections 4
and 6) and the readers of payload fields. Pure: imports no asyncio, aiohttp, redis or
opentelemetry.
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

from schema.contract import BlockKind, DeltaKind, DoneStatus, ErrorCategory, FinishReason, Usage
from schema.errors import UpstreamProtocolError


class Stop(NamedTuple):
    """What one ``stop_reason`` proves once ``message_stop`` arrives."""

    status: DoneStatus
    finish: FinishReason
    truncation: bool
    """A token-limit stop: open blocks are closed instead of failing the stream."""


STOP_REASONS: Final[dict[str, Stop]] = {
    "end_turn": Stop("completed", "stop", truncation=False),
    "stop_sequence": Stop("completed", "stop", truncation=False),
    "tool_use": Stop("completed", "tool_calls", truncation=False),
    "pause_turn": Stop("completed", "pause", truncation=False),
    "compaction": Stop("completed", "pause", truncation=False),
    "refusal": Stop("completed", "refusal", truncation=False),
    "max_tokens": Stop("incomplete", "length", truncation=True),
    "model_context_window_exceeded": Stop("incomplete", "length", truncation=True),
}
"""``message_delta.delta.stop_reason`` → terminal meaning (PROVIDERS.md 4.2 and 6).

``compaction`` (PROVIDERS.md 6, amended): the turn paused after server-side context
compaction and the caller continues it, like ``pause_turn``."""

UNKNOWN_STOP: Final = Stop("incomplete", "other", truncation=False)
"""A stop reason this version does not know: the provider ended, but not in a way we can
call normal (PROVIDERS.md 7.1 makes ``other`` incomplete); an open block still fails."""


def stop_of(reason: str) -> Stop:
    """Return the terminal meaning of a raw ``stop_reason``."""
    return STOP_REASONS.get(reason, UNKNOWN_STOP)


class Failure(NamedTuple):
    """Contract category and retryability of one Anthropic ``error.type``."""

    category: ErrorCategory
    retryable: bool


ERROR_TYPES: Final[dict[str, Failure]] = {
    "overloaded_error": Failure("upstream_overloaded", retryable=True),
    "rate_limit_error": Failure("rate_limited", retryable=True),
    "api_error": Failure("upstream_error", retryable=True),
    "timeout_error": Failure("upstream_error", retryable=True),
    "invalid_request_error": Failure("invalid_request", retryable=False),
    "authentication_error": Failure("authentication", retryable=False),
    "permission_error": Failure("permission", retryable=False),
    "not_found_error": Failure("not_found", retryable=False),
    "billing_error": Failure("permission", retryable=False),
}
"""``error.type`` → contract category. ``billing_error`` is ``permission``: the account
may not use the API until someone pays, so retrying the same job cannot help."""

UNKNOWN_ERROR: Final = Failure("upstream_error", retryable=True)
"""An error type this version does not know: the provider failed the response."""

_CONTEXT_TOO_LONG: Final = re.compile(
    r"prompt is too long|context (?:length|window|limit)|too many (?:input )?tokens"
    r"|maximum context|exceeds? the (?:model'?s? )?(?:maximum|context)",
    re.IGNORECASE,
)


def failure_of(error_type: str | None, message: str) -> Failure:
    """Map an ``error`` event to a contract failure.

    An ``invalid_request_error`` whose message says the prompt or context is too long
    is ``context_length_exceeded``.
    """
    failure = ERROR_TYPES.get(error_type or "", UNKNOWN_ERROR)
    if failure.category == "invalid_request" and _CONTEXT_TOO_LONG.search(message):
        return Failure("context_length_exceeded", retryable=False)
    return failure


class DeltaRule(NamedTuple):
    """How one ``content_block_delta.delta.type`` becomes a contract delta."""

    field: str
    """The delta field holding the fragment."""
    kind: DeltaKind
    """The contract delta kind."""
    blocks: frozenset[BlockKind]
    """Block kinds the delta may address; any other is a protocol violation."""


_ALL_KINDS: Final[frozenset[BlockKind]] = frozenset({"text", "reasoning", "tool_call", "refusal"})

DELTA_RULES: Final[dict[str, DeltaRule]] = {
    "text_delta": DeltaRule("text", "text", frozenset({"text"})),
    "thinking_delta": DeltaRule("thinking", "text", frozenset({"reasoning"})),
    "signature_delta": DeltaRule("signature", "signature", _ALL_KINDS),
    "input_json_delta": DeltaRule("partial_json", "json_text", frozenset({"tool_call"})),
}
"""Delta types that carry contract content; every other type (``citations_delta``, new
ones) is ignored and counted."""

USAGE_FIELDS: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)
"""Top-level ``usage`` counters merged report by report."""


def merge_usage(raw: dict[str, int], report: object) -> None:
    """Fold one ``usage`` object into ``raw``: each counter it carries replaces the held one.

    ``message_start`` gives provisional counts; ``message_delta`` gives cumulative ones,
    which supersede the start values field by field (PROVIDERS.md 4.3). Missing, ``null``
    or non-integer counters leave the held value unchanged.
    """
    if not isinstance(report, dict):
        return
    for name in USAGE_FIELDS:
        _take_count(raw, name, report.get(name))
    details = report.get("output_tokens_details")
    if isinstance(details, dict):
        _take_count(raw, "thinking_tokens", details.get("thinking_tokens"))


def _take_count(raw: dict[str, int], name: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        raw[name] = value


def usage_of(raw: dict[str, int]) -> Usage:
    """Map merged counters to contract usage (PROVIDERS.md section 6).

    ``input_tokens`` is ``input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens`` (missing cache parts count 0), ``null`` when
    ``input_tokens`` never came; ``cached_input_tokens`` is ``cache_read_input_tokens``
    and ``reasoning_tokens`` is ``output_tokens_details.thinking_tokens``, each ``null``
    when never sent.
    """
    base = raw.get("input_tokens")
    total = None
    if base is not None:
        cache = raw.get("cache_creation_input_tokens", 0) + raw.get("cache_read_input_tokens", 0)
        total = base + cache
    return Usage(
        input_tokens=total,
        output_tokens=raw.get("output_tokens"),
        cached_input_tokens=raw.get("cache_read_input_tokens"),
        reasoning_tokens=raw.get("thinking_tokens"),
    )


def text_of(value: object) -> str:
    """``value`` if it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def optional_text(value: object) -> str | None:
    """``value`` if it is a string (empty included), else ``None``."""
    return value if isinstance(value, str) else None


def block_index(payload: dict[str, Any]) -> int:
    """Return a content block event's ``index``.

    Raises:
        UpstreamProtocolError: Missing, not an integer, or negative.
    """
    index = payload.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise UpstreamProtocolError(f"upstream sent {payload.get('type')} without a valid index")
    return index


def object_field(payload: dict[str, Any], field: str) -> dict[str, Any]:
    """Return the JSON object in ``payload[field]`` (``message``, ``content_block``, ``delta``).

    Raises:
        UpstreamProtocolError: Missing or not an object.
    """
    value = payload.get(field)
    if not isinstance(value, dict):
        raise UpstreamProtocolError(f"upstream sent {payload.get('type')} without a {field} object")
    return value
