"""Joins the UI message stream's delta chunks of a replay: one delta per block instead of one per stored delta.

A resumed ``useChat`` needs the message so far, not its history token by token, so
``/ui`` (:mod:`publisher.api.ui_stream`) passes the chunks of the events it replays
through a :class:`DeltaJoiner`. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from publisher.wire.ui_chunks import Chunk

_DELTA_TEXT: Final = {"text-delta": ("id", "delta"), "reasoning-delta": ("id", "delta"),
                      "tool-input-delta": ("toolCallId", "inputTextDelta")}
"""Delta chunk type → (its block key field, its text field)."""


class DeltaJoiner:
    """Joins a run of delta chunks into one delta per block (a replay's: the client gets state, not tokens).

    Delta chunks (``text-delta``, ``reasoning-delta``, ``tool-input-delta``) are held, each
    block's joined in arrival order; any other chunk first releases every held delta (in
    the order their blocks first had one), then passes. So no delta moves past another
    chunk, and the SDK, which appends deltas per block id, builds the same message. The
    text held is bounded: once it passes ``max_chars`` it is released as it stands (a
    longer block then arrives in a few deltas, each about ``max_chars``).

    Args:
        max_chars: Most characters held before they are released (``FANOUT_UI_JOIN_MAX_CHARS``).
    """

    def __init__(self, max_chars: int) -> None:
        self._held: dict[tuple[str, str], tuple[Chunk, list[str]]] = {}
        self._max_chars = max_chars
        self._chars = 0

    def feed(self, chunks: list[Chunk]) -> list[Chunk]:
        """Return the chunks to send now for ``chunks`` (delta chunks are held instead)."""
        out: list[Chunk] = []
        for chunk in chunks:
            fields = _DELTA_TEXT.get(chunk["type"])
            if fields is None:
                out += self.flush()
                out.append(chunk)
                continue
            key, text = (chunk["type"], chunk[fields[0]]), chunk[fields[1]]
            held = self._held.get(key)
            if held is None:
                self._held[key] = (chunk, [text])
            else:
                held[1].append(text)
            self._chars += len(text)
            if self._chars > self._max_chars:
                out += self.flush()
        return out

    def flush(self) -> list[Chunk]:
        """Return every held delta, one chunk per block, and hold nothing."""
        out = []
        for (kind, _), (first, parts) in self._held.items():
            out.append({**first, _DELTA_TEXT[kind][1]: "".join(parts)})
        self._held.clear()
        self._chars = 0
        return out
