"""Contract events → the AI SDK's UI message stream chunks, one stream at a time. Pure.

The AI SDK (``ai`` on npm, checked at the version pinned in ``tests/node/package.json``)
reads a chat answer as a *UI message stream*: SSE ``data:`` lines, each one JSON chunk,
then ``data: [DONE]``. :class:`UIMessageTranslator` maps one fanout stream onto it:

=========================================  =================================================
contract event                             chunks
=========================================  =================================================
``stream.start``                           ``start`` (``messageId`` = stream id), ``start-step``
``block.start`` text / refusal             ``text-start`` (a refusal carries ``fanout.kind``)
``block.start`` reasoning                  ``reasoning-start``
``block.start`` tool_call                  ``tool-input-start`` (``toolCallId``, ``toolName``)
``block.delta`` text                       ``text-delta`` / ``reasoning-delta`` by block kind
``block.delta`` json_text                  ``tool-input-delta``
``block.delta`` signature                  none: kept, sent as ``providerMetadata.fanout.signature``
                                           on the block's end chunk
``block.stop`` text / reasoning            ``text-end`` / ``reasoning-end``
``block.stop`` tool_call                   none yet: a call is only usable once the stream completed
``stream.done`` ``completed``              per tool call: ``tool-input-available`` when its block
                                           closed and its arguments parse to an object, else
                                           ``tool-input-error``; then ``finish-step``, ``finish``
``stream.done`` ``incomplete``             ``tool-input-error`` per tool call, ``finish-step``, ``finish``
``stream.error``                           ``tool-input-error`` per tool call, ``error``
                                           (``errorText`` = the error's safe message),
                                           ``finish-step``, ``finish`` (``finishReason: error``)
=========================================  =================================================

So no chunk ever makes a tool input executable (state ``input-available``) unless fanout's
rule allows it: the call's block closed, with parseable arguments, in a ``completed``
stream (CONTRACT.md, "Terminal states"). ``finish`` carries the finish reason mapped to
the SDK's names and ``messageMetadata.fanout`` = status, finish reasons, usage, model and
response id. Unknown event types produce nothing. Visibility (internal reasoning) is the
caller's job: feed only the events the reader may see.

Follows the AI SDK's "Stream Protocols" page (UI message stream) and its
``ui-message-chunks`` schema; CONTRACT.md for the events.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from schema.contract import BlockDelta, BlockStart, BlockStop, Event, StreamDone, StreamError, StreamStart
from schema.reducer import parse_arguments

Chunk = dict[str, Any]
"""One UI message stream chunk, JSON-ready (``{"type": "text-delta", "id": ..., "delta": ...}``)."""

FINISH_REASONS: Final = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool-calls",
    "content_filter": "content-filter",
    "refusal": "content-filter",
    "pause": "other",
    "other": "other",
}
"""fanout ``finish_reason`` → the SDK's ``finishReason`` (a value it lacks maps to ``other``)."""

UNUSABLE_CALL: Final = (
    "the tool call is not executable: its stream did not complete with its arguments closed and valid"
)
"""``errorText`` of a tool call that must not run."""

DONE_LINE: Final = b"data: [DONE]\n\n"
"""The line that ends a UI message stream."""


def chunk_frame(chunk: Chunk) -> bytes:
    """Return one chunk as its SSE message: ``data: <compact JSON>`` and a blank line."""
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


class _Call:
    __slots__ = ("closed", "name", "parts")

    def __init__(self, name: str) -> None:
        self.name = name
        self.parts: list[str] = []
        self.closed = False


