"""Redis faults during a long resume through a running publisher. Not run by CI.

Usage: PYTHONPATH=. .venv/bin/python scripts/breaker4/faults.py PORT MODE   (MODE: kill | restart-keep | restart-lose | oom)
"""
import asyncio, os, subprocess, sys, tempfile, time, uuid, logging, io
import aiohttp, redis.asyncio as aioredis
from schema.contract import encode_event, is_terminal
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, SSEClient, StreamWriter, bearer, make_settings, running_publisher, delta, done, start, block_start

PORT, MODE = int(sys.argv[1]), sys.argv[2]
URL = f"redis://127.0.0.1:{PORT}/0"
N = 30000
logbuf = io.StringIO()
logging.basicConfig(stream=logbuf, level=logging.WARNING)
tmp = tempfile.mkdtemp(prefix="b4redis-")

def start_redis(extra=()):
    subprocess.run(["redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no", "--dir", tmp,
                    "--dbfilename", "b4.rdb", "--daemonize", "yes", *extra], check=True, stdout=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(PORT), "ping"], capture_output=True).stdout.strip() == b"PONG":
            return
        time.sleep(0.05)

def cli(*args):
    return subprocess.run(["redis-cli", "-p", str(PORT), *args], capture_output=True).stdout.decode().strip()

async def main():
    start_redis(["--maxmemory", "0"])
    keys = Keys("b4f-" + uuid.uuid4().hex[:6])
    sid = "st_" + uuid.uuid4().hex[:10]
    r = aioredis.Redis.from_url(URL)
    w = StreamWriter(r, keys, sid)
    await w.meta()
    evs = [start(sid), block_start(sid, 2, 0)] + [delta(sid, s, 0, "x" * 40) for s in range(3, N + 1)]
    pipe = r.pipeline(transaction=False)
    for e in evs:
        pipe.xadd(keys.events(sid), {"e": encode_event(e)}, id=f"0-{e.seq}")
    await pipe.execute()
    await r.hset(keys.meta(sid), mapping={"last_seq": N})
    seen: list[int] = []
    ends: list[str] = []
    fault_done = asyncio.Event()

    async def append(event):  # idempotent: an XADD whose reply was lost is not retried as a new entry
        try:
            await r.xadd(keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        except aioredis.ResponseError as exc:
            if "equal or smaller" not in str(exc):
                raise
        fields = {"last_seq": event.seq} | ({"state": "done", "status": "completed"} if is_terminal(event) else {})
        await r.hset(keys.meta(sid), mapping=fields)
        await w.notify(event.seq)

    async def writer():  # a worker-like live tail
        seq = N
        while not fault_done.is_set() or seq < N + 200:
            seq += 1
            try:
                await append(delta(sid, seq, 0, "live"))
            except Exception as exc:
                ends.append(f"writer error at {seq}: {type(exc).__name__} {str(exc)[:60]}")
                seq -= 1
                await asyncio.sleep(0.2)
                if len(ends) > 40:
                    return seq
            await asyncio.sleep(0.002)
        while True:
            try:
                await append(done(sid, seq + 1)); return seq + 1
            except Exception:
                await asyncio.sleep(0.2)

    async def fault():
        while len(seen) < 5000:
            await asyncio.sleep(0.01)
        if MODE == "kill":
            for _ in range(8):
                print("CLIENT KILL ->", cli("CLIENT", "KILL", "TYPE", "normal"), "at", len(seen))
                await asyncio.sleep(0.3)
        elif MODE.startswith("restart"):
            if MODE == "restart-keep":
                cli("SHUTDOWN", "SAVE")
            else:
                cli("SHUTDOWN", "NOSAVE")
            print("redis stopped at", len(seen)); await asyncio.sleep(1.0)
            start_redis(); print("redis started, dbsize", cli("DBSIZE"))
        elif MODE == "oom":
            used = int([l for l in cli("INFO", "memory").splitlines() if l.startswith("used_memory:")][0].split(":")[1])
            print("CONFIG SET maxmemory", cli("CONFIG", "SET", "maxmemory", str(used + 200_000)),
                  cli("CONFIG", "SET", "maxmemory-policy", "noeviction"))
            await asyncio.sleep(3)
            print("lift", cli("CONFIG", "SET", "maxmemory", "0"))
        fault_done.set()

    async def reader(base):
        last = None
        for attempt in range(60):
            h = bearer(API_KEY) | ({"Last-Event-ID": str(last)} if last is not None else {})
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{base}/v1/streams/{sid}/events", headers=h) as resp:
                    if resp.status != 200:
                        ends.append(f"status {resp.status} after {last}"); 
                        if resp.status in (204, 410): return
                        await asyncio.sleep(0.3); continue
                    c = SSEClient(resp); lastmsg = None
                    while (m := await c.message()) is not None:
                        lastmsg = m
                        if "id" in m:
                            seen.append(int(m["id"])); last = int(m["id"])
                        if m.get("event") == "stream.gap":
                            ends.append(f"gap after {last}")
                    kind = lastmsg.get("event") if lastmsg else None
                    if kind == "stream.done":
                        ends.append(f"done at {last}"); return
                    ends.append(f"response ended after {last}: last={ {k: v[:40] for k, v in (lastmsg or {}).items()} }")
            except Exception as exc:
                ends.append(f"client error after {last}: {exc!r}"[:120])
            await asyncio.sleep(0.2)

    async with running_publisher(URL, keys, make_settings(read_page=256)) as base:
        rt = asyncio.create_task(reader(base)); ft = asyncio.create_task(fault()); wt = asyncio.create_task(writer())
        try:
            await asyncio.wait_for(rt, 60)
        except TimeoutError:
            print("READER TIMED OUT; writer done:", wt.done(), wt.result() if wt.done() else None, "fault done:", ft.done())
        await ft
        wt.cancel()
    dups = len(seen) - len(set(seen))
    skips = [(a, b) for a, b in zip(seen, seen[1:]) if b != a + 1]
    print(f"MODE {MODE}: received {len(seen)} events, first {seen[:1]}, last {seen[-1:]}, dups {dups}, non-consecutive {skips[:10]}")
    print("ends:", *ends[:25], sep="\n  ")
    tb = [l for l in logbuf.getvalue().splitlines() if "Traceback" in l]
    print("tracebacks in log:", len(tb))
    errs = [l for l in logbuf.getvalue().splitlines() if l.startswith(("ERROR", "WARNING", "CRITICAL"))]
    print("log levels:", len(errs), *sorted(set(l[:110] for l in errs))[:8], sep="\n  ")
    print("stored top:", [(i, f[b"e"][:40]) for i, f in await r.xrevrange(keys.events(sid), count=2)])
    print("meta:", await r.hgetall(keys.meta(sid)), "keys:", cli("KEYS", "*"))
    await r.aclose()
    cli("SHUTDOWN", "NOSAVE")

asyncio.run(main())
