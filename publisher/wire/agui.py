"""Contract events → AG-UI events, one stream at a time. Pure.

AG-UI (``@ag-ui/core`` / ``@ag-ui/client``, checked at the version pinned in
``tests/node/package.json``, protocol 1.0) reads an agent's answer as a sequence of
events in runs. :class:`AGUITranslator` maps one fanout stream onto **one run**
(``runId`` = the stream id; ``threadId`` = the job metadata's ``thread_id`` when it is a
string, else the stream id):

=========================================  =================================================
contract event                             AG-UI events
=========================================  =================================================
``stream.start``                           ``RUN_STARTED`` (``protocolVersion`` 1.0)
``block.start`` text / refusal             ``TEXT_MESSAGE_START`` (role ``assistant``; a refusal
                                           carries ``metadata.fanout.kind = "refusal"``)
``block.start`` reasoning                  ``REASONING_START`` (span), ``REASONING_MESSAGE_START``
``block.start`` tool_call                  ``TOOL_CALL_START`` (``parentMessageId``: the assistant
                                           message opened last in the stream, else a new one)
``block.delta`` text / json_text           ``TEXT_MESSAGE_CONTENT`` / ``REASONING_MESSAGE_CONTENT`` /
                                           ``TOOL_CALL_ARGS`` by block kind
``block.delta`` signature                  ``REASONING_ENCRYPTED_VALUE`` holding the signature so far
                                           (subtype ``message``, or ``tool-call`` for a call): each
                                           one replaces the last, as AG-UI applies them
``block.stop`` text / reasoning            ``TEXT_MESSAGE_END`` / ``REASONING_MESSAGE_END`` +
                                           ``REASONING_END``
``block.stop`` tool_call                   none yet (see below)
``stream.done`` ``completed``              ``TOOL_CALL_END`` per call, ``RUN_FINISHED`` (``usage``)
``stream.done`` ``incomplete``             ``RUN_ERROR`` ``code: "incomplete"``
``stream.error``                           ``RUN_ERROR`` ``code`` = the error category
=========================================  =================================================

**Tool calls.** AG-UI's ``TOOL_CALL_END`` says a call's arguments are complete, and
nothing in the protocol can take that back. fanout only lets a call run when its block
closed with arguments that parse in a ``completed`` stream (CONTRACT.md, "Terminal
states"), which is known at the end of the stream only. So ``TOOL_CALL_END`` is held
back until ``stream.done`` ``completed``; any other end is a ``RUN_ERROR``, which per
the AG-UI lifecycle ends whatever was still open with the run: a client sees the call
being built (``TOOL_CALL_START``/``ARGS``) but never reads it as complete. Tool call ids
are unique within the run (:class:`publisher.wire.call_ids.CallIds`); a derived id keeps
the provider's in ``metadata.fanout.call_id``.

**Ends.** A cancelled stream is a ``RUN_ERROR`` too, not ``RUN_FINISHED`` with the
cancelled outcome: fanout does not close open blocks on cancel, and AG-UI reserves that
outcome for a producer that closed everything in order. ``usage`` follows AG-UI's
accounting, which is the contract's (cache reads inside ``inputTokens``, reasoning
inside ``outputTokens``); the finish reasons, status, model and response id ride in
``metadata.fanout`` of the final event (AG-UI has no field for them).

Message ids are ``<stream id>:<block index>`` (stream ids are unique, ``:`` never occurs
in one), so several streams can share an AG-UI thread. Unknown event types produce
nothing; visibility (internal reasoning) is the caller's job.

Follows the AG-UI 1.0 specification ("Runs and Steps", "Text messages", "Tool calls",
"Reasoning", "Metadata") and ``@ag-ui/core``'s event types; CONTRACT.md for the events.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from publisher.wire.call_ids import CallIds
from schema.contract import BlockDelta, BlockStart, BlockStop, Event, StreamDone, StreamError, StreamStart, Usage
from schema.reducer import parse_arguments

AGUIEvent = dict[str, Any]
"""One AG-UI event, JSON-ready (``{"type": "TEXT_MESSAGE_CONTENT", "messageId": ..., "delta": ...}``)."""

PROTOCOL_VERSION: Final = "1.0"
"""The AG-UI protocol version ``RUN_STARTED`` declares."""

INCOMPLETE_CODE: Final = "incomplete"
"""``RUN_ERROR.code`` of a stream that ended ``incomplete`` (truncated or filtered)."""


def sse_frame(event: AGUIEvent, event_id: bytes = b"") -> bytes:
    """Return one AG-UI event as ``@ag-ui/encoder`` writes it (``data: <JSON>`` + blank line).

    Args:
        event: The event.
        event_id: The SSE ``id`` to send first (``<seq>.<epoch>``), or empty for none.

    Returns:
        One complete SSE message (UTF-8), ending with a blank line.
    """
    data = b"data: " + msgspec.json.encode(event) + b"\n\n"
    return b"id: " + event_id + b"\n" + data if event_id else data


def token_usage(usage: Usage | None, provider: str, model: str | None) -> list[dict[str, Any]] | None:
    """Return AG-UI's ``usage`` (one ``TokenUsage`` entry) for a contract usage, or ``None`` without counts.

    Args:
        usage: The terminal event's usage (the contract's accounting is AG-UI's: cache
            reads inside ``input_tokens``, reasoning inside ``output_tokens``).
        provider: The ``stream.start`` provider, for the entry's ``provider``.
        model: The model that answered, for the entry's ``model`` (left out when empty).

    Returns:
        ``[entry]`` with the counts the provider reported (an absent count stays absent,
        never 0; ``totalTokens`` only when both totals are known), or ``None``.
    """
    if usage is None:
        return None
    fields = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
              "cachedInputTokens": usage.cached_input_tokens, "reasoningTokens": usage.reasoning_tokens}
    entry: dict[str, Any] = {key: value for key, value in fields.items() if value is not None}
    if not entry:
        return None
    if usage.input_tokens is not None and usage.output_tokens is not None:
        entry["totalTokens"] = usage.input_tokens + usage.output_tokens
    entry = {"provider": provider, **({"model": model} if model else {}), **entry}
    return [entry]


class Block:
    """What the translator knows of one block (also read by :mod:`publisher.wire.agui_snapshot`)."""

    __slots__ = ("call_id", "closed", "kind", "message_id", "name", "parts", "provider_id", "signature", "visibility")

    def __init__(self, kind: str, message_id: str) -> None:
        self.kind, self.message_id = kind, message_id
        self.call_id = self.name = self.provider_id = self.visibility = ""
        self.parts: list[str] = []
        self.signature: list[str] = []
        self.closed = False


class AGUITranslator:
    """Per-response state that turns one stream's events into AG-UI events.

    Feed events in stored order from seq 1; each :meth:`feed` returns the events that
    one produces, possibly none. After a resume, :meth:`reattach` gives what a new
    connection needs before the events that follow its position.
    """

    def __init__(self, *, keep_text: bool = False) -> None:
        self.keep_text = keep_text
        """Keep every block's text so far (for a snapshot); tool call arguments are always kept."""
        self._blocks: dict[int, Block] = {}
        self._call_ids = CallIds()
        self._run: dict[str, str] = {}
        self._provider = self._model = ""
        self._assistant: str | None = None
        self.finished = False
        """A terminal event was translated; nothing more will be produced."""

    def feed(self, event: Event) -> list[AGUIEvent]:
        """Return the AG-UI events for one contract event (empty for events that map to nothing).

        Each carries the event's ``ts`` as its ``timestamp`` (ms since the Unix epoch).
        """
        events = self._translate(event)
        for out in events:
            out.setdefault("timestamp", event.ts)
        return events

    def _translate(self, event: Event) -> list[AGUIEvent]:
        if self.finished:
            return []
        if isinstance(event, StreamStart):
            return [self._started(event)]
        if isinstance(event, BlockStart):
            return self._start(event)
        if isinstance(event, BlockDelta):
            return self._delta(event)
        if isinstance(event, BlockStop):
            return self._stop(event)
        if isinstance(event, StreamDone | StreamError):
            self.finished = True
            return self._end(event)
        return []

    @property
    def blocks(self) -> list[Block]:
        """The blocks seen so far, in the order they started (read-only use: :mod:`publisher.wire.agui_snapshot`)."""
        return list(self._blocks.values())

    def run_started(self) -> list[AGUIEvent]:
        """Return ``RUN_STARTED`` of the run (no timestamp), or nothing before ``stream.start``."""
        return [{"type": "RUN_STARTED", **self._run, "protocolVersion": PROTOCOL_VERSION}] if self._run else []

    def reopen(self, block: Block) -> list[AGUIEvent]:
        """Return the start event(s) of ``block`` again (same ids), as :meth:`reattach` sends them."""
        return [self._call_start(block)] if block.kind == "tool_call" else self._opening(block)

    def reattach(self) -> list[AGUIEvent]:
        """Return ``RUN_STARTED`` and the start of every item still open, for a resumed connection.

        AG-UI clients check each connection as a run of its own; a client that holds the
        run so far applies these idempotently (same ids) and goes on appending.
        """
        if not self._run or self.finished:
            return []
        opened = [self.reopen(b) for b in self._blocks.values() if b.kind == "tool_call" or not b.closed]
        return self.run_started() + [event for events in opened for event in events]

    def _started(self, event: StreamStart) -> AGUIEvent:
        thread = event.metadata.get("thread_id")
        self._run = {"threadId": thread if isinstance(thread, str) and thread else event.stream_id,
                     "runId": event.stream_id}
        self._provider, self._model = event.provider, event.model
        meta = {"fanout": {"stream_id": event.stream_id, "provider": event.provider, "model": event.model}}
        return {"type": "RUN_STARTED", **self._run, "protocolVersion": PROTOCOL_VERSION,
                "timestamp": event.ts, "metadata": meta}

    def _start(self, event: BlockStart) -> list[AGUIEvent]:
        index, kind = event.block.index, event.block.kind
        if index in self._blocks:
            return []
        block = self._blocks[index] = Block(kind, f"{event.stream_id}:{index}")
        if kind == "tool_call":
            block.provider_id = event.tool.call_id if event.tool else ""
            block.name = event.tool.name if event.tool else ""
            block.call_id = self._call_ids.assign(index, block.provider_id)
            if self._assistant is None:
                self._assistant = block.message_id
            block.message_id = self._assistant
            return [self._call_start(block)]
        if kind == "reasoning":
            block.visibility = event.visibility or "public"
        else:
            self._assistant = block.message_id
        return self._opening(block)

    def _opening(self, block: Block) -> list[AGUIEvent]:
        if block.kind == "reasoning":
            meta = {"fanout": {"visibility": block.visibility}}
            return [{"type": "REASONING_START", "messageId": f"{block.message_id}:span"},
                    {"type": "REASONING_MESSAGE_START", "messageId": block.message_id, "role": "reasoning",
                     "metadata": meta}]
        start: AGUIEvent = {"type": "TEXT_MESSAGE_START", "messageId": block.message_id, "role": "assistant"}
        if block.kind == "refusal":
            start["metadata"] = {"fanout": {"kind": "refusal"}}
        return [start]

    def _call_start(self, block: Block) -> AGUIEvent:
        start: AGUIEvent = {"type": "TOOL_CALL_START", "toolCallId": block.call_id, "toolCallName": block.name,
                            "parentMessageId": block.message_id}
        if CallIds.derived(block.call_id, block.provider_id):
            start["metadata"] = {"fanout": {"call_id": block.provider_id}}
        return start

    def _delta(self, event: BlockDelta) -> list[AGUIEvent]:
        block = self._blocks.get(event.block.index)
        if block is None or block.closed:
            return []
        text = event.delta.text
        if event.delta.kind == "signature":
            block.signature.append(text)
            return self._encrypted(block)
        if block.kind == "tool_call":
            block.parts.append(text)
            return [{"type": "TOOL_CALL_ARGS", "toolCallId": block.call_id, "delta": text}]
        if self.keep_text:
            block.parts.append(text)
        name = "REASONING_MESSAGE_CONTENT" if block.kind == "reasoning" else "TEXT_MESSAGE_CONTENT"
        return [{"type": name, "messageId": block.message_id, "delta": text}]

    def _stop(self, event: BlockStop) -> list[AGUIEvent]:
        block = self._blocks.get(event.block.index)
        if block is None or block.closed:
            return []
        block.closed = True
        if block.kind == "tool_call":
            return []
        if block.kind == "reasoning":
            return [{"type": "REASONING_MESSAGE_END", "messageId": block.message_id},
                    {"type": "REASONING_END", "messageId": f"{block.message_id}:span"}]
        return [{"type": "TEXT_MESSAGE_END", "messageId": block.message_id}]

    @staticmethod
    def _encrypted(block: Block) -> list[AGUIEvent]:
        call = block.kind == "tool_call"
        return [{"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call" if call else "message",
                 "entityId": block.call_id if call else block.message_id, "encryptedValue": "".join(block.signature)}]

    def _end(self, event: StreamDone | StreamError) -> list[AGUIEvent]:
        model = (event.model if isinstance(event, StreamDone) else None) or self._model
        usage = token_usage(event.usage, self._provider, model)
        meta: dict[str, Any] = {"status": event.status, "finish_reason": event.finish_reason}
        tail: AGUIEvent = {"timestamp": event.ts, **({"usage": usage} if usage else {})}
        if isinstance(event, StreamError):
            meta["error"] = msgspec.to_builtins(event.error)
            return [{"type": "RUN_ERROR", "message": f"{event.status}: {event.error.message}",
                     "code": event.error.category, **tail, "metadata": {"fanout": meta}}]
        meta.update(provider_finish_reason=event.provider_finish_reason, model=event.model,
                    response_id=event.response_id)
        if event.status != "completed":
            return [{"type": "RUN_ERROR", "code": INCOMPLETE_CODE, **tail, "metadata": {"fanout": meta},
                     "message": f"incomplete: the answer was cut short ({event.finish_reason or 'other'})"}]
        calls = [block for block in self._blocks.values() if block.kind == "tool_call"]
        if any(not block.closed or parse_arguments("".join(block.parts)) is None for block in calls):
            return [{"type": "RUN_ERROR", "code": "protocol", **tail, "metadata": {"fanout": meta},
                     "message": "failed: a tool call's arguments are not a closed JSON object"}]
        ends: list[AGUIEvent] = [{"type": "TOOL_CALL_END", "toolCallId": block.call_id} for block in calls]
        return [*ends, {"type": "RUN_FINISHED", **self._run, **tail, "metadata": {"fanout": meta}}]
