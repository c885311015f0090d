"""Anthropic Messages (``stream: true``) adapter: payloads in, block operations out.

Follows Anthropic's streaming Messages doc and PROVIDERS.md section 4, normalized per
section 7. Events are routed on the payload's ``type``, never on the SSE ``event:``
line (gateways drop those lines); the ``event:`` name is used only when a payload has
no ``type``. Pure: imports no asyncio, aiohttp, redis or opentelemetry.

Terminal signals, the only ones that end a stream here. A normal end is proven by
``message_stop`` after a ``message_delta`` that carried ``stop_reason``:

| ``stop_reason``, then ``message_stop`` | status | finish_reason |
| --- | --- | --- |
| ``end_turn``, ``stop_sequence`` | completed | stop (tool_calls with tool calls) |
| ``tool_use`` | completed | tool_calls |
| ``pause_turn``, ``compaction`` (amended) | completed | pause |
| ``refusal`` | completed | refusal |
| ``max_tokens``, ``model_context_window_exceeded`` (closes open blocks) | incomplete | length |
| any other value | incomplete | other |

| failure signal | status | category |
| --- | --- | --- |
| ``message_stop`` with a block open (stop reason not a token limit) | failed | protocol |
| ``message_stop`` without any ``stop_reason`` | failed | protocol |
| ``message_start`` with a different id while a message is open | failed | protocol |
| ``error`` event | failed | by ``error.type``, below |
| body ends before ``message_stop`` (even after ``message_delta``) | interrupted | transport |

A ``stream.error`` carries the mapped finish_reason when a stop reason came before it.
``error.type`` → category: ``overloaded_error`` upstream_overloaded, ``rate_limit_error``
rate_limited, ``api_error``/``timeout_error`` upstream_error, ``invalid_request_error``
invalid_request (context_length_exceeded when the message says the prompt or context is
too long), ``authentication_error`` authentication, ``permission_error`` and
``billing_error`` permission, ``not_found_error`` not_found, unknown upstream_error.
The first fatal condition wins: a ``message_stop`` after an ``error`` changes nothing.

Quirks handled:

* ``ping`` anywhere, inside an open block too: ignored, counted as ``ping``.
* Blocks keyed by ``index``: ``text`` → text; ``thinking`` → reasoning (``thinking_delta``
  text, ``signature_delta`` → ``signature`` delta); ``redacted_thinking`` → reasoning with
  ``redacted: true`` and its ``data`` as one signature delta; ``tool_use`` → tool_call
  (``input_json_delta`` pieces as ``json_text``). Empty pieces add nothing.
* A text or thinking block that never receives content (some Anthropic-compatible
  proxies open and stop an empty ``text`` block before the thinking block) never exists
  publicly: its ``block.start`` waits for its first content (the normalizer holds it),
  its ``content_block_stop`` then emits nothing, and the contract indexes of the blocks
  that follow close ranks (PROVIDERS.md 7.4). Provider ``index`` values still address
  the blocks, so a delta for that index after its stop is still a protocol failure.
* Values given whole on ``content_block_start`` are not lost: non-empty ``text`` or
  ``thinking`` opens the block's text; a non-empty ``input`` (or thinking ``signature``)
  with no delta of that kind is sent as one delta, serialized once, just before the
  block's stop.
* ``server_tool_use``, ``*_tool_result`` and any other block type are not blocks in
  contract v1: they, their deltas and stops are ignored and counted under the block type.
* ``citations_delta`` and unknown delta types: ignored, counted under the delta type.
* A duplicate ``message_start`` with the same id: ignored (``message_start.duplicate``).
* Claude on Vertex AI (``:streamRawPredict``) streams this same SSE (UPSTREAMS.md B.4).
* Bedrock (InvokeModelWithResponseStream, events arrive as
  :class:`~worker.frames.JSONFrame` from :mod:`worker.bedrock_frames`):
  ``amazon-bedrock-invocationMetrics`` on an event is ignored; a payload holding only
  it is counted under that key, never as an unknown event. Exception frames end the
  stream through :meth:`Adapter.feed` with the mapped stop reason.
* Usage: ``message_start`` is provisional, each ``message_delta`` counter supersedes it.
* A delta whose type does not fit its block (``text_delta`` on a tool call), a delta or
  stop for an unknown or closed index, or a reused index: failed/protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from schema.contract import DeltaKind, FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters.anthropic_parts import (
    DELTA_RULES,
    DeltaRule,
    block_index,
    failure_of,
    merge_usage,
    object_field,
    optional_text,
    stop_of,
    text_of,
    usage_of,
)
from worker.adapters.base import Adapter, Framing, parse_object
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

INVOCATION_METRICS: Final = "amazon-bedrock-invocationMetrics"
"""Key Bedrock adds to the last event of an InvokeModelWithResponseStream body (or sends
alone); its counts repeat the events' own usage, so it is ignored (UPSTREAMS.md C.3)."""

