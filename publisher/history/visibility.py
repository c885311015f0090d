"""The projection a reader may see: ``internal`` sees every event, ``public`` loses internal reasoning.

A reasoning block is internal when its ``block.start`` says ``visibility: internal``;
its start, deltas and stop are then left out of the public projection (CONTRACT.md, "SSE
projection": the seq gaps this makes are expected). A reader that resumes inside a block
has not seen its ``block.start``; it asks (:meth:`Projection.needs_history`) for that
block's start once (the caller searches the history backwards from its position:
``Store.find_block_start``), and a reasoning block whose start cannot be found is treated
as internal (fail closed). Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from publisher.history.entries import Entry

Scope = Literal["public", "internal"]
"""What a read token may see: ``public`` the public projection; ``internal`` also internal reasoning blocks."""


class Projection:
    """Per-response filter of stored entries.

    The two sets of block indexes are made on the first reasoning ``block.start``
    (``None`` until then): most responses never see one, and two empty sets are 432 bytes.

    Args:
        scope: The reader's scope.
    """

    __slots__ = ("_internal", "_known", "_searched", "public")

    def __init__(self, scope: Scope) -> None:
        self.public = scope == "public"
        self._known: set[int] | None = None
        self._internal: set[int] | None = None
        self._searched: set[int] | None = None

    def learn(self, entry: Entry) -> None:
        """Record the visibility of a reasoning ``block.start``; other entries are ignored."""
        if entry.type != "block.start" or entry.block_kind != "reasoning" or entry.block_index is None:
            return
        if self._known is None:
            self._known = set()
        self._known.add(entry.block_index)
        if entry.visibility == "internal":
            if self._internal is None:
                self._internal = set()
            self._internal.add(entry.block_index)

    def learn_start(self, block_index: int, start: Entry | None) -> None:
        """Record what the search for block ``block_index``'s start found (``None``: no start: internal)."""
        if self._searched is None:
            self._searched = set()
        self._searched.add(block_index)
        if start is not None:
            self.learn(start)

    def needs_history(self, entry: Entry) -> bool:
        """Return True when deciding ``entry`` needs its block's start from the history (once per block)."""
        return (
            self.public
            and entry.block_kind == "reasoning"
            and entry.type != "block.start"
            and entry.block_index is not None
            and (self._known is None or entry.block_index not in self._known)
            and (self._searched is None or entry.block_index not in self._searched)
        )

    def visible(self, entry: Entry) -> bool:
        """Return True when ``entry`` belongs to this reader's projection."""
        if not self.public:
            return True
        self.learn(entry)
        if entry.block_kind != "reasoning":
            return True
        if self._known is None or entry.block_index not in self._known:
            return False
        return self._internal is None or entry.block_index not in self._internal
