"""Blocks of the Gemini adapter: which block each content part goes to, and its signature.

One job: :class:`PartBlocks` turns ``text`` and ``functionCall`` parts into block
operations: consecutive parts of one kind merge into a run and a change of kind closes
it; each call is its own ``tool_call`` block (a Vertex streamed call stays open until its
last ``partialArgs``, :class:`~worker.adapters.gemini_parts.StreamedArgs`); a
``thoughtSignature`` rides on its part's block, a signed part never merges into a signed
block, and a signature of an empty part goes to the open block or is counted and dropped.
Routing, candidates and terminal signals are :mod:`worker.adapters.gemini`. Follows
PROVIDERS.md 5.2 and 5.4. Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Any

from schema.contract import BlockKind
from schema.errors import UpstreamProtocolError
from worker.adapters.gemini_parts import StreamedArgs, args_text, as_list, signature_of
from worker.normalizer import Normalizer


class PartBlocks:
    """The blocks of one Gemini response (see the module docstring).

    Args:
        norm: The stream's normalizer.
    """

    def __init__(self, norm: Normalizer) -> None:
        self.norm = norm
        self.open_run: tuple[int, BlockKind] | None = None
        """The open text or reasoning block (key, kind); keys are contract indexes."""
        self.streamed: tuple[int, StreamedArgs] | None = None
        """The open Vertex streamed function call (key, its arguments so far)."""
        self._signed: set[int] = set()
        """Keys of the blocks that carry a signature."""

    def text(self, part: dict[str, Any]) -> None:
        """Add a ``text`` part (``thought: true``: reasoning) to its run, with its signature.

        Raises:
            UpstreamProtocolError: The text is not a string, or comes inside a streamed call.
        """
        text, signature = part["text"], signature_of(part)
        if not isinstance(text, str):
            raise UpstreamProtocolError("upstream sent a text part whose text is not a string")
        if text == "":
            if signature:
                self.loose_signature(signature)
            return
        if self.streamed is not None:
            raise UpstreamProtocolError("upstream sent text inside a streamed function call")
        key = self._run_block("reasoning" if part.get("thought") is True else "text", signed=bool(signature))
        self.norm.delta(key, "text", text)
        if signature:
            self._sign(key, signature)

    def _run_block(self, kind: BlockKind, *, signed: bool) -> int:
        """Return the open block of ``kind`` to merge into, or open a new one."""
        if self.open_run is not None and self.open_run[1] == kind and not (signed and self.open_run[0] in self._signed):
            return self.open_run[0]
        self.close_open()
        key = self.norm.block_count
        self.norm.open_block(key, kind)
        self.open_run = (key, kind)
        return key

    def close_open(self) -> None:
        """Close the open text or reasoning block, if any."""
        if self.open_run is not None:
            self.norm.close_block(self.open_run[0])
            self.open_run = None

    # -- signatures ---------------------------------------------------------

    def _sign(self, key: int, signature: str) -> None:
        self.norm.delta(key, "signature", signature)
        self._signed.add(key)

    def loose_signature(self, signature: str) -> None:
        """Put a signature from an empty part on the open block (never create one)."""
        key = self.streamed[0] if self.streamed else (self.open_run[0] if self.open_run else None)
        if key is None or key in self._signed:
            self.norm.ignore("thoughtSignature_without_block")
        else:
            self._sign(key, signature)

    # -- function calls -----------------------------------------------------

    def call(self, part: dict[str, Any]) -> None:
        """Add a ``functionCall`` part: a whole call, the start of a streamed one, or its continuation.

        Raises:
            UpstreamProtocolError: Not an object, without a name, a second call inside a
                streamed one, or bad ``partialArgs``.
        """
        call, signature = part["functionCall"], signature_of(part)
        if not isinstance(call, dict):
            raise UpstreamProtocolError("upstream sent a functionCall that is not an object")
        if self.streamed is not None:
            self._continue_call(call, signature)
            return
        name = call.get("name")
        if not isinstance(name, str) or not name:
            self._nameless_call(call)
            return
        self.close_open()
        key = self.norm.block_count
        call_id = call.get("id")
        self.norm.open_block(key, "tool_call", name=name,
                             call_id=call_id if isinstance(call_id, str) and call_id else f"call_{key}")
        if signature:
            self._sign(key, signature)
        if call.get("willContinue") is True:
            self.streamed = (key, StreamedArgs(call.get("args")))
            return
        self.norm.delta(key, "json_text", args_text(call.get("args")))
        self.norm.close_block(key)

    def _nameless_call(self, call: dict[str, Any]) -> None:
        if call.keys() - {"willContinue"}:
            raise UpstreamProtocolError("upstream sent a functionCall without a name")
        self.norm.ignore("functionCall_end_without_call")

    def _continue_call(self, call: dict[str, Any], signature: str | None) -> None:
        if call.get("name"):
            raise UpstreamProtocolError("a function call began before the streamed one ended")
        assert self.streamed is not None
        for piece in as_list(call.get("partialArgs"), "functionCall.partialArgs"):
            self.streamed[1].add(piece)
        if signature:
            self.loose_signature(signature)
        if call.get("willContinue") is not True:
            self.end_streamed()

    def end_streamed(self) -> None:
        """Send the streamed call's arguments as one ``json_text`` delta and close its block."""
        assert self.streamed is not None
        key, args = self.streamed
        self.streamed = None
        self.norm.delta(key, "json_text", args.text())
        self.norm.close_block(key)