Payload = dict[str, Any]
Handler = Callable[[Payload], None]
Opener = Callable[[int, Payload], None]


class AnthropicAdapter(Adapter):
    """Adapter for one Anthropic Messages streaming response (see the module docstring)."""

    provider = "anthropic"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        super().__init__(normalizer, framing=framing)
        self._started = False
        self._message_id: str | None = None
        self._model: str | None = None
        self._stop_reason: str | None = None
        self._raw_usage: dict[str, int] = {}
        self._skipped: dict[int, str] = {}
        """Index → type of blocks that are not contract blocks (server tools, unknown)."""
        self._pending: dict[int, tuple[DeltaKind, str]] = {}
        """Index → a whole value from ``content_block_start``, sent before the stop."""
        self._handlers: dict[str, Handler] = {
            "message_start": self._on_message_start,
            "content_block_start": self._on_block_start,
            "content_block_delta": self._on_block_delta,
            "content_block_stop": self._on_block_stop,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
            "error": self._on_error,
            "ping": self._on_ping,
        }
        self._openers: dict[str, Opener] = {
            "text": self._open_text,
            "thinking": self._open_thinking,
            "redacted_thinking": self._open_redacted,
            "tool_use": self._open_tool_use,
        }

    # -- routing ------------------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        payload = parse_object(frame.data if isinstance(frame, SSEFrame) else frame.text)
        name = payload.get("type")
        if not isinstance(name, str) or not name:
            name = frame.event if isinstance(frame, SSEFrame) and frame.event != "message" else ""
        if not name and INVOCATION_METRICS in payload:
            name = INVOCATION_METRICS  # Bedrock's metrics-only trailer: counted under its key
        self._dispatch(self._handlers, name, payload)

    def _finish(self, *, truncated: bool) -> None:
        self.norm.fail(
            category="transport", finish_reason=self._finish_reason(),
            message="upstream closed the connection before message_stop",
        )

    def finish_seen(self) -> FinishReason | None:
        """Return the mapped ``stop_reason`` received so far (carried by a framing error)."""
        return self._finish_reason()

    def _finish_reason(self) -> FinishReason | None:
        if self._stop_reason is None:
            return None
        return self.norm.derive_finish(stop_of(self._stop_reason).finish)

    # -- message ------------------------------------------------------------

    def _on_message_start(self, payload: Payload) -> None:
        message = object_field(payload, "message")
        message_id = optional_text(message.get("id"))
        if self._started:
            if message_id != self._message_id:
                raise UpstreamProtocolError("a message_start with another id arrived mid-message")
            self.norm.ignore("message_start.duplicate")
            return
        self._started = True
        self._message_id, self._model = message_id, optional_text(message.get("model"))
        self._report_usage(message.get("usage"))

    def _on_message_delta(self, payload: Payload) -> None:
        delta = payload.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if isinstance(reason, str) and reason:
            self._stop_reason = reason
        self._report_usage(payload.get("usage"))

    def _report_usage(self, report: object) -> None:
        if isinstance(report, dict):
            merge_usage(self._raw_usage, report)
            self.norm.usage = usage_of(self._raw_usage)

    def _on_message_stop(self, payload: Payload) -> None:
        if self._stop_reason is None:
            raise UpstreamProtocolError("upstream sent message_stop without a stop_reason")
        stop = stop_of(self._stop_reason)
        if stop.truncation:
            for key in self.norm.open_keys:
                assert isinstance(key, int)
                self._flush(key)
                self.norm.close_block(key)
        self.norm.done(
            status=stop.status, finish_reason=stop.finish, provider_finish_reason=self._stop_reason,
            response_id=self._message_id, model=self._model,
        )

    def _on_error(self, payload: Payload) -> None:
        error = payload.get("error")
        error = error if isinstance(error, dict) else {}
        code = optional_text(error.get("type"))
        message = text_of(error.get("message")) or f"upstream sent an error ({code or 'no type'})"
        failure = failure_of(code, message)
        self.norm.fail(
            category=failure.category, retryable=failure.retryable, provider_code=code,
            message=message, finish_reason=self._finish_reason(),
        )

    def _on_ping(self, payload: Payload) -> None:
        self.norm.ignore("ping")

    # -- blocks -------------------------------------------------------------

    def _on_block_start(self, payload: Payload) -> None:
        index = block_index(payload)
        block = object_field(payload, "content_block")
        if index in self._skipped or self.norm.knows(index):
            raise UpstreamProtocolError(f"upstream reused content block index {index}")
        block_type = text_of(block.get("type"))
        opener = self._openers.get(block_type)
        if opener is None:
            self._skipped[index] = block_type or "untyped_block"
            self.norm.ignore(self._skipped[index])
            return
        opener(index, block)

    def _open_text(self, index: int, block: Payload) -> None:
        self.norm.open_block(index, "text")
        self.norm.delta(index, "text", text_of(block.get("text")))

    def _open_thinking(self, index: int, block: Payload) -> None:
        self.norm.open_block(index, "reasoning")
        self.norm.delta(index, "text", text_of(block.get("thinking")))
        self._hold(index, "signature", text_of(block.get("signature")))

    def _open_redacted(self, index: int, block: Payload) -> None:
        self.norm.open_block(index, "reasoning", redacted=True)
        self.norm.delta(index, "signature", text_of(block.get("data")))

    def _open_tool_use(self, index: int, block: Payload) -> None:
        call_id = text_of(block.get("id")) or f"toolu_fanout_{index}"
        self.norm.open_block(index, "tool_call", call_id=call_id, name=text_of(block.get("name")))
        given = block.get("input")
        if isinstance(given, dict) and given:
            self._hold(index, "json_text", msgspec.json.encode(given).decode())

    def _hold(self, index: int, kind: DeltaKind, text: str) -> None:
        if text:
            self._pending[index] = (kind, text)

    def _on_block_delta(self, payload: Payload) -> None:
        index = block_index(payload)
        delta = object_field(payload, "delta")
        delta_type = text_of(delta.get("type")) or "untyped_delta"
        rule = DELTA_RULES.get(delta_type)
        if index in self._skipped:
            self.norm.ignore(f"{self._skipped[index]}.delta")
            return
        if rule is None:
            self.norm.ignore(delta_type)
            return
        text = delta.get(rule.field)
        if not isinstance(text, str):
            raise UpstreamProtocolError(f"upstream sent {delta_type} without a {rule.field} string")
        self._check_target(index, delta_type, rule)
        pending = self._pending.get(index)
        if text and pending is not None and pending[0] == rule.kind:
            del self._pending[index]
        self.norm.delta(index, rule.kind, text)

    def _check_target(self, index: int, delta_type: str, rule: DeltaRule) -> None:
        """Raise unless block ``index`` is open and of a kind ``delta_type`` may address."""
        if not self.norm.is_open(index):
            state = "a closed" if self.norm.knows(index) else "an unknown"
            raise UpstreamProtocolError(f"upstream sent {delta_type} for {state} block index {index}")
        kind = self.norm.kind_of(index)
        if kind not in rule.blocks:
            raise UpstreamProtocolError(f"upstream sent {delta_type} for a {kind} block")

    def _on_block_stop(self, payload: Payload) -> None:
        index = block_index(payload)
        if index in self._skipped:
            self.norm.ignore(f"{self._skipped[index]}.stop")
            return
        self._flush(index)
        self.norm.close_block(index)

    def _flush(self, index: int) -> None:
        pending = self._pending.pop(index, None)
        if pending is not None and self.norm.is_open(index):
            self.norm.delta(index, *pending)
