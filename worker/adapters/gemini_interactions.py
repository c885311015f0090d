"""Gemini Interactions API (``stream: true``) adapter: ``step.*`` events in, block operations out.

Reads the event set of ``Api-Revision`` :data:`~worker.adapters.gemini_interactions_parts.API_REVISION`
(UPSTREAMS.md E.3; python-genai ``google/genai/_gaos/types/interactions``), normalized per
PROVIDERS.md section 7. Events are routed on the payload's ``event_type``; the SSE ``event:``
name only when a payload has none. Every event may carry an opaque ``event_id``: the last one
dispatched is :attr:`GeminiInteractionsAdapter.last_event_id`, the cursor of a re-attach
(``GET .../interactions/{id}?stream=true&last_event_id=...``). Pure: imports no asyncio,
aiohttp, redis or opentelemetry.

Terminal signals:

=========================================================  ===========  ==============  ==============
signal                                                     status       finish_reason   category
=========================================================  ===========  ==============  ==============
``interaction.completed``, ``interaction.status``          completed    stop /          -
``completed``                                                           tool_calls
``interaction.completed``, ``requires_action``             completed    tool_calls      -
``interaction.completed``, ``incomplete`` (open blocks     incomplete   length          -
closed first)
``interaction.completed``, ``budget_exceeded``             incomplete   other           -
``interaction.completed``, ``failed`` (its ``error``)      failed       null            by code
``interaction.completed`` or ``interaction.status_update``  cancelled    null            cancelled
with ``cancelled``
``interaction.status_update`` ``failed``                   failed       null            upstream_error
``error`` event (``{code, message}``; a block reason as     failed       null            by code /
code is ``content_filter``)                                                             content_filter
a completed end with a step still open                     failed       (mapped)        protocol
body ends before any of the above                          interrupted  null            transport
=========================================================  ===========  ==============  ==============

Quirks handled (decisions where the sources are silent marked *):

* Steps by ``index``: ``model_output`` → text, ``thought`` → reasoning, ``function_call`` →
  tool_call (``call_id`` = ``step.id``, else ``call_<index>``; ``name`` = ``step.name``).
  Text and reasoning blocks open at their first content, so an empty step makes no block.
  Other steps (``function_result``, built-in tool calls and results) are counted as
  ``step:<type>`` and their deltas ignored.
* ``step.delta``: ``text`` → text, ``thought_summary`` (``content.text``) → reasoning text,
  ``thought_signature`` → a ``signature`` delta of the step's block, ``arguments_delta`` →
  ``json_text`` fragments. A delta type that does not fit its step, or a delta/stop for an
  index never started, is failed/protocol; other delta types (annotations, images, audio)
  are counted under their type.
* *A ``function_call`` step that streams no ``arguments_delta`` gets its ``step.arguments``
  (``{}`` when absent) as one ``json_text`` delta at ``step.stop``. The step's
  ``signature`` rides as a ``signature`` delta right after its start.
* ``step.stop`` closes the block; its cumulative ``usage`` is the latest usage, as is
  ``interaction.usage`` on the final event.
* ``interaction.created`` gives the interaction id (``response_id``) and ``model``.
  ``interaction.status_update`` other than the ends above is counted under its status.
* ``data: [DONE]`` (the SDK's sentinel) is counted and proves nothing: the terminal is
  ``interaction.completed`` or ``error``.
* *The final interaction's ``outputs`` are not read (emptied in this revision; the deltas
  are the content).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from schema.contract import BlockKind
from schema.errors import UpstreamProtocolError
from worker.adapters import gemini_interactions_parts as parts
from worker.adapters.base import Adapter, Framing, parse_object
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

Payload = dict[str, Any]


class GeminiInteractionsAdapter(Adapter):
    """Adapter for one Gemini Interactions stream (see the module docstring)."""

    provider = "gemini_interactions"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        super().__init__(normalizer, framing=framing)
        self.interaction_id: str | None = None
        """The provider's interaction id once an event named it."""
        self.last_event_id: str | None = None
        """The ``event_id`` of the last event dispatched (the re-attach cursor)."""
        self._model: str | None = None
        self._steps: dict[int, tuple[str, Payload]] = {}
        self._handlers: dict[str, Callable[[Payload], None]] = {
            "interaction.created": self._on_created,
            "interaction.status_update": self._on_status,
            "step.start": self._on_step_start,
            "step.delta": self._on_step_delta,
            "step.stop": self._on_step_stop,
            "interaction.completed": self._on_completed,
            "error": self._on_error,
        }

    # -- routing ------------------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        data = frame.data if isinstance(frame, SSEFrame) else frame.text
        if data.strip() == "[DONE]":
            self.norm.ignore("[DONE]")
            return
        payload = parse_object(data)
        name = payload.get("event_type")
        if not isinstance(name, str) or not name:
            event = frame.event if isinstance(frame, SSEFrame) and frame.event != "message" else ""
            name = "error" if not event and isinstance(payload.get("error"), dict) else event
        self._dispatch(self._handlers, name, payload)

    def _dispatch(self, handlers: Mapping[str, Callable[[Payload], None]], name: str, payload: Payload) -> None:
        super()._dispatch(handlers, name, payload)
        event_id = payload.get("event_id")
        if isinstance(event_id, str) and event_id:
            self.last_event_id = event_id

    # -- interaction --------------------------------------------------------

    def _note(self, interaction: Payload) -> None:
        self.interaction_id = parts.text(interaction.get("id")) or self.interaction_id
        self._model = parts.text(interaction.get("model")) or self._model

    def _on_created(self, payload: Payload) -> None:
        self._note(parts.obj(payload.get("interaction")))

    def _on_status(self, payload: Payload) -> None:
        self.interaction_id = parts.text(payload.get("interaction_id")) or self.interaction_id
        status = parts.text(payload.get("status"))
        if status == "cancelled":
            self.norm.fail(category="cancelled", provider_code="cancelled", message="the interaction was cancelled")
        elif status == "failed":
            self.norm.fail(category="upstream_error", provider_code="failed", message="the interaction failed")
        else:
            self.norm.ignore(f"status:{status or 'missing'}")

    # -- steps --------------------------------------------------------------

    def _on_step_start(self, payload: Payload) -> None:
        index, step = self._index(payload), parts.obj(payload.get("step"))
        if index in self._steps:
            raise UpstreamProtocolError(f"upstream started step {index} twice")
        kind = parts.text(step.get("type"))
        self._steps[index] = (kind, step)
        block = parts.BLOCK_STEPS.get(kind)
        if block is None:
            self.norm.ignore(f"step:{kind or 'untyped'}")
            return
        call_id = parts.text(step.get("id")) or f"call_{index}" if block == "tool_call" else None
        name = parts.text(step.get("name")) if block == "tool_call" else None
        self.norm.open_block(index, block, call_id=call_id, name=name)
        self.norm.delta(index, "signature", parts.text(step.get("signature")))

    def _block_of(self, payload: Payload) -> tuple[int, BlockKind | None]:
        index = self._index(payload)
        if index not in self._steps:
            raise UpstreamProtocolError(f"upstream sent {payload.get('event_type')} for step {index} never started")
        return index, parts.BLOCK_STEPS.get(self._steps[index][0])

    def _on_step_delta(self, payload: Payload) -> None:
        index, block = self._block_of(payload)
        delta = parts.obj(payload.get("delta"))
        kind = parts.text(delta.get("type"))
        if block is None:
            self.norm.ignore(f"delta:{kind or 'untyped'}")
            return
        if kind == parts.SIGNATURE_DELTA:
            self.norm.delta(index, "signature", parts.text(delta.get("signature")))
            return
        if kind not in parts.DELTA_FIELDS:
            self.norm.ignore(f"delta:{kind or 'untyped'}")
            return
        wanted, field = parts.DELTA_FIELDS[kind]
        if wanted != block:
            raise UpstreamProtocolError(f"upstream sent a {kind} delta for a {block} step")
        value = delta.get(field)
        fragment = parts.text(parts.obj(value).get("text")) if kind == "thought_summary" else parts.text(value)
        self.norm.delta(index, "json_text" if block == "tool_call" else "text", fragment)

    def _on_step_stop(self, payload: Payload) -> None:
        index, block = self._block_of(payload)
        self.norm.usage = parts.usage_of(payload.get("usage")) or self.norm.usage
        if block is None:
            return
        if block == "tool_call" and self.norm.is_open(index) and not self.norm.text_of(index, "json_text"):
            arguments = self._steps[index][1].get("arguments")
            self.norm.delta(index, "json_text", msgspec.json.encode(parts.obj(arguments)).decode())
        if self.norm.terminal is None:
            self.norm.close_block(index)

    @staticmethod
    def _index(payload: Payload) -> int:
        index = payload.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UpstreamProtocolError(f"upstream sent {payload.get('event_type')} without a step index")
        return index

    # -- terminal -----------------------------------------------------------

    def _on_completed(self, payload: Payload) -> None:
        interaction = parts.obj(payload.get("interaction"))
        self._note(interaction)
        self.norm.usage = parts.usage_of(interaction.get("usage")) or self.norm.usage
        status = parts.text(interaction.get("status"))
        if status in ("failed", "cancelled"):
            error = interaction.get("error")
            if status == "failed" and isinstance(error, dict):
                self._on_error({"error": error})
                return
            self._on_status({"status": status})
            return
        if status not in parts.FINAL_STATUS:
            raise UpstreamProtocolError(f"upstream completed the interaction with status {status or 'missing'}")
        done, finish = parts.FINAL_STATUS[status]
        if finish == "length":
            self.norm.close_all()
        self.norm.done(status=done, finish_reason=finish, provider_finish_reason=status,
                       response_id=self.interaction_id, model=self._model)

    def _on_error(self, payload: Payload) -> None:
        category, code, message = parts.interactions_error(payload.get("error"))
        self.norm.fail(category=category, provider_code=code, message=message)
