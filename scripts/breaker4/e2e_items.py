"""Crafted stored items read end to end through a running publisher. Not run by CI.

Usage: PYTHONPATH=. .venv/bin/python scripts/breaker4/e2e_items.py PORT
"""
import asyncio, sys, uuid, logging, io
import aiohttp, redis.asyncio as aioredis
from publisher.entries import parse_entry
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, SSEClient, StreamWriter, bearer, make_settings, running_publisher, text_stream
from schema.contract import encode_event

PORT = int(sys.argv[1])
URL = f"redis://127.0.0.1:{PORT}/0"
logbuf = io.StringIO()
logging.basicConfig(stream=logbuf, level=logging.WARNING)

def deep(d): return b'{"type":"block.delta","t":' + b"[" * d + b"]" * d + b"}"

CRAFTED = {
    "shift terminal": [b'{"type":"block.delta","x":"', b'","y":{"type":"stream.done"}}',
                       b'{"type":"stream.done"},{"type":"block.delta"}'],
    "shift string": [b'{"type":"block.delta","x":"', b'"}', b'{"type":"block.delta"},{"type":"block.delta"}'],
    "deep 990": [deep(990)],
    "deep 3000": [deep(3000)],
    "1],[2": [b"1],[2", b'{"type":"block.delta"}]', b"]", b",{}"],
    "nul/utf8": [b'{"type":"block.delta","t":"\xff"}', b'{"type":"block.delta"}\x00'],
    "huge": [b'{"type":"block.delta","t":"' + b"a" * 6_000_000 + b'"}'],
}

async def read(base, sid, last=None):
    h = bearer(API_KEY) | ({"Last-Event-ID": str(last)} if last is not None else {})
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/v1/streams/{sid}/events", headers=h) as r:
            if r.status != 200:
                return r.status, []
            out = []
            c = SSEClient(r)
            while (m := await c.message()) is not None:
                out.append(m)
            return 200, out

async def main():
    prefix = "b4-" + uuid.uuid4().hex[:6]
    keys = Keys(prefix)
    r = aioredis.Redis.from_url(URL)
    async with running_publisher(URL, keys, make_settings(read_page=4, read_first_page=2)) as base:
        for name, crafted in CRAFTED.items():
            sid = "st_" + uuid.uuid4().hex[:10]
            w = StreamWriter(r, keys, sid)
            await w.meta()
            evs = text_stream(sid, 3)  # 1 start, 2 bstart, 3..5 deltas, 6 stop, 7 done
            head, tail = evs[:3], evs[3:]
            items = [encode_event(e) for e in head] + crafted + [encode_event(e) for e in tail]
            for i, it in enumerate(items, 1):
                await r.xadd(keys.events(sid), {"e": it}, id=f"0-{i}")
            await r.hset(keys.meta(sid), mapping={"last_seq": len(items), "state": "done", "status": "completed"})
            try:
                expect = [e for e in (parse_entry(b"0-%d" % i, [b"e", it]) for i, it in enumerate(items, 1)) if e.frame]
                exp_ids = [e.seq for e in expect]
            except RecursionError:
                exp_ids = "careful path raises RecursionError"
            for last in (None, 2, 3, 4):
                try:
                    st, msgs = await asyncio.wait_for(read(base, sid, last), 20)
                except Exception as exc:
                    print(f"{name} last={last}: CLIENT ERROR {exc!r}"); continue
                got = [int(m["id"]) for m in msgs if "id" in m]
                types = [m.get("event") for m in msgs if "data" in m]
                want = exp_ids if isinstance(exp_ids, str) else [s for s in exp_ids if last is None or s > last]
                flag = "OK " if got == want else "BAD"
                print(f"{flag} {name} last={last}: status={st} got={got} want={want} gap={'stream.gap' in types}"
                      f" comments={[m['comment'][:40] for m in msgs if 'comment' in m][:3]}")
    await r.aclose()
    tb = [l for l in logbuf.getvalue().splitlines() if "Traceback" in l or "Error" in l]
    print("log lines with errors:", len(tb)); print("\n".join(tb[:15]))

asyncio.run(main())
