"""Streams for the fault scenarios, stored and notified as a worker's append script does, with the
notification's shape left to the test (carried, seq-only, dropped, published late).

An append stores ``XADD <events> 0-<seq> e <json>`` for each event and ``HSET`` meta
(``last_seq``, and ``state``/``status`` at a terminal) in one MULTI, as the script's single
call does, then publishes one live notification (:func:`publisher.live.notification.encode_notification`).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import redis.asyncio as aioredis

from publisher.live.notification import encode_notification
from schema.contract import Event, encode_event, is_terminal, terminal_status
from schema.keys import Keys
from tests.publisher.helpers import block_start, delta, done, start, stop


@dataclasses.dataclass
class Script:
    """One stream's events and the seqs a public token must not see (internal reasoning blocks)."""

    sid: str
    events: list[Event] = dataclasses.field(default_factory=list)
    hidden: set[int] = dataclasses.field(default_factory=set)

    @property
    def top(self) -> int:
        """The last seq."""
        return self.events[-1].seq

    def expected(self, after: int, scope: str) -> list[int]:
        """The seqs a reader resuming after ``after`` gets with a token of ``scope``."""
        return [e.seq for e in self.events if e.seq > after and (scope != "public" or e.seq not in self.hidden)]


def reasoning_script(sid: str, rng: random.Random, blocks: int, max_deltas: int, pad: int = 0) -> Script:
    """``stream.start``, ``blocks`` blocks (text, public or internal reasoning) of 0..``max_deltas`` deltas, done.

    ``pad``: bytes added to every delta's text (big pages make a stalled reader stall mid-page).
    """
    script = Script(sid, [start(sid)])

    def add(event: Event, hide: bool) -> None:
        script.events.append(event)
        if hide:
            script.hidden.add(event.seq)

    for index in range(blocks):
        kind = rng.choice(["text", "reasoning", "reasoning"])
        visibility = rng.choice(["internal", "public"]) if kind == "reasoning" else None
        hide = visibility == "internal"
        add(block_start(sid, len(script.events) + 1, index, kind, visibility), hide)
        for i in range(rng.randint(0, max_deltas)):
            text = f"{'SECRET' if hide else 'said'}{i} " + "p" * pad
            add(delta(sid, len(script.events) + 1, index, text, kind), hide)
        add(stop(sid, len(script.events) + 1, index, kind), hide)
    script.events.append(done(sid, len(script.events) + 1))
    return script


def text_script(sid: str, top: int, *, big: int = 0, big_bytes: int = 0, terminal: bool = False) -> Script:
    """Seqs 1..``top``: start, a text block whose first ``big`` deltas hold ``big_bytes`` each; done at ``top``."""
    events = [start(sid), block_start(sid, 2, 0)]
    last_delta = top - 1 if terminal else top
    events += [delta(sid, seq, 0, "y" * big_bytes if seq < 3 + big else f"t{seq} ") for seq in range(3, last_delta + 1)]
    if terminal:
        events.append(done(sid, top))
    return Script(sid, events)


def live_deltas(sid: str, first: int, count: int, *, terminal: bool = False) -> list[Event]:
    """``count`` events from seq ``first`` (deltas of block 0; the last a ``stream.done`` when ``terminal``)."""
    events = [delta(sid, seq, 0, f"live{seq} ") for seq in range(first, first + count)]
    if terminal:
        events[-1] = done(sid, first + count - 1)
    return events


class Writer:
    """Appends to streams of one key prefix as the worker's script does; the notification is the caller's choice."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys

    async def meta(self, sid: str, **fields: Any) -> None:
        """Create the stream's meta (``running``, ``last_seq`` 0), as a submission does."""
        await self.client.hset(self.keys.meta(sid), mapping={
            "state": "running", "provider": "openai_chat", "model": "m",
            "created_ms": int(time.time() * 1000), "last_seq": 0, **fields})

    async def store(self, events: list[Event]) -> None:
        """Store ``events`` of one stream (any number) and their meta, without a notification."""
        for at in range(0, len(events), 500):
            await self._store(events[at:at + 500])

    async def append(self, events: list[Event], *, live_max: int = 1 << 16, publish: bool = True) -> bytes:
        """Store one batch and publish its notification (carried unless over ``live_max``); return the payload."""
        await self._store(events)
        payload = encode_notification(events[0].seq, [encode_event(e) for e in events], live_max)
        if publish:
            await self.client.publish(self.keys.live(events[0].stream_id), payload)
        return payload

    async def _store(self, events: list[Event]) -> None:
        sid = events[0].stream_id
        fields: dict[str, Any] = {"last_seq": events[-1].seq}
        if is_terminal(events[-1]):
            fields.update(state="done", status=terminal_status(events[-1]))
        async with self.client.pipeline(transaction=True) as pipe:
            for event in events:
                pipe.xadd(self.keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
            pipe.hset(self.keys.meta(sid), mapping=fields)
            await pipe.execute()
