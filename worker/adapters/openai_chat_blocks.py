"""Blocks of the OpenAI Chat Completions adapter: one open block at a time, tool calls assembled.

One job: :class:`ChatBlocks` turns a chunk's reasoning, content and refusal runs and its
tool-call fragments into block operations. Chat has no block-end signal, so at most one
block is open and opening the next closes it; runs of one kind merge; a tool call opens
once its name is known, with the fragments held until then (:class:`ToolCall`).
Routing and terminal signals are :mod:`worker.adapters.openai_chat`; field readers
:mod:`worker.adapters.openai_chat_parts`. Follows PROVIDERS.md 2.4 and 2.5. Pure:
imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from schema.contract import BlockKind, DeltaKind
from schema.errors import UpstreamProtocolError
from worker.adapters.openai_chat_parts import arguments_text, nonempty, thought_signature
from worker.normalizer import Normalizer

Payload = dict[str, Any]


class ToolCall:
    """One tool call being assembled at a fragment index (PROVIDERS.md 2.4)."""

    __slots__ = ("call_id", "key", "name", "pending")

    def __init__(self, call_id: str | None) -> None:
        self.call_id = call_id
        """The provider's id, or a generated one once the block opens."""
        self.name: str | None = None
        """The function name; the first non-empty one wins (repeats are never appended)."""
        self.key: Hashable | None = None
        """The normalizer's block key once the block is open (a name arrived)."""
        self.pending: list[tuple[DeltaKind, str]] = []
        """Pieces received while no name is known, sent in order once the block opens."""


class ChatBlocks:
    """The block operations of one Chat response (see the module docstring).

    Args:
        norm: The stream's normalizer.
    """

    def __init__(self, norm: Normalizer) -> None:
        self.norm = norm
        self._current: Hashable | None = None
        """Key of the block opened last (it may have been closed since)."""
        self._current_kind: BlockKind | None = None
        self._serial = 0
        self._calls: dict[Hashable, ToolCall] = {}
        """Fragment slot (``index``, position, or ``function_call``) → the call assembled there."""

    def open_next(self, kind: BlockKind, *, call_id: str | None = None, name: str | None = None) -> Hashable:
        """Close the open block and open the next one; return its key."""
        if self._current is not None and self.norm.is_open(self._current):
            self.norm.close_block(self._current)
        self._serial += 1
        key = (kind, self._serial)
        self.norm.open_block(key, kind, call_id=call_id, name=name)
        self._current, self._current_kind = key, kind
        return key

    def run(self, kind: BlockKind, text: str) -> None:
        """Append ``text`` to the open block of ``kind``, or open the next block for it (empty adds nothing)."""
        if not text:
            return
        if self._current_kind != kind or self._current is None:
            self.open_next(kind)
        self.norm.delta(self._current, "text", text)

    def reasoning_signature(self, signature: str) -> None:
        """Put Copilot's ``reasoning_opaque`` on the current reasoning block.

        When no reasoning run is current (Gemini models on Copilot may send it with a
        tool call and no reasoning text), it opens a reasoning block holding only the
        signature, as a Responses reasoning item with an empty summary does.
        """
        if not signature:
            return
        if self._current_kind != "reasoning" or self._current is None:
            self.open_next("reasoning")
        self.norm.delta(self._current, "signature", signature)

    def tool_calls(self, fragments: Any) -> None:
        """Take a delta's ``tool_calls`` fragments, each keyed by its ``index`` (else its position).

        Raises:
            UpstreamProtocolError: Not a list of objects, arguments neither text nor an
                object, or a replaced call that never got its name.
        """
        if fragments is None:
            return
        if not isinstance(fragments, list) or not all(isinstance(f, dict) for f in fragments):
            raise UpstreamProtocolError("upstream sent tool_calls that are not a list of objects")
        for position, fragment in enumerate(fragments):
            index = fragment.get("index")
            self.fragment(index if isinstance(index, int) else position, fragment)

    def fragment(self, slot: Hashable, fragment: Payload) -> None:
        """Add one fragment to the call at ``slot`` (a new id there starts a new call); open it once named.

        Raises:
            UpstreamProtocolError: As :meth:`tool_calls`.
        """
        call_id = nonempty(fragment.get("id"))
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        call = self._calls.get(slot)
        if call is None or (call_id and call.call_id and call_id != call.call_id):
            self._retire(call)
            call = self._calls[slot] = ToolCall(call_id)
        call.call_id = call.call_id or call_id
        call.name = call.name or nonempty(function.get("name"))
        call.pending.append(("json_text", arguments_text(function.get("arguments"))))
        call.pending.append(("signature", thought_signature(fragment)))
        if call.key is None and call.name is not None:
            call.call_id = call.call_id or f"call_fanout_{self.norm.block_count}"
            call.key = self.open_next("tool_call", call_id=call.call_id, name=call.name)
        if call.key is not None:
            for kind, piece in call.pending:
                self.norm.delta(call.key, kind, piece)
            call.pending.clear()

    @staticmethod
    def _retire(call: ToolCall | None) -> None:
        """Drop a call replaced at its index; one with arguments but no name is a violation."""
        if call is not None and call.key is None and any(piece for _, piece in call.pending):
            raise UpstreamProtocolError("upstream sent tool call arguments but never the call's name")

    def check_calls_named(self) -> None:
        """Check, at ``[DONE]``, that every call that got arguments got a name.

        Raises:
            UpstreamProtocolError: One did not.
        """
        for call in self._calls.values():
            self._retire(call)
