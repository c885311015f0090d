"""What the AG-UI tests share: the view a client must hold after a stream (from the reducer), and a Python applier.

:func:`expected_view` derives, from the reducer's assembled result, the messages an AG-UI
client holds after reading a stream, the tool calls it saw end, the outcome and the
usage. :class:`Applied` applies AG-UI events to messages the way ``@ag-ui/client``
1.0.0's ``defaultApplyEvents`` does for the events ``/agui`` sends (the Node suite checks
the real client; this one lets the Python tests compare a snapshot read with the
reducer), and fails on what the client would warn about (a delta for an unknown id).
"""

from __future__ import annotations

import copy
from typing import Any

from schema.contract import Event, StreamStart
from schema.reducer import ReasoningBlock, ToolCallBlock, reduce
from tests.publisher.node_support import unique_call_id


def _usage(events: list[Event], usage: Any, model: str | None) -> list[dict[str, Any]] | None:
    if usage is None:
        return None
    counts = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
              "cachedInputTokens": usage.cached_input_tokens, "reasoningTokens": usage.reasoning_tokens}
    entry = {key: value for key, value in counts.items() if value is not None}
    if not entry:
        return None
    if usage.input_tokens is not None and usage.output_tokens is not None:
        entry["totalTokens"] = usage.input_tokens + usage.output_tokens
    head = events[0]
    assert isinstance(head, StreamStart)
    return [{"provider": head.provider, "model": model or head.model, **entry}]


def expected_view(events: list[Event]) -> dict[str, Any]:
    """What an AG-UI client must hold after reading the stream, from the reducer's assembled result."""
    result = reduce(events)
    sid, messages, used = events[0].stream_id, [], set[str]()
    assistant: dict[str, Any] | None = None
    ended = []
    for block in result.blocks:
        message_id = f"{sid}:{block.index}"
        if isinstance(block, ToolCallBlock):
            if assistant is None:
                assistant = {"id": message_id, "role": "assistant", "content": None, "toolCalls": [],
                             "encryptedValue": None}
                messages.append(assistant)
            call = {"id": unique_call_id(block.call_id, block.index, used), "name": block.name,
                    "arguments": block.arguments_text, "encryptedValue": block.signature}
            assistant["toolCalls"].append(call)
            ended.append(call["id"])
            continue
        role = "reasoning" if isinstance(block, ReasoningBlock) else "assistant"
        message = {"id": message_id, "role": role, "content": block.text, "toolCalls": [],
                   "encryptedValue": block.signature}
        messages.append(message)
        if role == "assistant":
            assistant = message
    completed = result.status == "completed"
    code = None if completed else ("incomplete" if result.status == "incomplete" else result.error.category)
    return {"messages": messages, "ended": ended if completed else [], "outcome": code or "finished",
            "usage": _usage(events, result.usage, result.model)}


class Applied:
    """AG-UI events applied to messages as ``defaultApplyEvents`` applies them (:meth:`view`: the compact shape)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.ended: list[str] = []
        self.outcome: str | None = None
        self.usage: list[dict[str, Any]] | None = None

    def apply(self, events: list[dict[str, Any]]) -> Applied:
        """Apply ``events`` in order; return self."""
        for event in events:
            getattr(self, "_" + event["type"].lower(), lambda _event: None)(event)
        return self

    def view(self) -> dict[str, Any]:
        """The compact view (messages, ended calls, outcome, usage)."""
        messages = [{"id": m["id"], "role": m["role"], "content": m.get("content"),
                     "toolCalls": [_compact_call(c) for c in m.get("toolCalls", [])],
                     "encryptedValue": m.get("encryptedValue")} for m in self.messages]
        return {"messages": messages, "ended": self.ended, "outcome": self.outcome, "usage": self.usage}

    def _find(self, message_id: str) -> dict[str, Any]:
        found = [m for m in self.messages if m["id"] == message_id]
        assert found, f"no message {message_id}"
        return found[0]

    def _call(self, call_id: str) -> dict[str, Any]:
        found = [c for m in self.messages for c in m.get("toolCalls", []) if c["id"] == call_id]
        assert found, f"no tool call {call_id}"
        return found[0]

    def _opened(self, event: dict[str, Any], role: str) -> None:
        if not any(m["id"] == event["messageId"] for m in self.messages):
            self.messages.append({"id": event["messageId"], "role": role, "content": ""})

    def _text_message_start(self, event: dict[str, Any]) -> None:
        self._opened(event, event.get("role", "assistant"))

    def _reasoning_message_start(self, event: dict[str, Any]) -> None:
        self._opened(event, "reasoning")

    def _text_message_content(self, event: dict[str, Any]) -> None:
        message = self._find(event["messageId"])
        message["content"] = (message.get("content") or "") + event["delta"]

    _reasoning_message_content = _text_message_content

    def _tool_call_start(self, event: dict[str, Any]) -> None:
        if any(c["id"] == event["toolCallId"] for m in self.messages for c in m.get("toolCalls", [])):
            return
        parents = [m for m in self.messages if m["id"] == event.get("parentMessageId") and m["role"] == "assistant"]
        if not parents:
            parents = [{"id": event.get("parentMessageId") or event["toolCallId"], "role": "assistant"}]
            self.messages.append(parents[0])
        parents[0].setdefault("toolCalls", []).append(
            {"id": event["toolCallId"], "function": {"name": event["toolCallName"], "arguments": ""}})

    def _tool_call_args(self, event: dict[str, Any]) -> None:
        self._call(event["toolCallId"])["function"]["arguments"] += event["delta"]

    def _tool_call_end(self, event: dict[str, Any]) -> None:
        self._call(event["toolCallId"])
        self.ended.append(event["toolCallId"])

    def _reasoning_encrypted_value(self, event: dict[str, Any]) -> None:
        target = self._call if event["subtype"] == "tool-call" else self._find
        target(event["entityId"])["encryptedValue"] = event["encryptedValue"]

    def _messages_snapshot(self, event: dict[str, Any]) -> None:
        given = {m["id"]: m for m in copy.deepcopy(event["messages"])}  # as the client, which clones what it holds
        kept = [given.get(m["id"], m) for m in self.messages if m["id"] in given]
        held = {m["id"] for m in kept}
        self.messages = [*kept, *(m for m in given.values() if m["id"] not in held)]

    def _run_finished(self, event: dict[str, Any]) -> None:
        self.outcome, self.usage = "finished", event.get("usage")

    def _run_error(self, event: dict[str, Any]) -> None:
        self.outcome, self.usage = event["code"], event.get("usage")


def _compact_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "encryptedValue": call.get("encryptedValue")}
