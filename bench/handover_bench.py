"""Hand-over of background streams: time from a worker's death (or SIGTERM) to its successor's next event.

Run: ``.venv/bin/python bench/handover_bench.py [--rounds R] [--streams S] [--lease-s L] [--signal kill|term]``
(``REDIS_URL``, default ``redis://127.0.0.1:6379/0``; a unique key prefix, deleted at the end).
Three real ``fanout worker`` processes on an upstreams file whose endpoint runs in background
mode (the fake provider of :mod:`tools.fake_background`, one event every 150 ms). Each round
submits ``S`` streams, waits until every one stored 4 events, then SIGKILLs (or SIGTERMs) the
worker holding the first one and starts a replacement. For each stream of the victim, meta is
polled every 2 ms: the sample is the time from the signal to the first ``last_seq`` above the
one the successor's claim found (its first appended event). Prints p50/p99/max beside the
lease; every stream must end equal to its golden (the count of those that do not is printed).
Bounded: ``R`` rounds of ``S`` three-second streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the helpers live beside the tests

from infra.redis_client import RedisClient, RedisOptions, connect
from schema.keys import Keys
from tests.conftest import delete_prefix
from tests.worker.background import TEXT, Workers, comparable, golden, workers
from tests.worker.support import fake_upstream, make_job, meta, stored_events, submit
from tools.upstream import ServerConfig

PACED = ServerConfig(delay_ms=1, slow_delay_ms=150)
POLL_S = 0.002
GUARD_S = 60.0


async def _until(predicate, guard_s: float = GUARD_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + guard_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("handover bench: a condition was not reached within the guard time")
        await asyncio.sleep(0.01)


async def _successor_first_event(redis: RedisClient, keys: Keys, sid: str, token: str, sent: float) -> float:
    """Seconds from ``sent`` to the first append by another token than ``token``."""
    claimed_at: int | None = None
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        found = await meta(redis, keys, sid)
        if found.get("token") != token:
            last = int(found.get("last_seq", 0))
            if claimed_at is None:
                claimed_at = last
            elif last > claimed_at or found.get("state") == "done":
                return time.monotonic() - sent
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"no successor appended to {sid}")


async def _victims(redis: RedisClient, keys: Keys, procs: Workers, refs: dict[str, str]) -> tuple[
        asyncio.subprocess.Process, list[str]]:
    pending = await redis.xpending_range(keys.jobs_shard(0), "workers", min="-", max="+", count=1000)
    by_pid: dict[int, list[str]] = {}
    for item in pending:
        sid = refs.get(item["message_id"].decode())
        if sid is not None:
            by_pid.setdefault(int(item["consumer"].decode().rsplit("-", 2)[1]), []).append(sid)
    victim = next(p for p in procs.procs if p.returncode is None and p.pid in by_pid)
    return victim, by_pid[victim.pid]


async def _round(redis: RedisClient, keys: Keys, procs: Workers, streams: int, how: signal.Signals) -> tuple[
        list[float], int]:
    jobs = [make_job("openai_responses", f"slow-{TEXT}", endpoint="bg") for _ in range(streams)]
    refs = {keys.parse_job_ref(await submit(redis, keys, job))[1]: job.stream_id for job in jobs}

    async def running() -> bool:
        found = [await meta(redis, keys, j.stream_id) for j in jobs]
        return all(int(m.get("last_seq", 0)) >= 4 for m in found)

    await _until(running)
    victim, sids = await _victims(redis, keys, procs, refs)
    tokens = {sid: (await meta(redis, keys, sid))["token"] for sid in sids}
    sent = time.monotonic()
    victim.send_signal(how)
    samples = await asyncio.gather(*(_successor_first_event(redis, keys, s, tokens[s], sent) for s in sids))
    await victim.wait()
    await procs.start(1)

    async def done() -> bool:
        found = [await meta(redis, keys, j.stream_id) for j in jobs]
        return all(m.get("state") == "done" for m in found)

    await _until(done)
    wrong = sum([comparable(await stored_events(redis, keys, j.stream_id)) != golden(TEXT) for j in jobs])
    return list(samples), wrong


async def run(rounds: int, streams: int, lease_s: float, how: signal.Signals) -> None:
    """Run the rounds and print the figures."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    keys = Keys(prefix=f"fanoutbench-{uuid.uuid4().hex[:12]}")
    redis = connect(url, RedisOptions())
    samples: list[float] = []
    wrong = 0
    try:
        with tempfile.TemporaryDirectory() as directory:
            async with fake_upstream(PACED) as (base, _state), workers(
                    base, url, keys, Path(directory), 3, FANOUT_LEASE_S=str(lease_s), FANOUT_DRAIN_S="120") as procs:
                for _ in range(rounds):
                    got, bad = await _round(redis, keys, procs, streams, how)
                    samples += got
                    wrong += bad
    finally:
        await delete_prefix(redis, keys.prefix)
        await redis.aclose()
    ordered = sorted(samples)
    print("samples ms:", [round(s * 1000) for s in ordered])
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"| {how.name} | {lease_s:.1f} | {len(samples)} | {statistics.median(samples) * 1000:.0f} | "
          f"{p99 * 1000:.0f} | {max(samples) * 1000:.0f} | {wrong} |")


def main() -> None:
    """Parse arguments, run, print one table row."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="kills (one worker each)")
    parser.add_argument("--streams", type=int, default=6, help="streams per round (the victim holds some)")
    parser.add_argument("--lease-s", type=float, default=1.0, help="FANOUT_LEASE_S of the workers")
    parser.add_argument("--signal", choices=["kill", "term"], default="kill", help="SIGKILL or SIGTERM (drain)")
    args = parser.parse_args()
    how = signal.SIGKILL if args.signal == "kill" else signal.SIGTERM
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| signal | lease s | samples | p50 ms | p99 ms | max ms | streams not equal to golden |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    asyncio.run(run(args.rounds, args.streams, args.lease_s, how))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
