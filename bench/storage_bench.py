"""Bytes in Redis per stream: the JSON form, the compact live form and the compacted form, beside the text.

Run: ``.venv/bin/python bench/storage_bench.py [--deltas 200,2000,20000] [--json-out F]``. Uses
``REDIS_URL`` when set, else a private embedded ``redis-server``. For each provider shape and
delta count it writes one finished stream through the real append script
(:class:`worker.appender.StreamWriter`, batches of 16 events), measures ``MEMORY USAGE <key>
SAMPLES 0`` of every key naming the stream (events, meta, tombstone), rewrites the same
events in the JSON form of earlier releases (field ``e`` = the event JSON, same ids, same
meta) and measures again, then compacts the compact one (:class:`worker.compactor.Compactor`)
and measures a third time, with the compaction's CPU (``time.process_time``, planning and
the script call, and the server's ``used_cpu`` for the script). The text is seeded
the prose of this repository's ``docs/*.md``, one word per delta with its leading space
(about 6 to 8 bytes: issue 23's 2,000-delta answer had 5.7), four words per delta for
gemini, from a seeded place; ts steps 5 to 60 ms (seeded). Shapes: ``openai_chat``, ``openai_responses`` and
``gemini`` one text block (gemini in larger pieces), ``anthropic`` a reasoning block (half
the deltas, then a signature delta) and a text block. The keys are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

from infra.redis_client import RedisClient, RedisOptions, connect
from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    Event,
    StreamDone,
    StreamStart,
    Usage,
    encode_event,
)
from schema.keys import Keys
from tools.embedded_redis import redis_url
from worker.appender import Appender
from worker.compactor import Compactor
from worker.settings import WorkerSettings

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
DOCS = Path(__file__).resolve().parents[1] / "docs"
T0 = 1_764_800_000_000


def _corpus() -> list[str]:
    """The words of this repository's docs pages, in order: real prose, as compressible as an answer."""
    return " ".join(path.read_text("utf-8") for path in sorted(DOCS.glob("*.md"))).split()


def _pieces(rng: random.Random, n: int, size: int) -> list[str]:
    """``n`` deltas of ``size`` consecutive docs words each, from a seeded place, each word after a space."""
    words = _corpus()
    at = rng.randrange(len(words))
    return ["".join(" " + words[(at + i * size + j) % len(words)] for j in range(size)) for i in range(n)]


