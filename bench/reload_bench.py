"""Reload and late-join bytes of one stream, with and without a snapshot (``/events?snapshot=1``).

Runs a publisher in this process against a Redis (``--redis-url``; keys under a fresh
prefix, deleted afterwards), stores a stream of ``N`` text deltas for each ``--deltas``
(default 200, 2,000 and 20,000; fragments of 2 to 10 characters, about 5.7 on average,
as in issue 23's measurement), and prints per stream, in bytes of HTTP body:

* ``text``: the UTF-8 text the stream delivers;
* ``reload``: a finished stream read whole (``/events``, no position), as a browser that
  reloads the page and opens an EventSource does;
* ``snapshot``: the same reload with ``?snapshot=1`` (one ``stream.snapshot`` message);
  ``x text`` is ``snapshot / text``, ``envelope`` is what the same reload of an empty stream
  costs (the ``retry:`` hint, the ``id``/``event`` lines, the result's fixed fields), and
  ``(s-env)/text`` is the snapshot's bytes beyond that envelope per byte of text (target
  <= 1.5);
* ``ui``: ``/ui`` of the finished stream (each block's replayed deltas joined into one)
  beside ``ui/delta``, the same chunks one per stored delta (what it sent before);
* ``304``: the body of a revalidation with the ``ETag`` (0);
* ``join``/``join snap``: a late joiner of the same stream while it runs with half its
  deltas stored: the bytes it reads until it holds the last stored seq, without and with
  a snapshot;
* the median time of 5 reloads, without and with a snapshot, ms.

    .venv/bin/python bench/reload_bench.py [--redis-url redis://127.0.0.1:6379/0] [--deltas 200 2000 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import redis.asyncio as aioredis
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from publisher.api.edge import EdgeRunner
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from publisher.wire.ui_chunks import DONE_LINE, UIMessageTranslator, chunk_frame
from schema.contract import BlockDelta, BlockRef, BlockStart, BlockStop, Delta, Event, StreamDone, StreamStart
from schema.keys import Keys

KEY = "reload-bench-key"
_WORDS = ("the", "stream", "and", "token", "in", "answer", "that", "for", "reload", "as", "with", "model", "on",
          "result", "at", "by", "this", "reader", "not", "are", "but", "from", "or", "have", "an", "they")


def fragments(count: int, seed: int = 7) -> list[str]:
    """``count`` text fragments (a space, a word, maybe a suffix: 2 to 10 characters, about 5.7), deterministic."""
    rng = random.Random(seed)
    return [" " + rng.choice(_WORDS) + rng.choice(("", "s", "ing", "ed", ",", ".")) for _ in range(count)]


def stream_events(sid: str, parts: list[str]) -> list[Event]:
    """``stream.start``, one text block of ``parts``, ``block.stop``, ``stream.done``."""
    ref = BlockRef(id="b0", index=0, kind="text")
    events: list[Event] = [StreamStart(stream_id=sid, seq=1, ts=1, provider="openai_chat", model="gpt-4o-mini",
                                       epoch="e1"),
                           BlockStart(stream_id=sid, seq=2, ts=2, block=ref)]
    events += [BlockDelta(stream_id=sid, seq=3 + i, ts=3 + i, block=ref, delta=Delta(kind="text", text=text))
               for i, text in enumerate(parts)]
    seq = 3 + len(parts)
    events.append(BlockStop(stream_id=sid, seq=seq, ts=seq, block=ref))
    events.append(StreamDone(stream_id=sid, seq=seq + 1, ts=seq + 1, status="completed", finish_reason="stop",
                             provider_finish_reason="stop", usage=None, response_id="r", model="gpt-4o-mini"))
    return events


async def store(client: aioredis.Redis, keys: Keys, sid: str, events: list[Event], *, done: bool) -> None:
    """Store ``events`` as a worker does (entries ``0-<seq>`` with field ``e``, meta), without notifying."""
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.xadd(keys.events(sid), {"e": msgspec.json.encode(event)}, id=f"0-{event.seq}")
    meta: dict[str, Any] = {"state": "done" if done else "running", "last_seq": events[-1].seq, "epoch": "e1",
                            "created_ms": 1, "provider": "openai_chat", "model": "gpt-4o-mini"}
    if done:
        meta["status"] = "completed"
    pipe.hset(keys.meta(sid), mapping=meta)
    await pipe.execute()


async def body_of(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with http.get(url, headers={"Authorization": f"Bearer {KEY}", **(headers or {})}) as resp:
        return resp.status, await resp.read()


async def join_bytes(http: aiohttp.ClientSession, url: str, last_id: str) -> int:
    """Bytes a reader of a running stream reads until it holds ``last_id`` (the message with that id, whole)."""
    read, holding = 0, False
    async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as resp:
        while True:
            line = await resp.content.readline()
            read += len(line)
            if line == f"id: {last_id}\n".encode():
                holding = True
            elif holding and line == b"\n":
                return read


def ui_per_delta(events: list[Event]) -> int:
    """Bytes of ``/ui``'s chunks when every stored delta is one chunk (no joining)."""
    translator = UIMessageTranslator()
    return sum(len(chunk_frame(chunk)) for event in events for chunk in translator.feed(event)) + len(DONE_LINE)


