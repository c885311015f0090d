"""AG-UI's ``MESSAGES_SNAPSHOT`` of a stream so far, for ``/agui?snapshot=1``. Pure.

A client that asks for a snapshot gets, instead of the events up to a seq ``p``, what
:func:`snapshot_events` builds from the translator's state at ``p``: ``RUN_STARTED``, one
``MESSAGES_SNAPSHOT`` holding the messages assembled so far, then whatever the events
after ``p`` continue (AG-UI applies a delta to the message or tool call that holds the
same id, wherever it came from):

- text, refusal and reasoning blocks are messages with their text so far (role
  ``assistant``, or ``reasoning`` with ``@ag-ui/core`` 1.0.0's ``ReasoningMessage``), their
  signature as ``encryptedValue``, and the live route's ``metadata.fanout``; an open one is
  started again after the snapshot (same id: the client finds it and appends);
- a tool call is in the snapshot only when it is complete (its block closed in a
  ``completed`` stream: the terminal at ``p`` is ``RUN_FINISHED``), the rule of the live
  route (:mod:`publisher.wire.agui`), since AG-UI has no way to say that a call in a
  snapshot is still being built. Any other call follows the snapshot as
  ``TOOL_CALL_START``, one ``TOOL_CALL_ARGS`` with its arguments so far and its
  signature; a call that opened its own assistant message (no text before it) has that
  message, empty, in the snapshot, so the messages keep their order.

Follows the AG-UI 1.0 specification ("State management: MESSAGES_SNAPSHOT") and
``@ag-ui/client`` 1.0.0's ``defaultApplyEvents``.
"""

from __future__ import annotations

from typing import Any

from publisher.wire.agui import AGUIEvent, AGUITranslator, Block
from publisher.wire.call_ids import CallIds


def snapshot_events(translator: AGUITranslator, terminal: list[AGUIEvent]) -> tuple[list[AGUIEvent], int]:
    """Return what replaces the events up to the translator's position, and the index of the snapshot.

    Args:
        translator: The translator (made with ``keep_text``), fed every visible event up to
            and including ``p``.
        terminal: What the event at ``p`` produced when it was the terminal one (its
            ``TOOL_CALL_END`` events and ``RUN_FINISHED``/``RUN_ERROR``), else empty.

    Returns:
        (``RUN_STARTED``, ``MESSAGES_SNAPSHOT``, the starts of what is still open, the
        terminal event if any; the ``MESSAGES_SNAPSHOT``'s index in it), or ``([], -1)``
        before ``stream.start``.
    """
    head = translator.run_started()
    if not head:
        return [], -1
    complete = any(event["type"] == "RUN_FINISHED" for event in terminal)
    messages: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    tail: list[AGUIEvent] = []
    for block in translator.blocks:
        if block.kind != "tool_call":
            by_id[block.message_id] = _message(block)
            messages.append(by_id[block.message_id])
            if not block.closed and not terminal:
                tail += translator.reopen(block)
            continue
        parent = by_id.get(block.message_id)
        if parent is None:
            parent = by_id[block.message_id] = {"id": block.message_id, "role": "assistant"}
            messages.append(parent)
        if complete:
            parent.setdefault("toolCalls", []).append(_call(block))
        else:
            tail += _rebuild_call(translator, block)
    ends = [event for event in terminal if event["type"] != "TOOL_CALL_END"]
    return [*head, {"type": "MESSAGES_SNAPSHOT", "messages": messages}, *tail, *ends], len(head)


def _message(block: Block) -> dict[str, Any]:
    role = "reasoning" if block.kind == "reasoning" else "assistant"
    message: dict[str, Any] = {"id": block.message_id, "role": role, "content": "".join(block.parts)}
    if block.signature:
        message["encryptedValue"] = "".join(block.signature)
    if block.kind == "reasoning":
        message["metadata"] = {"fanout": {"visibility": block.visibility}}
    elif block.kind == "refusal":
        message["metadata"] = {"fanout": {"kind": "refusal"}}
    return message


def _call(block: Block) -> dict[str, Any]:
    call: dict[str, Any] = {"id": block.call_id, "type": "function",
                            "function": {"name": block.name, "arguments": "".join(block.parts)}}
    if block.signature:
        call["encryptedValue"] = "".join(block.signature)
    if CallIds.derived(block.call_id, block.provider_id):
        call["metadata"] = {"fanout": {"call_id": block.provider_id}}
    return call


def _rebuild_call(translator: AGUITranslator, block: Block) -> list[AGUIEvent]:
    events = translator.reopen(block)
    if block.parts:
        events.append({"type": "TOOL_CALL_ARGS", "toolCallId": block.call_id, "delta": "".join(block.parts)})
    if block.signature:
        events.append({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call", "entityId": block.call_id,
                       "encryptedValue": "".join(block.signature)})
    return events
