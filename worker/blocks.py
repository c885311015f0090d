"""The block books of one stream: adapter keys, held blocks, contract indexes, streamed text.

One job: remember every block an adapter opened, under the adapter's own key, and give
each its contract ``index`` in order of public start. :class:`~worker.normalizer.Normalizer`
owns one :class:`BlockTable` and emits the events; nothing here emits or decides an end.

Keys: adapters name blocks by any hashable key of their own (Anthropic ``index``,
Responses ``(output_index, content_index)``, ...); the table maps each key to the next
contract ``index`` in order of public start.

Held blocks (PROVIDERS.md 7.4: a block that never receives content never exists
publicly): a ``text``, ``reasoning`` or ``refusal`` block is opened for the adapter at
once but its ``block.start`` is held until its first non-empty delta (of any kind, a
signature included), which is also when it gets its contract ``index``. Closing a held
block emits nothing, so a never-filled block leaves no trace and the indexes of the
blocks that follow close ranks. A ``tool_call`` block starts at once: its name and call
id are content, and ``""`` arguments mean ``{}``.

Pure: imports no asyncio, aiohttp, redis or opentelemetry, and nothing of the worker's
I/O shell.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from schema.contract import BlockKind, BlockRef, DeltaKind, ToolInfo

HELD_KINDS: frozenset[BlockKind] = frozenset({"text", "reasoning", "refusal"})
"""Block kinds whose ``block.start`` waits for their first content (PROVIDERS.md 7.4)."""


class Block:
    """One block as the normalizer knows it: kind, public ref once started, fragments sent."""

    __slots__ = ("json_text", "kind", "open", "redacted", "ref", "signature", "text", "tool")

    def __init__(self, kind: BlockKind, tool: ToolInfo | None, redacted: bool) -> None:
        self.ref: BlockRef | None = None
        """Set when ``block.start`` is emitted; ``None`` while held."""
        self.kind: BlockKind = kind
        self.tool, self.redacted = tool, redacted
        self.open = True
        self.text: list[str] = []
        self.json_text: list[str] = []
        self.signature: list[str] = []

    @property
    def held(self) -> bool:
        """Whether the block waits for its first content before its ``block.start``."""
        return self.kind in HELD_KINDS

    def parts(self, kind: DeltaKind) -> list[str]:
        """Return the fragments of ``kind`` sent so far (the list itself, to append to)."""
        return {"text": self.text, "json_text": self.json_text, "signature": self.signature}[kind]


class BlockTable:
    """The blocks of one stream by adapter key, and those started publicly in index order."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, Block] = {}
        self.started: list[Block] = []
        """Blocks whose ``block.start`` was emitted; position = contract ``index``."""

    def __iter__(self) -> Iterator[Block]:
        """Every block, held ones included, in order of opening."""
        return iter(self._by_key.values())

    def get(self, key: Hashable) -> Block | None:
        """Return the block keyed ``key``, or ``None`` if it was never opened."""
        return self._by_key.get(key)

    def add(self, key: Hashable, kind: BlockKind, *, call_id: str | None, name: str | None,
            redacted: bool) -> Block:
        """Record a new open block under ``key`` (the caller checked :meth:`knows`)."""
        tool = ToolInfo(call_id=call_id or "", name=name or "") if kind == "tool_call" else None
        block = self._by_key[key] = Block(kind, tool, redacted)
        return block

    def next_ref(self, block: Block) -> BlockRef:
        """Return the ref ``block`` gets if it starts now: the next contract index."""
        return BlockRef(id=f"b{len(self.started)}", index=len(self.started), kind=block.kind)

    def mark_started(self, block: Block, ref: BlockRef) -> None:
        """Record that ``block.start`` of ``block`` was emitted with ``ref``."""
        block.ref = ref
        self.started.append(block)

    def is_open(self, key: Hashable) -> bool:
        """Whether the block keyed ``key`` is open."""
        block = self._by_key.get(key)
        return block is not None and block.open

    def knows(self, key: Hashable) -> bool:
        """Whether a block keyed ``key`` was ever opened."""
        return key in self._by_key

    def kind_of(self, key: Hashable) -> BlockKind | None:
        """Return the kind of the block keyed ``key``, or ``None`` if unknown."""
        block = self._by_key.get(key)
        return block.kind if block else None

    @property
    def open_keys(self) -> list[Hashable]:
        """Keys of open blocks (held ones included), in order of opening."""
        return [k for k, b in self._by_key.items() if b.open]

    def text_of(self, key: Hashable, kind: DeltaKind) -> str:
        """Return the concatenated fragments of ``kind`` sent so far for block ``key``."""
        block = self._by_key.get(key)
        return "".join(block.parts(kind)) if block else ""