async def median_ms(http: aiohttp.ClientSession, url: str) -> float:
    times = []
    for _ in range(5):
        began = time.perf_counter()
        await body_of(http, url)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


async def measure(http: aiohttp.ClientSession, base: str, client: aioredis.Redis, keys: Keys, *, count: int,
                  envelope: int) -> dict[str, float]:
    parts = fragments(count)
    sid = f"st_reload_{count}"
    events = stream_events(sid, parts)
    await store(client, keys, sid, events, done=True)
    url = f"{base}/v1/streams/{sid}"
    text = len("".join(parts).encode())
    _, reload = await body_of(http, f"{url}/events")
    _, snap = await body_of(http, f"{url}/events?snapshot=1")
    _, ui = await body_of(http, f"{url}/ui")
    async with http.get(f"{url}/events?snapshot=1", headers={"Authorization": f"Bearer {KEY}"}) as resp:
        tag = resp.headers["ETag"]
    status_304, body_304 = await body_of(http, f"{url}/events?snapshot=1", {"If-None-Match": tag})
    assert status_304 == 304
    running = f"st_join_{count}"
    half = stream_events(running, parts[: count // 2])[:-2]
    await store(client, keys, running, half, done=False)
    last_id = f"{half[-1].seq}.e1"
    join_url = f"{base}/v1/streams/{running}/events"
    return {"deltas": count, "text": text, "reload": len(reload), "snapshot": len(snap),
            "x text": len(snap) / text, "envelope": envelope, "(s-env)/text": (len(snap) - envelope) / text,
            "ui": len(ui), "ui/delta": ui_per_delta(events), "304": len(body_304),
            "join": await join_bytes(http, join_url, last_id),
            "join snap": await join_bytes(http, join_url + "?snapshot=1", last_id),
            "reload ms": await median_ms(http, f"{url}/events"),
            "snap ms": await median_ms(http, f"{url}/events?snapshot=1")}


async def main(args: argparse.Namespace) -> None:
    keys = Keys(f"reload{uuid.uuid4().hex[:8]}")
    client = aioredis.Redis.from_url(args.redis_url)
    app = create_app(PublisherSettings(api_keys=[KEY], token_secret="r" * 48), keys=keys, redis_url=args.redis_url)
    runner = EdgeRunner(app, **RUNNER_KWARGS, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    base = f"http://{host}:{port}"
    rows = []
    try:
        async with aiohttp.ClientSession() as http:
            empty = stream_events("st_reload_0", [])
            await store(client, keys, "st_reload_0", empty, done=True)
            envelope = len((await body_of(http, f"{base}/v1/streams/st_reload_0/events?snapshot=1"))[1])
            for count in args.deltas:
                rows.append(await measure(http, base, client, keys, count=count, envelope=envelope))
    finally:
        await runner.cleanup()
        stale = [key async for key in client.scan_iter(match=f"{keys.prefix}:*")]
        if stale:
            await client.delete(*stale)
        await client.aclose()
    _print(rows)


def _print(rows: list[dict[str, float]]) -> None:
    names = list(rows[0])
    print(" | ".join(names))
    for row in rows:
        print(" | ".join(f"{row[name]:,.2f}" if isinstance(row[name], float) else f"{row[name]:,}" for name in names))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--deltas", type=int, nargs="+", default=[200, 2000, 20000])
    asyncio.run(main(parser.parse_args()))
