"""Stress the batched live reads: many streams, mixed/dropped/reordered notifications, reader churn, faults.

Runs a publisher in-process against a PRIVATE redis-server (started here on a port in
40000-45000, killed at exit) and checks that every reader, across its reconnects
(Last-Event-ID), receives every seq exactly once, in order, and that the stream ends.

    PYTHONPATH=. .venv/bin/python scripts/breaker/live_reads_stress.py --streams 150 --faults kill,sleep
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from publisher.app import RUNNER_KWARGS, create_app
from publisher.edge import EdgeRunner
from publisher.live import encode_notification
from publisher.state import HUB
from schema.contract import encode_event
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, bearer, block_start, delta, done, make_settings, start


def start_redis() -> tuple[subprocess.Popen[bytes], int, str]:
    for _ in range(50):
        port = random.randint(40000, 45000)
        workdir = tempfile.mkdtemp(prefix="breaker2-redis-")
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                                 "--dir", workdir, "--enable-debug-command", "yes"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        if proc.poll() is None:
            return proc, port, workdir
        shutil.rmtree(workdir, ignore_errors=True)
    raise RuntimeError("no redis")


class Reader:
    def __init__(self, sid: str, index: int) -> None:
        self.sid, self.index = sid, index
        self.seqs: list[int] = []
        self.errors: list[str] = []
        self.reconnects = 0
        self.gaps = 0
        self.done = False


async def read_stream(http: aiohttp.ClientSession, base: str, reader: Reader, churn: float) -> None:
    while not reader.done:
        headers = bearer(API_KEY)
        if reader.seqs:
            headers["Last-Event-ID"] = str(reader.seqs[-1])
        try:
            async with http.get(f"{base}/v1/streams/{reader.sid}/events", headers=headers) as resp:
                if resp.status == 204:
                    reader.done = True
                    return
                if resp.status != 200:
                    reader.errors.append(f"status {resp.status}")
                    await asyncio.sleep(0.2)
                    continue
                event: dict[str, str] = {}
                drop_after = random.randint(3, 40) if random.random() < churn else None
                got = 0
                while True:
                    line = await asyncio.wait_for(resp.content.readline(), 20)
                    if not line:
                        break
                    text = line.decode().rstrip("\n")
                    if text:
                        name, _, value = text.partition(":")
                        event[name] = value[1:] if value.startswith(" ") else value
                        continue
                    if "id" in event:
                        seq = int(event["id"])
                        want = (reader.seqs[-1] + 1) if reader.seqs else 1
                        if seq != want:
                            reader.errors.append(f"got {seq}, wanted {want}")
                        reader.seqs.append(seq)
                        got += 1
                        if event.get("event") == "stream.done":
                            reader.done = True
                            return
                    elif event.get("event") == "stream.gap":
                        reader.gaps += 1
                    event = {}
                    if drop_after is not None and got >= drop_after:
                        break
        except (aiohttp.ClientError, TimeoutError) as exc:
            reader.errors.append(f"{type(exc).__name__}: {exc}") if isinstance(exc, TimeoutError) else None
        reader.reconnects += 1
        await asyncio.sleep(random.uniform(0, 0.05))


async def writer(redis: aioredis.Redis, keys: Keys, sids: list[str], events: int, rate_s: float,
                 reorder: list[tuple[float, str, bytes]]) -> None:
    seqs = dict.fromkeys(sids, 1)
    unnotified: dict[str, list[tuple[int, bytes]]] = {sid: [] for sid in sids}
    for sid in sids:  # start event, stored before readers come
        await redis.xadd(keys.events(sid), {"e": encode_event(start(sid))}, id="0-1")
        await redis.hset(keys.meta(sid), mapping={"state": "running", "last_seq": 1})
    await asyncio.sleep(1.0)
    for _ in range(events):
        async with redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                seq = seqs[sid] + 1
                seqs[sid] = seq
                ev = block_start(sid, seq, 0) if seq == 2 else delta(sid, seq, 0, f"t{seq} ")
                raw = encode_event(ev)
                pipe.xadd(keys.events(sid), {"e": raw}, id=f"0-{seq}")
                pipe.hset(keys.meta(sid), "last_seq", seq)
                unnotified[sid].append((seq, raw))
                r = random.random()
                if r < 0.15:
                    continue  # dropped for now (a later one covers it)
                batch = unnotified[sid]
                unnotified[sid] = []
                if r < 0.45:
                    payload = str(seq).encode()  # seq-only
                else:
                    take = batch[-random.randint(1, len(batch)):]
                    payload = encode_notification(take[0][0], [raw for _, raw in take], 1 << 20)
                if random.random() < 0.1:  # reordered: published later
                    reorder.append((time.monotonic() + random.uniform(0.005, 0.2), keys.live(sid), payload))
                else:
                    pipe.publish(keys.live(sid), payload)
            await pipe.execute()
        now = time.monotonic()
        due = [item for item in reorder if item[0] <= now]
        for item in due:
            reorder.remove(item)
            await redis.publish(item[1], item[2])
        await asyncio.sleep(rate_s)
    for sid in sids:
        seq = seqs[sid] + 1
        await redis.xadd(keys.events(sid), {"e": encode_event(done(sid, seq))}, id=f"0-{seq}")
        await redis.hset(keys.meta(sid), mapping={"last_seq": seq, "state": "done", "status": "completed"})
        await redis.publish(keys.live(sid), str(seq).encode() if random.random() < 0.5 else b"garbage")
    for _, channel, payload in reorder:
        await redis.publish(channel, payload)


async def faults(admin: aioredis.Redis, kinds: list[str], stop: asyncio.Event, spare: set[int],
                 proc: subprocess.Popen[bytes]) -> list[str]:
    """Inject faults; ``spare``: client ids never killed (the writer's and this one's)."""
    log = []
    while not stop.is_set():
        await asyncio.sleep(random.uniform(0.3, 1.0))
        kind = random.choice(kinds)
        try:
            if kind == "kill":
                clients = await admin.client_list(_type="normal")
                killed = 0
                for client in clients:
                    if int(client["id"]) not in spare:
                        killed += await admin.execute_command("CLIENT", "KILL", "ID", client["id"])
                log.append(f"kill {killed}")
            elif kind == "killpubsub":
                killed = await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                log.append(f"killpubsub {killed}")
            elif kind == "stop":  # the server hangs (SIGSTOP) for a while, then goes on
                proc.send_signal(signal.SIGSTOP)
                await asyncio.sleep(random.uniform(0.5, 2.5))
                proc.send_signal(signal.SIGCONT)
                log.append("stop")
            elif kind == "sleep":
                await admin.execute_command("DEBUG", "SLEEP", "1")
                log.append("sleep")
        except Exception as exc:  # noqa: BLE001
            log.append(f"{kind} failed {exc}")
    return log


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=120)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--events", type=int, default=60)
    parser.add_argument("--rate-s", type=float, default=0.02)
    parser.add_argument("--live-read-ms", type=float, default=10.0)
    parser.add_argument("--live-batch-ms", type=float, default=3.0)
    parser.add_argument("--read-page", type=int, default=2048)
    parser.add_argument("--churn", type=float, default=0.3)
    parser.add_argument("--faults", default="")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    print("seed", seed)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        filename="/tmp/breaker2_stress.log", filemode="w", force=True)
    proc, port, workdir = start_redis()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        keys = Keys(prefix=f"brk2-{uuid.uuid4().hex[:8]}")
        settings = make_settings(live_read_ms=args.live_read_ms, live_batch_ms=args.live_batch_ms,
                                 read_page=args.read_page, read_first_page=min(args.read_page, 256),
                                 heartbeat_s=2.0)
        app = create_app(settings, keys=keys, redis_url=url)
        runner = EdgeRunner(app, **RUNNER_KWARGS)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, hport = runner.addresses[0][:2]
        base = f"http://{host}:{hport}"
        redis = aioredis.Redis(host="127.0.0.1", port=port, single_connection_client=True)
        admin = aioredis.Redis(host="127.0.0.1", port=port, single_connection_client=True)
        spare = {int(await redis.client_id()), int(await admin.client_id())}
        sids = [f"st_{uuid.uuid4().hex[:10]}_{i}" for i in range(args.streams)]
        readers = [Reader(sid, i) for sid in sids for i in range(args.readers)]
        stop = asyncio.Event()
        reorder: list[tuple[float, str, bytes]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                         connector=aiohttp.TCPConnector(limit=0)) as http:
            write = asyncio.create_task(writer(redis, keys, sids, args.events, args.rate_s, reorder))
            await asyncio.sleep(0.5)
            tasks = [asyncio.create_task(read_stream(http, base, r, args.churn)) for r in readers]
            fault = asyncio.create_task(faults(admin, args.faults.split(","), stop, spare, proc)) if args.faults else None
            await write
            stop.set()
            fault_log = await fault if fault else []
            _, pending = await asyncio.wait(tasks, timeout=60)
            hub = app[HUB]
            reads_task = hub._reads._task  # noqa: SLF001
            print("live reads task alive:", reads_task is not None and not reads_task.done())
            print("faults:", fault_log)
            bad = 0
            for r in readers:
                want = list(range(1, args.events + 3))
                if r.seqs != want or r.errors:
                    bad += 1
                    if bad <= 10:
                        print("BAD", r.sid, r.index, "errors", r.errors[:5], "last", r.seqs[-5:], "len", len(r.seqs),
                              "reconnects", r.reconnects, "gaps", r.gaps)
                        topic = hub._topics.get(r.sid)  # noqa: SLF001
                        if topic is not None:
                            print("   topic", topic.fetched, topic.seen, topic.pending, topic.reading,
                                  len(topic.backlog), len(topic.live), len(topic.readers))
            print(f"readers {len(readers)} bad {bad} unfinished {len(pending)} "
                  f"reconnects {sum(r.reconnects for r in readers)} gaps {sum(r.gaps for r in readers)}")
            for t in pending:
                t.cancel()
        await redis.aclose()
        await admin.aclose()
        await runner.cleanup()
        return 1 if bad else 0
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