class UIMessageTranslator:
    """Per-response state that turns one stream's events into UI message chunks.

    Feed events in stored order (from seq 1: the SDK needs ``start`` first); each call of
    :meth:`feed` returns the chunks that event produces, often one, possibly none.
    """

    def __init__(self) -> None:
        self._kinds: dict[int, str] = {}
        self._ids: dict[int, str] = {}
        self._signatures: dict[int, list[str]] = {}
        self._calls: dict[int, _Call] = {}
        self._call_ids: dict[int, str] = {}
        self.finished = False
        """A terminal event was translated; nothing more will be produced."""

    def feed(self, event: Event) -> list[Chunk]:
        """Return the chunks for one event (empty for events that map to nothing)."""
        if self.finished:
            return []
        if isinstance(event, StreamStart):
            meta = {"fanout": {"stream_id": event.stream_id, "provider": event.provider, "model": event.model}}
            return [{"type": "start", "messageId": event.stream_id, "messageMetadata": meta}, {"type": "start-step"}]
        if isinstance(event, BlockStart):
            return self._start(event)
        if isinstance(event, BlockDelta):
            return self._delta(event)
        if isinstance(event, BlockStop):
            return self._stop(event)
        if isinstance(event, StreamDone | StreamError):
            return self._end(event)
        return []

    def _start(self, event: BlockStart) -> list[Chunk]:
        index, kind = event.block.index, event.block.kind
        self._kinds[index], self._ids[index] = kind, event.block.id
        if kind == "tool_call":
            call_id = event.tool.call_id if event.tool else event.block.id
            name = event.tool.name if event.tool else ""
            self._calls[index], self._call_ids[index] = _Call(name), call_id
            return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name}]
        if kind == "reasoning":
            return [{"type": "reasoning-start", "id": event.block.id}]
        chunk: Chunk = {"type": "text-start", "id": event.block.id}
        if kind == "refusal":
            chunk["providerMetadata"] = {"fanout": {"kind": "refusal"}}
        return [chunk]

    def _delta(self, event: BlockDelta) -> list[Chunk]:
        index = event.block.index
        kind = self._kinds.get(index)
        if kind is None:
            return []
        if event.delta.kind == "signature":
            self._signatures.setdefault(index, []).append(event.delta.text)
            return []
        if kind == "tool_call":
            self._calls[index].parts.append(event.delta.text)
            call_id = self._call_ids[index]
            return [{"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": event.delta.text}]
        name = "reasoning-delta" if kind == "reasoning" else "text-delta"
        return [{"type": name, "id": self._ids[index], "delta": event.delta.text}]

    def _stop(self, event: BlockStop) -> list[Chunk]:
        index = event.block.index
        kind = self._kinds.get(index)
        if kind is None:
            return []
        if kind == "tool_call":
            self._calls[index].closed = True
            return []
        chunk: Chunk = {"type": "reasoning-end" if kind == "reasoning" else "text-end", "id": self._ids[index]}
        signature = self._signatures.get(index)
        if signature:
            chunk["providerMetadata"] = {"fanout": {"signature": "".join(signature)}}
        return [chunk]

    def _end(self, event: StreamDone | StreamError) -> list[Chunk]:
        self.finished = True
        usable = isinstance(event, StreamDone) and event.status == "completed"
        chunks = [self._call_outcome(index, usable=usable) for index in sorted(self._calls)]
        meta: dict[str, Any] = {"status": event.status, "finish_reason": event.finish_reason,
                                "usage": msgspec.to_builtins(event.usage) if event.usage else None}
        if isinstance(event, StreamDone):
            meta.update(provider_finish_reason=event.provider_finish_reason, model=event.model,
                        response_id=event.response_id)
            reason = FINISH_REASONS.get(event.finish_reason or "", "other")
        else:
            meta["error"] = msgspec.to_builtins(event.error)
            chunks.append({"type": "error", "errorText": f"{event.status}: {event.error.message}"})
            reason = "error"
        finish = {"type": "finish", "finishReason": reason, "messageMetadata": {"fanout": meta}}
        chunks += [{"type": "finish-step"}, finish]
        return chunks

    def _call_outcome(self, index: int, *, usable: bool) -> Chunk:
        call, call_id = self._calls[index], self._call_ids[index]
        text = "".join(call.parts)
        arguments = parse_arguments(text) if call.closed else None
        if usable and arguments is not None:
            return {"type": "tool-input-available", "toolCallId": call_id, "toolName": call.name, "input": arguments}
        return {"type": "tool-input-error", "toolCallId": call_id, "toolName": call.name, "input": text,
                "errorText": UNUSABLE_CALL}


_DELTA_TEXT: Final = {"text-delta": ("id", "delta"), "reasoning-delta": ("id", "delta"),
                      "tool-input-delta": ("toolCallId", "inputTextDelta")}
"""Delta chunk type → (its block key field, its text field)."""


class DeltaJoiner:
    """Joins a run of delta chunks into one delta per block (a replay's: the client gets state, not tokens).

    Delta chunks (``text-delta``, ``reasoning-delta``, ``tool-input-delta``) are held, each
    block's joined in arrival order; any other chunk first releases every held delta (in
    the order their blocks first had one), then passes. So no delta moves past another
    chunk, and the SDK, which appends deltas per block id, builds the same message. The
    text held is bounded: once it passes ``max_chars`` it is released as it stands (a
    longer block then arrives in a few deltas, each about ``max_chars``).

    Args:
        max_chars: Most characters held before they are released (``FANOUT_UI_JOIN_MAX_CHARS``).
    """

    def __init__(self, max_chars: int) -> None:
        self._held: dict[tuple[str, str], tuple[Chunk, list[str]]] = {}
        self._max_chars = max_chars
        self._chars = 0

    def feed(self, chunks: list[Chunk]) -> list[Chunk]:
        """Return the chunks to send now for ``chunks`` (delta chunks are held instead)."""
        out: list[Chunk] = []
        for chunk in chunks:
            fields = _DELTA_TEXT.get(chunk["type"])
            if fields is None:
                out += self.flush()
                out.append(chunk)
                continue
            key, text = (chunk["type"], chunk[fields[0]]), chunk[fields[1]]
            held = self._held.get(key)
            if held is None:
                self._held[key] = (chunk, [text])
            else:
                held[1].append(text)
            self._chars += len(text)
            if self._chars > self._max_chars:
                out += self.flush()
        return out

    def flush(self) -> list[Chunk]:
        """Return every held delta, one chunk per block, and hold nothing."""
        out = []
        for (kind, _), (first, parts) in self._held.items():
            out.append({**first, _DELTA_TEXT[kind][1]: "".join(parts)})
        self._held.clear()
        self._chars = 0
        return out
