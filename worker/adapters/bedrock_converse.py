"""Amazon Bedrock ConverseStream adapter: Converse events in, block operations out.

Follows the ConverseStream API (botocore ``data/bedrock-runtime/2023-09-30/service-2.json``,
``ConverseStreamOutput``; UPSTREAMS.md C.4), normalized per PROVIDERS.md section 7.
Each event arrives from :mod:`worker.bedrock_frames` as
``SSEFrame(event=<:event-type>, data=<payload JSON>)``; a ``JSONFrame`` of the wrapped
form ``{"<eventType>": {...}}`` (as SDK fixtures record them) is routed on its one key.
Pure: imports no asyncio, aiohttp, redis or opentelemetry.

Terminal signals. ``messageStop`` proves the end; ``metadata`` (usage) follows it, and
the ``stream.done`` waits for it: it is emitted at ``metadata`` after ``messageStop``,
at ``messageStop`` when ``metadata`` came first, or at a clean end of the body after
``messageStop`` (usage then null):

| ``stopReason`` | status | finish_reason |
| --- | --- | --- |
| ``end_turn``, ``stop_sequence`` | completed | stop (tool_calls with tool calls) |
| ``tool_use`` | completed | tool_calls |
| ``max_tokens``, ``model_context_window_exceeded`` (closes open blocks) | incomplete | length |
| ``guardrail_intervened``, ``content_filtered`` | incomplete | content_filter |
| ``malformed_model_output``, ``malformed_tool_use``, any other value | incomplete | other |

| failure signal | status | category |
| --- | --- | --- |
| an ``exception`` or ``error`` message (``ErrorFrame``) | failed | by type (:data:`worker.bedrock_frames.EXCEPTIONS`) |
| a block still open at the end (stop reason not a token limit) | failed | protocol |
| content after ``messageStop``; a delta that does not fit its block | failed | protocol |
| body ends before ``messageStop``, or inside a message | interrupted | transport |

Blocks, keyed by ``contentBlockIndex`` (PROVIDERS.md 7.4):

* Text and reasoning blocks have no ``contentBlockStart``: the first
  ``contentBlockDelta`` opens them (``text`` → text; ``reasoningContent.text`` →
  reasoning; ``reasoningContent.signature`` → a ``signature`` delta;
  ``reasoningContent.redactedContent`` → reasoning with ``redacted: true``, its
  base64 data as the signature). Empty pieces add nothing; a block that never gets
  content never exists publicly.
* ``contentBlockStart`` with ``start.toolUse`` {``toolUseId``, ``name``} opens a
  tool_call; ``toolUse.input`` deltas are ``json_text`` fragments (``""`` overall is ``{}``).
  Other starts (``toolResult``, ``image``, new kinds) are not blocks in contract v1:
  they, their deltas and stop are counted under ``start.<kind>``.
* ``citation``, ``toolResult``, ``image`` and unknown delta members are counted under
  ``delta.<member>``. A ``contentBlockStop`` for an index never seen is counted.
* ``messageStart`` (role), ``metadata.metrics``/``trace``/``performanceConfig`` and unknown
  events are counted and ignored. Usage: ``metadata.usage`` (bedrock_converse_parts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schema.contract import BlockKind, FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters.base import Adapter, Framing, parse_object
from worker.adapters.bedrock_converse_parts import Stop, block_index, only_key, stop_of, usage_of
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

Payload = dict[str, Any]
Handler = Callable[[Payload], None]


class BedrockConverseAdapter(Adapter):
    """Adapter for one ConverseStream response (see the module docstring)."""

    provider = "bedrock_converse"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "eventstream") -> None:
        super().__init__(normalizer, framing=framing)
        self._stop_reason: str | None = None
        self._metadata = False
        self._skipped: dict[int, str] = {}
        """contentBlockIndex → start kind of blocks that are not contract blocks."""
        self._handlers: dict[str, Handler] = {
            "messageStart": lambda p: self.norm.ignore("messageStart"),
            "contentBlockStart": self._on_block_start,
            "contentBlockDelta": self._on_block_delta,
            "contentBlockStop": self._on_block_stop,
            "messageStop": self._on_message_stop,
            "metadata": self._on_metadata,
        }
        self._deltas: dict[str, Callable[[int, Any], None]] = {
            "text": self._on_text,
            "reasoningContent": self._on_reasoning,
            "toolUse": self._on_tool_input,
        }

    # -- routing ------------------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        if isinstance(frame, SSEFrame) and frame.event != "message":
            name, payload = frame.event, parse_object(frame.data)
        else:
            name, inner = only_key(parse_object(frame.data if isinstance(frame, SSEFrame) else frame.text))
            payload = inner if isinstance(inner, dict) else {}
        if self._stop_reason is not None and name in ("contentBlockStart", "contentBlockDelta"):
            raise UpstreamProtocolError(f"upstream sent {name} after messageStop")
        self._dispatch(self._handlers, name, payload)

    def _finish(self, *, truncated: bool) -> None:
        if self._stop_reason is not None and not truncated:
            self._done()
            return
        self.norm.fail(category="transport", finish_reason=self.finish_seen(),
                       message="upstream closed the connection before messageStop and metadata")

    def finish_seen(self) -> FinishReason | None:
        """Return the mapped ``stopReason`` received so far, if any."""
        if self._stop_reason is None:
            return None
        return self.norm.derive_finish(stop_of(self._stop_reason).finish)

    # -- message ------------------------------------------------------------

    def _on_message_stop(self, payload: Payload) -> None:
        reason = payload.get("stopReason")
        if not isinstance(reason, str) or not reason:
            raise UpstreamProtocolError("upstream sent messageStop without a stopReason")
        if self._stop_reason is not None:
            self.norm.ignore("messageStop.duplicate")
            return
        self._stop_reason = reason
        if self._metadata:
            self._done()

    def _on_metadata(self, payload: Payload) -> None:
        usage = usage_of(payload.get("usage"))
        if usage is not None:
            self.norm.usage = usage
        self._metadata = True
        if self._stop_reason is not None:
            self._done()

    def _done(self) -> None:
        assert self._stop_reason is not None
        stop: Stop = stop_of(self._stop_reason)
        if stop.truncation:
            self.norm.close_all()
        self.norm.done(status=stop.status, finish_reason=stop.finish, provider_finish_reason=self._stop_reason)

    # -- blocks -------------------------------------------------------------

    def _on_block_start(self, payload: Payload) -> None:
        index = block_index(payload, "contentBlockStart")
        if index in self._skipped or self.norm.knows(index):
            raise UpstreamProtocolError(f"upstream reused contentBlockIndex {index}")
        kind, start = only_key(payload.get("start", {}))
        if kind != "toolUse" or not isinstance(start, dict):
            self._skipped[index] = f"start.{kind}"
            self.norm.ignore(self._skipped[index])
            return
        name, call_id = start.get("name"), start.get("toolUseId")
        self.norm.open_block(index, "tool_call", name=name if isinstance(name, str) else "",
                             call_id=call_id if isinstance(call_id, str) and call_id else f"tooluse_fanout_{index}")

    def _on_block_delta(self, payload: Payload) -> None:
        index = block_index(payload, "contentBlockDelta")
        member, value = only_key(payload.get("delta"))
        if index in self._skipped:
            self.norm.ignore(f"{self._skipped[index]}.delta")
            return
        handler = self._deltas.get(member)
        if handler is None:
            self.norm.ignore(f"delta.{member}")
            return
        handler(index, value)

    def _target(self, index: int, kind: BlockKind, *, redacted: bool = False) -> None:
        """Open block ``index`` as ``kind`` if it is new; refuse a delta of another kind."""
        if not self.norm.knows(index):
            if kind == "tool_call":
                raise UpstreamProtocolError(f"upstream sent toolUse input for block {index} it never started")
            self.norm.open_block(index, kind, redacted=redacted)
        elif self.norm.kind_of(index) != kind:
            raise UpstreamProtocolError(f"upstream sent {kind} content for a {self.norm.kind_of(index)} block")

    def _on_text(self, index: int, value: Any) -> None:
        if not isinstance(value, str):
            raise UpstreamProtocolError("upstream sent a text delta that is not a string")
        self._target(index, "text")
        self.norm.delta(index, "text", value)

    def _on_reasoning(self, index: int, value: Any) -> None:
        member, piece = only_key(value)
        if member not in ("text", "signature", "redactedContent"):
            self.norm.ignore(f"reasoningContent.{member}")
            return
        if not isinstance(piece, str):
            raise UpstreamProtocolError(f"upstream sent reasoningContent.{member} that is not a string")
        self._target(index, "reasoning", redacted=member == "redactedContent")
        self.norm.delta(index, "text" if member == "text" else "signature", piece)

    def _on_tool_input(self, index: int, value: Any) -> None:
        piece = value.get("input") if isinstance(value, dict) else None
        if not isinstance(piece, str):
            raise UpstreamProtocolError("upstream sent a toolUse delta without an input string")
        self._target(index, "tool_call")
        self.norm.delta(index, "json_text", piece)

    def _on_block_stop(self, payload: Payload) -> None:
        index = block_index(payload, "contentBlockStop")
        if index in self._skipped:
            self.norm.ignore(f"{self._skipped[index]}.stop")
        elif not self.norm.knows(index):
            self.norm.ignore("contentBlockStop.unknown_index")
        else:
            self.norm.close_block(index)