def stream_events(sid: str, provider: str, deltas: int, seed: int = 7) -> list[Event]:
    """One finished stream of ``deltas`` text (and reasoning) deltas, shaped like ``provider``'s."""
    rng = random.Random(seed)
    ts = T0
    out: list[Event] = [StreamStart(stream_id=sid, seq=1, ts=ts, provider=provider, model="bench-model",
                                    metadata={"user": "u_1234"}, epoch="0a1b2c3d4e")]
    blocks = [("reasoning", deltas // 2), ("text", deltas - deltas // 2)] if provider == "anthropic" else [
        ("text", deltas)]
    for index, (kind, count) in enumerate(blocks):
        ref = BlockRef(id=f"b{index}", index=index, kind=kind)  # type: ignore[arg-type]
        extra: dict[str, Any] = {"visibility": "public", "redacted": False} if kind == "reasoning" else {}
        out.append(BlockStart(stream_id=sid, seq=len(out) + 1, ts=ts, block=ref, **extra))
        for text in _pieces(rng, count, 4 if provider == "gemini" else 1):
            ts += rng.randint(5, 60)
            out.append(BlockDelta(stream_id=sid, seq=len(out) + 1, ts=ts, block=ref,
                                  delta=Delta(kind="text", text=text)))
        if kind == "reasoning":
            out.append(BlockDelta(stream_id=sid, seq=len(out) + 1, ts=ts, block=ref,
                                  delta=Delta(kind="signature", text="EqQBCkgIARABGAIiQL" * 4)))
        out.append(BlockStop(stream_id=sid, seq=len(out) + 1, ts=ts, block=ref))
    out.append(StreamDone(stream_id=sid, seq=len(out) + 1, ts=ts + 3, status="completed", finish_reason="stop",
                          provider_finish_reason="stop", usage=Usage(input_tokens=12, output_tokens=deltas),
                          response_id="resp_0123456789", model="bench-model-2026"))
    return out


def text_bytes(events: list[Event]) -> int:
    """UTF-8 bytes of every text delta (signatures excluded): what a reader assembles."""
    return sum(len(e.delta.text.encode()) for e in events if isinstance(e, BlockDelta) and e.delta.kind == "text")


async def _usage(client: RedisClient, keys: Keys, sid: str) -> int:
    total = 0
    for key in (keys.events(sid), keys.meta(sid), keys.tomb(sid)):
        total += int(await client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)
    return total


async def _store(client: RedisClient, keys: Keys, sid: str, events: list[Event]) -> None:
    await client.hset(keys.meta(sid), mapping={
        "state": "running", "token": 1, "last_seq": 0, "owner": "bench-w1", "provider": "anthropic",
        "model": "bench-model", "created_ms": T0, "started_ms": T0, "body_hash": "f" * 64,
        "job_id": "fanout:jobs:{0}/1-0"})
    writer = Appender(client, keys).writer(sid, token=1, last_seq=0, epoch="0a1b2c3d4e")
    for at in range(0, len(events), 16):
        await writer.append(events[at:at + 16])


async def _as_json(client: RedisClient, keys: Keys, sid: str, events: list[Event]) -> None:
    await client.delete(keys.events(sid))
    for at in range(0, len(events), 500):
        async with client.pipeline(transaction=False) as pipe:
            for event in events[at:at + 500]:
                pipe.xadd(keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
            await pipe.execute()


async def measure(client: RedisClient, keys: Keys, provider: str, deltas: int, run_deltas: int) -> dict[str, Any]:
    """One row: text bytes, JSON / live / compacted bytes, compaction CPU."""
    sid = f"st_bench{uuid.uuid4().hex[:20]}"
    events = stream_events(sid, provider, deltas)
    await _store(client, keys, sid, events)
    live = await _usage(client, keys, sid)
    json_sid = f"st_bench{uuid.uuid4().hex[:20]}"
    await _store(client, keys, json_sid, stream_events(json_sid, provider, deltas))
    await _as_json(client, keys, json_sid, stream_events(json_sid, provider, deltas))
    json_form = await _usage(client, keys, json_sid)
    cpu, wall = time.process_time(), time.perf_counter()
    outcome = await Compactor(client, keys, run_deltas=run_deltas).compact(sid)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    compacted = await _usage(client, keys, sid)
    text = text_bytes(events)
    return {"provider": provider, "deltas": deltas, "events": len(events), "text_bytes": text,
            "json_bytes": json_form, "live_bytes": live, "compacted_bytes": compacted, "outcome": outcome,
            "json_x": json_form / text, "live_x": live / text, "compacted_x": compacted / text,
            "live_bytes_per_delta": live / deltas, "compacted_bytes_per_char": compacted / text,
            "compaction_cpu_ms": cpu * 1000, "compaction_wall_ms": wall * 1000}


async def _main(args: argparse.Namespace, url: str) -> None:
    client = connect(url, RedisOptions())
    keys = Keys(prefix=f"fanoutbench-{uuid.uuid4().hex[:8]}")
    rows = []
    try:
        print("| provider | deltas | text | JSON form | live (compact) | compacted | compaction CPU |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for deltas in args.deltas:
            for provider in PROVIDERS:
                row = await measure(client, keys, provider, deltas, args.run_deltas)
                rows.append(row)
                print(f"| {provider} | {deltas:,} | {row['text_bytes']:,} B | {row['json_bytes']:,} B "
                      f"({row['json_x']:.1f}x) | {row['live_bytes']:,} B ({row['live_x']:.2f}x, "
                      f"{row['live_bytes_per_delta']:.1f} B/delta) | {row['compacted_bytes']:,} B "
                      f"({row['compacted_x']:.2f}x) | {row['compaction_cpu_ms']:.1f} ms |", flush=True)
    finally:
        async for key in client.scan_iter(match=f"{keys.prefix}:*", count=500):
            await client.delete(key)
        await client.aclose()
    if args.json_out:
        await asyncio.to_thread(Path(args.json_out).write_text, json.dumps(rows, indent=1), "utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deltas", type=lambda text: [int(p) for p in text.split(",")], default=[200, 2000, 20000])
    parser.add_argument("--json-out", default="")
    parser.add_argument("--run-deltas", type=int, default=WorkerSettings().compact_run_deltas,
                        help="FANOUT_COMPACT_RUN_DELTAS")
    args = parser.parse_args()
    with redis_url() as url:
        asyncio.run(_main(args, url))


if __name__ == "__main__":
    main()
