"""The stream and block state machine as data, shared by the validator and the normalizer.

Stream states: ``idle`` (nothing yet), ``open`` (``stream.start`` seen), ``receiving``
(a block event seen), ``terminal`` (``stream.done`` or ``stream.error`` seen). Block
states: ``open`` and ``closed``. The allowed transitions live in two tables below; any
pair not in a table is a violation of one of the five invariants of CONTRACT.md, named
by the rule it breaks. Pure: imports only the contract.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from schema.contract import BlockDelta, BlockStart, BlockStop, Event, StreamDone

StreamState = Literal["idle", "open", "receiving", "terminal"]
BlockState = Literal["open", "closed"]
Rule = Literal[
    "first_is_start",
    "block_is_open",
    "seq_contiguous",
    "nothing_after_terminal",
    "done_with_blocks_closed",
    "block_unique",
]

STREAM_TRANSITIONS: Final[dict[tuple[StreamState, str], StreamState]] = {
    ("idle", "stream.start"): "open",
    ("open", "block.start"): "receiving",
    ("open", "stream.done"): "terminal",
    ("open", "stream.error"): "terminal",
    ("receiving", "block.start"): "receiving",
    ("receiving", "block.delta"): "receiving",
    ("receiving", "block.stop"): "receiving",
    ("receiving", "stream.done"): "terminal",
    ("receiving", "stream.error"): "terminal",
}
"""(stream state, event type) → next stream state. Missing pairs are violations."""

BLOCK_TRANSITIONS: Final[dict[tuple[BlockState | None, str], BlockState]] = {
    (None, "block.start"): "open",
    ("open", "block.delta"): "open",
    ("open", "block.stop"): "closed",
}
"""(block state or None if unseen, event type) → next block state."""


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One broken invariant."""

    rule: Rule
    """Which invariant: ``first_is_start`` (1), ``block_is_open`` (2), ``seq_contiguous`` (3),
    ``nothing_after_terminal`` (4), ``done_with_blocks_closed`` (5), ``block_unique``."""
    seq: int
    """The seq of the offending event."""
    message: str
    """What was seen, in words."""


class StreamMachine:
    """Tracks one stream's state and reports the violation each new event would cause.

    Args:
        allow_seq_gaps: Accept increasing seqs with holes (a public projection that
            left internal blocks out), instead of requiring +1 per event.
    """

    def __init__(self, *, allow_seq_gaps: bool = False) -> None:
        self.state: StreamState = "idle"
        self.blocks: dict[int, BlockState] = {}
        self.last_seq = 0
        self._allow_gaps = allow_seq_gaps

    @property
    def open_blocks(self) -> list[int]:
        """Indexes of the blocks currently open, ascending."""
        return sorted(i for i, s in self.blocks.items() if s == "open")

    def check(self, event: Event) -> Violation | None:
        """Return the violation ``event`` would cause in the current state, or ``None``."""
        kind = type(event).__struct_config__.tag
        assert isinstance(kind, str)
        if self.state == "terminal":
            return Violation(rule="nothing_after_terminal", seq=event.seq, message=f"{kind} after the end")
        if self.state == "idle" and (kind != "stream.start" or event.seq != 1):
            return Violation(rule="first_is_start", seq=event.seq, message=f"stream begins with {kind} seq {event.seq}")
        bad_seq = event.seq <= self.last_seq if self._allow_gaps else event.seq != self.last_seq + 1
        if self.state != "idle" and bad_seq:
            return Violation(rule="seq_contiguous", seq=event.seq, message=f"seq {event.seq} after {self.last_seq}")
        if (self.state, kind) not in STREAM_TRANSITIONS:
            return Violation(rule="block_is_open", seq=event.seq, message=f"{kind} in state {self.state}")
        return self._check_block(kind, event)

    def _check_block(self, kind: str, event: Event) -> Violation | None:
        if isinstance(event, StreamDone) and self.open_blocks:
            return Violation(
                rule="done_with_blocks_closed",
                seq=event.seq,
                message=f"stream.done with blocks {self.open_blocks} open",
            )
        if not isinstance(event, BlockStart | BlockDelta | BlockStop):
            return None
        current = self.blocks.get(event.block.index)
        if (current, kind) in BLOCK_TRANSITIONS:
            return None
        rule: Rule = "block_unique" if kind == "block.start" else "block_is_open"
        return Violation(rule=rule, seq=event.seq, message=f"{kind} for block {event.block.index} ({current})")

    def apply(self, event: Event) -> Violation | None:
        """Check ``event`` and, when allowed, advance the state; return the violation if any.

        A violating event leaves the state unchanged, except that the seq advances so
        one bad seq is reported once.
        """
        violation = self.check(event)
        self.last_seq = max(self.last_seq, event.seq)
        if violation is not None:
            return violation
        kind = type(event).__struct_config__.tag
        assert isinstance(kind, str)
        self.state = STREAM_TRANSITIONS[(self.state, kind)]
        if isinstance(event, BlockStart | BlockDelta | BlockStop):
            current = self.blocks.get(event.block.index)
            self.blocks[event.block.index] = BLOCK_TRANSITIONS[(current, kind)]
        return None
