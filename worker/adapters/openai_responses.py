"""OpenAI Responses API (``stream: true``) adapter: payloads in, block operations out.

Follows OpenAI's Responses streaming events (PROVIDERS.md section 3), normalized per
section 7. Events are routed on the payload's ``type``, never on the SSE ``event:`` line
(gateways omit it); the ``event:`` name is used only when a payload has no ``type``, and
an untyped ``{"error": {...}}`` object counts as an ``error`` event. ``sequence_number``
is diagnostic only. Pure: imports no asyncio, aiohttp, redis or opentelemetry.

Terminal signals (the only ones that end a stream here):

================================================  ===========  ==============  ===============
signal                                            status       finish_reason   category
================================================  ===========  ==============  ===============
``response.completed``                            completed    stop, or        -
                                                               tool_calls /
                                                               refusal
``response.incomplete`` ``max_output_tokens``     incomplete   length          -
(open blocks are closed first)
``response.incomplete`` ``content_filter``        incomplete   content_filter  -
``response.incomplete``, other or no reason       incomplete   other           -
completed/incomplete with a block still open      failed       (mapped)        protocol
that the final ``response.output`` does not
settle (not a token limit)
``response.failed`` (``response.error.code``)     failed       null            by code
``error`` event, flat or nested                   failed       null            by code
``response.done`` (Codex-style gateways)          per ``response.status`` as above
``response.cancelled`` / ``response.done``        cancelled    null            cancelled
with status ``cancelled``
body ends before any of the above                 interrupted  null            transport
================================================  ===========  ==============  ===============

``provider_finish_reason`` is ``response.status`` for completed and
``incomplete_details.reason`` (else ``incomplete``) for incomplete. Error code →
category: ``server_error``/``vector_store_timeout`` upstream_error,
``rate_limit_exceeded`` rate_limited, ``invalid_prompt`` invalid_request,
``context_length_exceeded`` context_length_exceeded, image codes invalid_request, the
rest in :data:`~worker.adapters.openai_responses_parts.ERROR_CATEGORIES`, unknown
upstream_error. The provider's error wins over ``protocol`` even with a block open, and
the first fatal signal wins: a ``response.failed`` after an ``error`` changes nothing.

Quirks handled:

* Blocks: items keyed by ``output_index``, message content parts by (``output_index``,
  ``content_index``) (``output_text`` → text, ``refusal`` → refusal); ``reasoning``
  and ``function_call`` items by ``output_index``. ``item_id`` is advisory (relays
  rotate it on every event, vercel/ai PR #18548) and read only when an event has no
  ``output_index`` (PROVIDERS.md 3.5, amended).
  Text, refusal and reasoning blocks open at their first non-empty text (or signature),
  so empty parts and empty reasoning items make no block; a tool_call opens at
  ``output_item.added`` with ``call_id`` = ``item.call_id`` and ``name`` = ``item.name``.
  A delta addressing an item never announced by ``output_item.added`` is
  failed/protocol; a second, different item announced at a known ``output_index`` too.
* A function_call announced without a name keeps its fragments until a name arrives
  (``function_call_arguments.done`` or ``output_item.done``); without a ``call_id`` it
  gets ``call_fanout_<output_index>``.
* ``.done`` values win: ``output_text.done``, ``refusal.done``, ``content_part.done``,
  ``function_call_arguments.done``, summary/reasoning ``.done`` events and
  ``output_item.done`` settle their block (missing tail sent as a last delta; a value
  the streamed text is not a prefix of is failed/protocol).
* Reasoning: summary deltas or raw ``reasoning_text`` deltas (vLLM), one source per item
  (the first seen; the other's events are ignored and counted under their name);
  several parts join into one block, a blank line between non-empty parts
  (:data:`~worker.adapters.openai_responses_blocks.PART_SEPARATOR`); ``encrypted_content``
  from ``output_item.done`` (``.added`` may hold a truncated prefix) is sent as one
  ``signature`` delta before the block closes, opening the block if it had no text.
* Blocks close at ``content_part.done`` / ``output_item.done``. At completed/incomplete
  the final ``response.output`` finishes any item whose ``.done`` events were skipped
  (non-OpenAI servers), and any item it holds that was never announced.
* Finish: completed → ``stop``, derived to ``tool_calls`` with calls, and ``refusal``
  when every non-reasoning block is a refusal.
* Built-in tool items (web/file search, code interpreter, MCP, image generation, custom
  tool input, audio) and their events, annotations and unknown events: ignored, counted
  under their item type or event name. ``keepalive`` events are counted as ``keepalive``.
* ``data: [DONE]`` (some gateways): counted as ``[DONE]`` and never proof of an end.
* ``response.created``/``in_progress``/``queued`` give the response id and model.
* Azure OpenAI: the response's ``content_filters`` (``null`` in progress, filter
  entries at the end) and deltas' ``obfuscation`` are ignored; a blocked completion
  arrives as ``response.incomplete`` with reason ``content_filter`` (UPSTREAMS.md A.4).
* Usage only from the terminal response; null when absent.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from schema.contract import DoneStatus, FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters import openai_responses_parts as parts
from worker.adapters.base import Adapter, Framing, parse_object
from worker.adapters.openai_responses_blocks import ItemBlocks
from worker.adapters.openai_responses_parts import BLOCK_ITEMS, Item, Items, Payload, Source
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

Handler = Callable[[Payload], None]


class OpenAIResponsesAdapter(Adapter):
    """Adapter for one OpenAI Responses streaming response (see the module docstring)."""

    provider = "openai_responses"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        super().__init__(normalizer, framing=framing)
        self._response_id: str | None = None
        self._model: str | None = None
        self._items = Items()
        self._blocks = ItemBlocks(normalizer)
        self._handlers: dict[str, Handler] = {
            **dict.fromkeys(parts.SNAPSHOT_EVENTS, self._on_snapshot),
            "response.output_item.added": self._on_item_added,
            "response.output_item.done": self._on_item_done,
            "response.content_part.added": self._on_part_added,
            "response.content_part.done": self._on_part_done,
            **{name: partial(self._part, part_type=t, field=f) for name, (t, f) in parts.PART_EVENTS.items()},
            "response.function_call_arguments.delta": self._on_arguments_delta,
            "response.function_call_arguments.done": self._on_arguments_done,
            "response.reasoning_summary_part.added": lambda p: None,
            **{name: partial(self._reasoning, source=s, field=f) for name, (s, f) in parts.REASONING_EVENTS.items()},
            **dict.fromkeys(parts.TERMINAL_EVENTS, self._on_terminal),
            "error": self._on_error,
            "keepalive": lambda p: self.norm.ignore("keepalive"),
        }

    # -- routing ------------------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        data = frame.data if isinstance(frame, SSEFrame) else frame.text
        if data.strip() == "[DONE]":
            self.norm.ignore("[DONE]")
            return
        payload = parse_object(data)
        name = payload.get("type")
        if not isinstance(name, str) or not name:
            event = frame.event if isinstance(frame, SSEFrame) and frame.event != "message" else ""
            name = payload["type"] = "error" if not event and isinstance(payload.get("error"), dict) else event
        self._dispatch(self._handlers, name, payload)

    def _finish(self, *, truncated: bool) -> None:
        self.norm.fail(category="transport", message="upstream closed the connection before the response ended")

    # -- items --------------------------------------------------------------

    def _on_item_added(self, payload: Payload) -> None:
        output_index = parts.index(payload, "output_index")
        item = parts.obj(payload.get("item"))
        known = self._items.get(output_index)
        if known is not None:
            if known.kind != parts.item_type(item):
                raise UpstreamProtocolError(f"upstream announced a second item at output_index {output_index}")
            self.norm.ignore("response.output_item.added.duplicate")
            return
        entry = self._items.register(output_index, item)
        if entry.kind == "function_call":
            entry.call_id, entry.name = parts.optional(item.get("call_id")), parts.optional(item.get("name"))
            self._blocks.open_call(entry)
        elif entry.kind not in BLOCK_ITEMS:
            self.norm.ignore(entry.kind)

    def _on_item_done(self, payload: Payload) -> None:
        self._finish_item(parts.index(payload, "output_index"), parts.obj(payload.get("item")))

    def _finish_item(self, output_index: int, item: Payload) -> None:
        entry = self._items.get(output_index) or self._items.register(output_index, item)
        if entry.done:
            self.norm.ignore(f"{entry.kind}.done.duplicate")
            return
        if entry.kind != parts.item_type(item):
            raise UpstreamProtocolError(f"upstream finished a {entry.kind} item as {parts.item_type(item)}")
        finisher = {"message": self._blocks.finish_message, "reasoning": self._blocks.finish_reasoning,
                    "function_call": self._blocks.finish_call}.get(entry.kind)
        if finisher is None:
            self.norm.ignore(f"{entry.kind}.done")
        else:
            finisher(entry, item)
        entry.done = True

    # -- message content parts, arguments, reasoning ------------------------

    def _part_entry(self, payload: Payload, part_type: str) -> tuple[Item, int]:
        entry = self._items.resolve(payload, "message")
        content_index = parts.index(payload, "content_index")
        if content_index in entry.closed_parts:
            raise UpstreamProtocolError(f"upstream sent {payload.get('type')} for a finished content part")
        declared = entry.part_kinds.setdefault(content_index, parts.PART_KINDS[part_type])
        if declared != parts.PART_KINDS[part_type]:
            raise UpstreamProtocolError(f"upstream sent {payload.get('type')} for a {declared} part")
        return entry, content_index

    def _part(self, payload: Payload, part_type: str, field: str) -> None:
        entry, content_index = self._part_entry(payload, part_type)
        value, kind = parts.text(payload.get(field)), parts.PART_KINDS[part_type]
        if field == "delta":
            self._blocks.part_delta(entry, content_index, kind, value)
        else:
            self._blocks.settle_part(entry, content_index, kind, value)

    def _on_part_added(self, payload: Payload) -> None:
        part = parts.obj(payload.get("part"))
        part_type = parts.text(part.get("type"))
        entry = self._items.lookup(payload)
        if entry is not None and entry.kind == "reasoning":
            return
        if part_type not in parts.PART_KINDS:
            self.norm.ignore(part_type or "untyped_part")
            return
        self._part({**payload, "delta": part.get(parts.PART_FIELDS[part_type])}, part_type, "delta")

    def _on_part_done(self, payload: Payload) -> None:
        part = parts.obj(payload.get("part"))
        part_type = parts.text(part.get("type"))
        if part_type == "reasoning_text":
            self._reasoning({**payload, "text": part.get("text")}, "raw", "text")
            return
        if part_type not in parts.PART_KINDS:
            self.norm.ignore(part_type or "untyped_part")
            return
        self._part({**payload, "final": part.get(parts.PART_FIELDS[part_type])}, part_type, "final")
        self._blocks.close_part(*self._part_entry(payload, part_type))

    def _on_arguments_delta(self, payload: Payload) -> None:
        self._blocks.call_delta(self._items.resolve(payload, "function_call"), parts.text(payload.get("delta")))

    def _on_arguments_done(self, payload: Payload) -> None:
        entry = self._items.resolve(payload, "function_call")
        self._blocks.settle_call(entry, payload.get("arguments"), payload.get("name"), None)

    def _reasoning(self, payload: Payload, source: Source, field: str) -> None:
        entry = self._items.resolve(payload, "reasoning")
        if entry.source not in (None, source):
            self.norm.ignore(parts.text(payload.get("type")))
            return
        entry.source = source
        sub = parts.index(payload, "summary_index" if source == "summary" else "content_index", default=0)
        value = parts.obj(payload.get("part")).get("text") if field == "part" else payload.get(field)
        if field == "delta":
            self._blocks.reasoning_delta(entry, sub, parts.text(value))
        elif isinstance(value, str):
            self._blocks.settle_reasoning(entry, sub, value)

    # -- response and terminal ----------------------------------------------

    def _note(self, response: Payload) -> None:
        self._response_id = parts.optional(response.get("id")) or self._response_id
        self._model = parts.optional(response.get("model")) or self._model

    def _on_snapshot(self, payload: Payload) -> None:
        self._note(parts.obj(payload.get("response")))

    def _on_terminal(self, payload: Payload) -> None:
        response = parts.obj(payload.get("response"))
        self._note(response)
        self.norm.usage = parts.usage_of(response.get("usage")) or self.norm.usage
        name = parts.text(payload.get("type"))
        status = parts.TERMINAL_STATUS.get(name) or parts.text(response.get("status"))
        ender = {"completed": self._end_completed, "incomplete": self._end_incomplete,
                 "failed": self._end_failed, "cancelled": self._end_cancelled}.get(status)
        if ender is None:
            raise UpstreamProtocolError(f"upstream sent {name} with status {status or 'missing'}")
        ender(response)

    def _settle_from_output(self, response: Payload) -> None:
        for output_index, value in enumerate(parts.items(response.get("output"))):
            item = parts.obj(value)
            entry = self._items.get(output_index)
            if self.norm.terminal is not None or (entry is not None and entry.done):
                continue
            if entry is not None or parts.item_type(item) in BLOCK_ITEMS:
                self._finish_item(output_index, item)

    def _end_completed(self, response: Payload) -> None:
        self._settle_from_output(response)
        status = parts.optional(response.get("status")) or "completed"
        self._done("completed", self._blocks.completed_finish(), status)

    def _end_incomplete(self, response: Payload) -> None:
        self._settle_from_output(response)
        reason = parts.optional(parts.obj(response.get("incomplete_details")).get("reason"))
        if reason in parts.TRUNCATION_REASONS and self.norm.terminal is None:
            self.norm.close_all()
        self._done("incomplete", parts.INCOMPLETE_FINISH.get(reason or "", "other"), reason or "incomplete")

    def _done(self, status: DoneStatus, finish: FinishReason, provider_finish: str) -> None:
        if self.norm.terminal is None:
            self.norm.done(status=status, finish_reason=finish, provider_finish_reason=provider_finish,
                           response_id=self._response_id, model=self._model)

    def _end_failed(self, response: Payload) -> None:
        self._fail(*parts.error_fields({"error": parts.obj(response.get("error"))}), default="response.failed")

    def _end_cancelled(self, response: Payload) -> None:
        self.norm.fail(category="cancelled", provider_code="cancelled", message="the response was cancelled")

    def _on_error(self, payload: Payload) -> None:
        self._fail(*parts.error_fields(payload), default="an error event")

    def _fail(self, code: str | None, message: str, *, default: str) -> None:
        self.norm.fail(category=parts.category_of(code), retryable=parts.retryable_of(code), provider_code=code,
                       message=message or f"upstream reported {default} ({code or 'no code'})")
