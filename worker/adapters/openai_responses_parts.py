"""Tables, payload readers and item addressing of the OpenAI Responses adapter.

One job: what :mod:`worker.adapters.openai_responses` (routing, terminal events) and
:mod:`worker.adapters.openai_responses_blocks` (block operations) read: the event tables,
error codes, usage, total readers of JSON values, and :class:`Items`, which finds the
output item an event addresses. Follows PROVIDERS.md sections 3, 6 and 7. Pure: imports
no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from schema.contract import BlockKind, ErrorCategory, FinishReason, Usage
from schema.errors import UpstreamProtocolError

Payload = dict[str, Any]
Source = Literal["summary", "raw"]

PART_KINDS: Final[dict[str, BlockKind]] = {"output_text": "text", "refusal": "refusal"}
"""Message content part type → block kind; other part types are not blocks."""

PART_FIELDS: Final[dict[str, str]] = {"output_text": "text", "refusal": "refusal"}
"""Message content part type → the field holding its final value."""

BLOCK_ITEMS: Final = frozenset({"message", "reasoning", "function_call"})
"""Output item types that give blocks; built-in tool items and the rest do not."""

TERMINAL_STATUS: Final[dict[str, str]] = {
    "response.completed": "completed", "response.incomplete": "incomplete",
    "response.failed": "failed", "response.cancelled": "cancelled",
}
"""Terminal event → the response status it proves (``response.done`` reads ``response.status``)."""

TERMINAL_EVENTS: Final = (*TERMINAL_STATUS, "response.done")
"""Events that end the response (``response.done``: Codex-style gateways)."""

SNAPSHOT_EVENTS: Final = ("response.created", "response.in_progress", "response.queued")
"""Events whose ``response`` gives the response id and model."""

PART_EVENTS: Final[dict[str, tuple[str, str]]] = {
    "response.output_text.delta": ("output_text", "delta"),
    "response.output_text.done": ("output_text", "text"),
    "response.refusal.delta": ("refusal", "delta"),
    "response.refusal.done": ("refusal", "refusal"),
}
"""Message content part event → (part type, the field holding its fragment or final value)."""

REASONING_EVENTS: Final[dict[str, tuple[Source, str]]] = {
    "response.reasoning_summary_part.done": ("summary", "part"),
    "response.reasoning_summary_text.delta": ("summary", "delta"),
    "response.reasoning_summary_text.done": ("summary", "text"),
    "response.reasoning_text.delta": ("raw", "delta"),
    "response.reasoning_text.done": ("raw", "text"),
}
"""Reasoning event → (text source, ``part`` for a whole summary part, else the field read)."""

INCOMPLETE_FINISH: Final[dict[str, FinishReason]] = {"max_output_tokens": "length", "content_filter": "content_filter"}
"""``incomplete_details.reason`` → finish_reason; other reasons are ``other``."""

TRUNCATION_REASONS: Final = frozenset({"max_output_tokens"})
"""Incomplete reasons that close the open blocks before ``stream.done`` (section 7 rule 7)."""

ERROR_CATEGORIES: Final[dict[str, ErrorCategory]] = {
    "server_error": "upstream_error", "vector_store_timeout": "upstream_error",
    "rate_limit_exceeded": "rate_limited", "tokens": "rate_limited", "requests": "rate_limited",
    "insufficient_quota": "rate_limited",
    "invalid_prompt": "invalid_request", "invalid_request_error": "invalid_request",
    "context_length_exceeded": "context_length_exceeded",
    "invalid_api_key": "authentication", "authentication_error": "authentication",
    "permission_denied": "permission", "model_not_found": "not_found",
}
"""Responses error ``code`` (or nested ``type`` when no code) → category.

Codes naming an image (``invalid_image``, ``image_too_large``, ...) are request errors
(``invalid_request``); anything else is ``upstream_error``. ``tokens``/``requests`` are
the nested ``error.type`` of the live API's rate-limit events.
"""

NOT_RETRYABLE: Final = frozenset({"insufficient_quota"})
"""Codes whose category is retryable by default but the same job cannot succeed."""


def category_of(code: str | None) -> ErrorCategory:
    """Map a Responses error code to a contract category (see :data:`ERROR_CATEGORIES`)."""
    if code is None:
        return "upstream_error"
    if code in ERROR_CATEGORIES:
        return ERROR_CATEGORIES[code]
    return "invalid_request" if "image" in code else "upstream_error"


def retryable_of(code: str | None) -> bool | None:
    """Return False for codes in :data:`NOT_RETRYABLE`, else None (the category default)."""
    return False if code in NOT_RETRYABLE else None


def text(value: object) -> str:
    """``value`` if it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def optional(value: object) -> str | None:
    """``value`` if it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def obj(value: object) -> Payload:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def index(payload: Payload, field: str, *, default: int | None = None) -> int:
    """Read a non-negative integer field (``output_index``, ``content_index``, ...).

    Raises:
        UpstreamProtocolError: Missing (and no ``default``) or not a non-negative int.

    """
    value = payload.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UpstreamProtocolError(f"upstream sent {payload.get('type')} without a valid {field}")
    return value


def _count(report: Payload, field: str, detail: str | None = None) -> int | None:
    value = obj(report.get(field)).get(detail) if detail else report.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_of(report: object) -> Usage | None:
    """Map the terminal response's ``usage`` (PROVIDERS.md 3.4); None when it is absent."""
    if not isinstance(report, dict):
        return None
    return Usage(
        input_tokens=_count(report, "input_tokens"),
        output_tokens=_count(report, "output_tokens"),
        cached_input_tokens=_count(report, "input_tokens_details", "cached_tokens"),
        reasoning_tokens=_count(report, "output_tokens_details", "reasoning_tokens"),
    )


