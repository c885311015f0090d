"""Contract events → the AI SDK's UI message stream chunks, one stream at a time. Pure.

The AI SDK (``ai`` on npm, checked at the version pinned in ``tests/node/package.json``)
reads a chat answer as a *UI message stream*: SSE ``data:`` lines, each one JSON chunk,
then ``data: [DONE]``. :class:`UIMessageTranslator` maps one fanout stream onto it:

=========================================  =================================================
contract event                             chunks
=========================================  =================================================
``stream.start``                           ``start`` (``messageId`` = stream id), ``start-step``
``block.start`` text / refusal             ``text-start`` (a refusal carries ``fanout.kind``)
``block.start`` reasoning                  ``reasoning-start`` (a redacted one carries ``fanout.redacted``)
``block.start`` tool_call                  ``tool-input-start`` (``toolCallId`` unique in the message,
                                           ``toolName``, ``inputEncoding: "json"``)
``block.delta`` text                       ``text-delta`` / ``reasoning-delta`` by block kind
``block.delta`` json_text                  ``tool-input-delta``
``block.delta`` signature                  none: kept, sent as ``providerMetadata.fanout.signature``
                                           on the block's end chunk (a tool call's: on its outcome)
``block.stop`` text / reasoning            ``text-end`` / ``reasoning-end``
``block.stop`` tool_call                   none yet: a call is only usable once the stream completed
``stream.done`` ``completed``              per tool call: ``tool-input-available`` when its block
                                           closed and its arguments parse to an object, else
                                           ``tool-input-error``; then ``finish-step``, ``finish``
``stream.done`` ``incomplete``             ``tool-input-error`` per tool call, ``finish-step``, ``finish``
``stream.error``                           ``tool-input-error`` per tool call, ``error``
                                           (``errorText`` = the error's safe message),
                                           ``finish-step``, ``finish`` (``finishReason: error``)
``stream.error`` ``cancelled``             ``tool-input-error`` per tool call, ``abort`` (``reason``),
                                           ``finish-step``, ``finish`` (no ``finishReason``)
=========================================  =================================================

Tool call ids are unique within the message (:class:`publisher.wire.call_ids.CallIds`):
the SDK keys a tool part by ``toolCallId``, so two parallel calls a provider gave one id
(Kimi-style Anthropic-compatible endpoints, some OpenAI relays) would merge into one part.
A derived id keeps the provider's in the part's provider metadata
(``callProviderMetadata.fanout.call_id``), to be sent back upstream unchanged.

The chunk types of ``ai``'s ``uiMessageChunkSchema`` left unused have nothing in the
contract to carry: ``source-*`` and ``file`` (no citations or files in contract v1),
``tool-output-*`` and ``tool-approval-request`` (fanout streams a model's answer, it runs
no tools), ``data-*`` and ``message-metadata`` (what fanout knows late rides on
``finish``).

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

from publisher.wire.call_ids import CallIds
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
    __slots__ = ("closed", "name", "parts", "provider_id")

    def __init__(self, name: str, provider_id: str) -> None:
        self.name, self.provider_id = name, provider_id
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
        self._unique_ids = CallIds()
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
            provider_id = event.tool.call_id if event.tool else ""
            name = event.tool.name if event.tool else ""
            call_id = self._unique_ids.assign(index, provider_id)
            self._calls[index], self._call_ids[index] = _Call(name, provider_id), call_id
            chunk: Chunk = {"type": "tool-input-start", "toolCallId": call_id, "toolName": name,
                            "inputEncoding": "json"}
            return [self._with_call_metadata(chunk, index)]
        if kind == "reasoning":
            chunk = {"type": "reasoning-start", "id": event.block.id}
            if event.redacted:
                chunk["providerMetadata"] = {"fanout": {"redacted": True}}
            return [chunk]
        chunk = {"type": "text-start", "id": event.block.id}
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
            reason: str | None = FINISH_REASONS.get(event.finish_reason or "", "other")
        else:
            meta["error"] = msgspec.to_builtins(event.error)
            text = f"{event.status}: {event.error.message}"
            cancelled = event.status == "cancelled"
            chunks.append({"type": "abort", "reason": text} if cancelled else {"type": "error", "errorText": text})
            reason = None if cancelled else "error"
        finish: Chunk = {"type": "finish", **({"finishReason": reason} if reason else {}),
                         "messageMetadata": {"fanout": meta}}
        chunks += [{"type": "finish-step"}, finish]
        return chunks

    def _call_outcome(self, index: int, *, usable: bool) -> Chunk:
        call, call_id = self._calls[index], self._call_ids[index]
        text = "".join(call.parts)
        arguments = parse_arguments(text) if call.closed else None
        if usable and arguments is not None:
            chunk = {"type": "tool-input-available", "toolCallId": call_id, "toolName": call.name, "input": arguments}
        else:
            chunk = {"type": "tool-input-error", "toolCallId": call_id, "toolName": call.name, "input": text,
                     "errorText": UNUSABLE_CALL}
        return self._with_call_metadata(chunk, index)

    def _with_call_metadata(self, chunk: Chunk, index: int) -> Chunk:
        """Add ``providerMetadata.fanout``: the provider's call id when it was replaced, the signature so far."""
        fanout: dict[str, str] = {}
        if CallIds.derived(self._call_ids[index], self._calls[index].provider_id):
            fanout["call_id"] = self._calls[index].provider_id
        signature = self._signatures.get(index)
        if signature:
            fanout["signature"] = "".join(signature)
        if fanout:
            chunk["providerMetadata"] = {"fanout": fanout}
        return chunk
