"""Tool call ids that are unique within one stream, for clients that key calls by id. Pure.

The contract keeps the provider's ``call_id`` as sent, and providers do not always make
it unique: Kimi-style Anthropic-compatible endpoints and some OpenAI relays give two
parallel calls of one answer the same id, or none. The AI SDK (``/ui``) and AG-UI
(``/agui``) both key a tool call by its id, so a repeated id merges two calls into one
(or, in AG-UI, fails the run). :class:`CallIds` hands out the id a client sees:

* the provider's id, the first time it appears in the stream;
* a derived id, ``<provider id>~<block index>`` (``call~<block index>`` for an empty
  id), when the provider's id was already handed out; ``~`` is repeated until the
  result is unused. The block index is unique within a stream, so the derived id is
  stable: the same stored events always give the same ids, which is what a replay or
  a resume needs.

Callers keep the provider's id beside a derived one (provider metadata) so it can be
sent back upstream unchanged.
"""

from __future__ import annotations

from typing import Final

DERIVED_SEPARATOR: Final = "~"
"""Joins the provider's id and the block index in a derived id."""


class CallIds:
    """Assigns one client-facing id per tool call block of one stream, in ``block.start`` order."""

    def __init__(self) -> None:
        self._by_index: dict[int, str] = {}
        self._used: set[str] = set()

    def assign(self, index: int, provider_id: str) -> str:
        """Return the id clients see for the tool call block at ``index`` (the same one on every call).

        Args:
            index: The block's contract index (unique within the stream).
            provider_id: The provider's ``call_id``, possibly empty or already used.

        Returns:
            ``provider_id`` when it is non-empty and not yet handed out, else a derived id.
        """
        known = self._by_index.get(index)
        if known is not None:
            return known
        candidate = provider_id
        if not candidate or candidate in self._used:
            candidate = f"{provider_id or 'call'}{DERIVED_SEPARATOR}{index}"
            while candidate in self._used:
                candidate += DERIVED_SEPARATOR
        self._used.add(candidate)
        self._by_index[index] = candidate
        return candidate

    @staticmethod
    def derived(client_id: str, provider_id: str) -> bool:
        """Return whether ``client_id`` is not the provider's id (the caller then keeps the provider's)."""
        return client_id != provider_id