def error_fields(payload: Payload) -> tuple[str | None, str]:
    """Return (code, message) of an ``error`` event, flat or nested (PROVIDERS.md 3.3).

    Flat: ``code``/``message`` at the top level (the documented shape). Nested:
    ``error: {type, code, message, param}`` (the live API). The nested ``type`` stands
    in for a missing code; the flat top-level ``type`` is the event name, never a code.
    """
    nested = payload.get("error")
    if isinstance(nested, dict):
        code = optional(nested.get("code")) or optional(nested.get("type"))
        return code, text(nested.get("message"))
    return optional(payload.get("code")), text(payload.get("message"))


def items(value: object) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


class Item(msgspec.Struct, kw_only=True):
    """What the adapter knows of one output item (``response.output[output_index]``)."""

    key: str
    """``#<output_index>``: names the item's blocks (the item ``id`` is advisory)."""
    kind: str
    """The item ``type``: ``message``, ``reasoning``, ``function_call`` or a built-in tool."""
    output_index: int
    """Position in ``response.output``."""
    done: bool = False
    """``output_item.done`` (or the terminal output) finished it."""
    call_id: str | None = None
    """``function_call``: the id results go back under (``call_…``)."""
    name: str | None = None
    """``function_call``: the function name (the block opens once it is known)."""
    pending: list[str] = msgspec.field(default_factory=list)
    """``function_call``: argument fragments received before the name."""
    source: Source | None = None
    """``reasoning``: the text source read (summary or raw); the other one is ignored."""
    sub_sent: dict[int, str] = msgspec.field(default_factory=dict)
    """``reasoning``: text streamed per summary/content part."""
    sub_current: int | None = None
    """``reasoning``: the part whose text was streamed last."""
    part_kinds: dict[int, BlockKind] = msgspec.field(default_factory=dict)
    """``message``: content_index → block kind, from ``content_part.added`` or a delta."""
    closed_parts: set[int] = msgspec.field(default_factory=set)
    """``message``: content parts finished by ``content_part.done``."""

    @property
    def block(self) -> tuple[str, str]:
        """Block key of a reasoning or function_call item."""
        return ("item", self.key)

    def part(self, content_index: int) -> tuple[str, str, int]:
        """Block key of a message content part."""
        return ("part", self.key, content_index)


def item_type(item: Payload) -> str:
    """Return an output item's ``type``, ``untyped`` without one."""
    return optional(item.get("type")) or "untyped"


class Items:
    """The output items of one response, by ``output_index`` (item ids are advisory)."""

    def __init__(self) -> None:
        self._at: dict[int, Item] = {}
        """output_index → the item announced there (items are keyed by position)."""
        self._ids: dict[str, int] = {}
        """item id → output_index, for an event that carries no ``output_index``."""

    def get(self, output_index: int) -> Item | None:
        """Return the item announced at ``output_index``, if any."""
        return self._at.get(output_index)

    def lookup(self, payload: Payload) -> Item | None:
        """Return the item an event addresses: by ``output_index``, by ``item_id`` only without one.

        ``item_id`` is advisory: relays rotate it on every event (PROVIDERS.md 3.5,
        amended; vercel/ai PR #18548), so it never overrides the position.
        """
        output_index = payload.get("output_index")
        if not isinstance(output_index, int) or isinstance(output_index, bool):
            item_id = payload.get("item_id")
            output_index = self._ids.get(item_id) if isinstance(item_id, str) else None
        return None if output_index is None else self._at.get(output_index)

    def resolve(self, payload: Payload, kind: str) -> Item:
        """Return the announced, unfinished item of ``kind`` an event addresses.

        Raises:
            UpstreamProtocolError: No such item, another kind, or already done.
        """
        item, what = self.lookup(payload), payload.get("type")
        if item is None:
            raise UpstreamProtocolError(f"upstream sent {what} for an output item it never announced")
        if item.kind != kind:
            raise UpstreamProtocolError(f"upstream sent {what} for a {item.kind} item")
        if item.done:
            raise UpstreamProtocolError(f"upstream sent {what} after the item was done")
        return item

    def register(self, output_index: int, item: Payload) -> Item:
        """Record the item announced (or first finished) at ``output_index``."""
        entry = Item(key=f"#{output_index}", kind=item_type(item), output_index=output_index)
        self._at[output_index] = entry
        if (item_id := optional(item.get("id"))) is not None:
            self._ids[item_id] = output_index
        return entry
