"""Block operations of the OpenAI Responses adapter: output items' values → normalizer calls.

One job: :class:`ItemBlocks` turns the streamed and finished values of message content
parts, function calls and reasoning items into block operations (opening at the first
content, deltas, ``.done`` settlement, closing). Routing and the terminal events are
:mod:`worker.adapters.openai_responses`; tables, payload readers and item addressing
:mod:`worker.adapters.openai_responses_parts`. Follows PROVIDERS.md sections 3 and 7.
Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Final

from schema.contract import BlockKind, DeltaKind, FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters.openai_responses_parts import (
    PART_FIELDS,
    PART_KINDS,
    Item,
    Payload,
    Source,
    items,
    obj,
    optional,
    text,
)
from worker.normalizer import Normalizer

PART_SEPARATOR: Final = "\n\n"
"""Put between two non-empty summary (or raw reasoning) parts of one reasoning item.

The provider gives each summary part as its own text (typically ``**Title**\\n\\nBody``)
with no separator between parts; ChatGPT shows them as paragraphs, so the one reasoning
block joins them with a blank line, sent at the head of the next part's first fragment.
"""

def reasoning_parts(item: Payload, source: Source | None) -> tuple[Source | None, list[tuple[int, str]]]:
    """Return the source to read and its (sub-index, final text) pairs from a reasoning item.

    One source per item (PROVIDERS.md 7.5): the one already streamed, else the summary
    when it has text, else the raw ``reasoning_text`` content. Sub-indexes are positions
    in ``summary`` or ``content``, as the deltas' ``summary_index``/``content_index``.
    """
    summary = [(i, text(obj(p).get("text"))) for i, p in enumerate(items(item.get("summary")))
               if obj(p).get("type") == "summary_text"]
    raw = [(i, text(obj(p).get("text"))) for i, p in enumerate(items(item.get("content")))
           if obj(p).get("type") == "reasoning_text"]
    if source is None:
        source = "summary" if any(t for _, t in summary) else "raw" if any(t for _, t in raw) else None
    return source, summary if source == "summary" else raw if source == "raw" else []


def _offset(streamed: list[int], length: int) -> int:
    """How far a message's ``content_index`` values sit past the positions of its content.

    0 whenever every streamed index is a position of the finished ``content`` list of
    ``length`` parts (every conforming server, gaps and skipped parts included); else the
    shift that makes the last streamed index the last position (vLLM's counter carried
    over from the previous item, vllm-project/vllm#45742).
    """
    return max(0, max(streamed, default=-1) + 1 - length)


class ItemBlocks:
    """Block operations for output items: opening, deltas, ``.done`` settlement, closing.

    Text, refusal and reasoning blocks open at their first non-empty value (so empty
    parts make no block); a tool call opens once its name is known. A final value the
    streamed text is not a prefix of raises :class:`UpstreamProtocolError` (or, for
    message parts and arguments, ends the stream through :meth:`Normalizer.settle`).

    Args:
        norm: The stream's normalizer.
    """

    def __init__(self, norm: Normalizer) -> None:
        self.norm = norm
        self.kinds: list[BlockKind] = []
        """Kinds of the blocks opened, in order."""

    def open(self, key: tuple[object, ...], kind: BlockKind, *, call_id: str | None = None,
             name: str | None = None) -> None:
        """Open the block ``key`` and remember its kind (nothing once the stream ended)."""
        if self.norm.terminal is None:
            self.norm.open_block(key, kind, call_id=call_id, name=name)
            self.kinds.append(kind)

    def close(self, key: tuple[object, ...]) -> None:
        """Close the block ``key`` if it is open (nothing once the stream ended)."""
        if self.norm.terminal is None and self.norm.is_open(key):
            self.norm.close_block(key)

    def settle(self, key: tuple[object, ...], kind: DeltaKind, final: str) -> None:
        """:meth:`Normalizer.settle` unless the stream already ended."""
        if self.norm.terminal is None:
            self.norm.settle(key, kind, final)

    def completed_finish(self) -> FinishReason:
        """``refusal`` when every non-reasoning block is a refusal, else ``stop`` (derived later)."""
        return "refusal" if set(self.kinds) - {"reasoning"} == {"refusal"} else "stop"

    # -- message content parts ----------------------------------------------

    def part_delta(self, entry: Item, content_index: int, kind: BlockKind, fragment: str) -> None:
        """Append a text or refusal fragment to a content part, opening it if needed."""
        key = entry.part(content_index)
        if fragment and not self.norm.knows(key):
            self.open(key, kind)
        self.norm.delta(key, "text", fragment)

    def settle_part(self, entry: Item, content_index: int, kind: BlockKind, final: str) -> None:
        """Reconcile a content part with its final value (``.done`` wins)."""
        key = entry.part(content_index)
        if final and not self.norm.knows(key):
            self.open(key, kind)
        self.settle(key, "text", final)

    def close_part(self, entry: Item, content_index: int) -> None:
        """Mark a content part finished and close its block if one is open."""
        entry.closed_parts.add(content_index)
        self.close(entry.part(content_index))

    def finish_message(self, entry: Item, item: Payload) -> None:
        """Settle every text/refusal part from a finished message item, then close them.

        Position ``i`` of the item's ``content`` is ``content_index`` ``i`` shifted by
        :func:`_offset`: a server whose ``content_index`` did not restart at 0 for this
        item (vLLM's Harmony path after a reasoning item, vllm-project/vllm#45742)
        streamed the text of ``content[0]`` under ``content_index`` 1, and that text
        settles the block it opened, never opens a second one (PROVIDERS.md 3.5,
        amended).
        """
        content = items(item.get("content"))
        offset = _offset(list(entry.part_kinds), len(content))
        for position, value in enumerate(content):
            content_index = position + offset
            part = obj(value)
            part_type = text(part.get("type"))
            kind = PART_KINDS.get(part_type)
            declared = entry.part_kinds.setdefault(content_index, kind) if kind else None
            if declared != kind:
                raise UpstreamProtocolError(f"upstream finished a {declared} part as {part_type}")
            if kind is not None and content_index not in entry.closed_parts:
                self.settle_part(entry, content_index, kind, text(part.get(PART_FIELDS[part_type])))
        for content_index in sorted(entry.part_kinds):
            self.close_part(entry, content_index)

    # -- function calls -----------------------------------------------------

    def open_call(self, entry: Item) -> None:
        """Open the tool_call block once the name is known, sending held fragments."""
        if entry.name is None or self.norm.knows(entry.block):
            return
        call_id = entry.call_id or f"call_fanout_{entry.output_index}"
        self.open(entry.block, "tool_call", call_id=call_id, name=entry.name)
        self.norm.delta(entry.block, "json_text", "".join(entry.pending))
        entry.pending.clear()

    def call_delta(self, entry: Item, fragment: str) -> None:
        """Append an argument fragment, or hold it while the name is unknown."""
        if self.norm.knows(entry.block):
            self.norm.delta(entry.block, "json_text", fragment)
        else:
            entry.pending.append(fragment)

    def settle_call(self, entry: Item, arguments: object, name: object, call_id: object) -> None:
        """Take a late name or call id, then reconcile the arguments with their final value."""
        entry.name = entry.name or optional(name)
        entry.call_id = entry.call_id or optional(call_id)
        self.open_call(entry)
        if not isinstance(arguments, str):
            return
        if self.norm.knows(entry.block):
            self.settle(entry.block, "json_text", arguments)
        elif arguments.startswith("".join(entry.pending)):
            entry.pending[:] = [arguments]
        else:
            raise UpstreamProtocolError("upstream's final arguments contradict the streamed deltas")

    def finish_call(self, entry: Item, item: Payload) -> None:
        """Settle a finished function_call item and close its block."""
        self.settle_call(entry, item.get("arguments"), item.get("name"), item.get("call_id"))
        if self.norm.terminal is None and not self.norm.knows(entry.block):
            raise UpstreamProtocolError("upstream finished a function_call item without a name")
        self.close(entry.block)

    # -- reasoning ----------------------------------------------------------

    def reasoning_delta(self, entry: Item, sub: int, fragment: str) -> None:
        """Append reasoning text of part ``sub``, opening the block and separating parts."""
        if not fragment:
            return
        prefix = ""
        if sub != entry.sub_current:
            if entry.sub_current is not None and sub < entry.sub_current:
                raise UpstreamProtocolError("upstream sent reasoning text for an earlier part")
            prefix = PART_SEPARATOR if self.norm.text_of(entry.block, "text") else ""
            entry.sub_current = sub
        if not self.norm.knows(entry.block):
            self.open(entry.block, "reasoning")
        self.norm.delta(entry.block, "text", prefix + fragment)
        entry.sub_sent[sub] = entry.sub_sent.get(sub, "") + fragment

    def settle_reasoning(self, entry: Item, sub: int, final: str) -> None:
        """Reconcile reasoning part ``sub`` with its final text (``.done`` wins)."""
        sent = entry.sub_sent.get(sub, "")
        if not final.startswith(sent):
            raise UpstreamProtocolError("upstream's final reasoning text contradicts the streamed deltas")
        self.reasoning_delta(entry, sub, final[len(sent):])

    def finish_reasoning(self, entry: Item, item: Payload) -> None:
        """Settle a finished reasoning item, send ``encrypted_content`` as signature, close."""
        entry.source, finals = reasoning_parts(item, entry.source)
        for sub, final in finals:
            self.settle_reasoning(entry, sub, final)
        signature = text(item.get("encrypted_content"))
        if signature and not self.norm.knows(entry.block):
            self.open(entry.block, "reasoning")
        if signature and self.norm.terminal is None:
            self.norm.delta(entry.block, "signature", signature)
        self.close(entry.block)
