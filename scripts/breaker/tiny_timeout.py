import asyncio, sys, aiohttp, redis.asyncio as aioredis, collections
from schema.keys import Keys
from scripts.breaker.ra_harness import API_KEY, PrivateRedis, Publisher, store_stream, new_sid
BODY = {"provider": "openai_chat", "model": "m", "request": {"messages": [{"role": "user", "content": "hi"}]}}
async def main(t):
    r = PrivateRedis(); r.start(); c = aioredis.from_url(r.url); keys = Keys("brk2tiny")
    p = Publisher(r.url, "brk2tiny", FANOUT_REDIS_TIMEOUT_S=t); 
    try:
        sid = new_sid(); await store_stream(c, keys, sid, 3000, small_text="q"*500, terminal=True)
        await p.astart()
        auth={"Authorization": f"Bearer {API_KEY}"}
        async with aiohttp.ClientSession(headers=auth) as h:
            st = collections.Counter()
            for i in range(30):
                async with h.post(p.base+"/v1/streams", json=BODY) as resp: st[resp.status]+=1
            print("submit statuses", st)
            for path in ("/readyz", f"/v1/streams/{sid}", f"/v1/streams/{sid}/events"):
                async with h.get(p.base+path) as resp:
                    b = await resp.read(); print(path[:30], resp.status, len(b), b[:100], b.count(b"\nid: "))
        n = 0; metas = 0
        async for k in c.scan_iter(match="brk2tiny:jobs*"):
            if (await c.type(k)) == b"stream": n += await c.xlen(k); print(k)
        async for k in c.scan_iter(match="brk2tiny:*:meta"): metas += 1
        print("job entries", n, "metas", metas - 1)
    finally:
        await p.astop(); print(p.logtext()[-1500:]); await c.aclose(); r.stop()
asyncio.run(main(sys.argv[1]))
