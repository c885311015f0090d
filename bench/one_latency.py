"""Edge latency of the ``one`` row seen by a lean client: 1 stream x N readers on raw sockets.

The reference benchmark's clients are aiohttp coroutines: at 1,000 readers x 100
events/s their own per-chunk work is most of the latency they report. This script
keeps the same load (a real ``fanout publisher`` process, a private Redis, the worker's
notification payload, ``--rate`` events/s on an absolute schedule) but reads the N
sockets with one ``selectors`` loop in a child process that only scans for the
publish time stamped in each event, so what it reports is mostly the edge's own
publish-to-socket latency. Prints p50/p99/max over every delivery.

    .venv/bin/python bench/one_latency.py --redis-port P [--readers 1000] [--events 500] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from publisher.live.notification import encode_notification

CLIENT = r"""
import json, re, selectors, socket, sys, time
port, n, want = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
stamp = re.compile(rb'"text":"t(\d+)"')
sel, got, lat = selectors.DefaultSelector(), {}, []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v1/streams/st_one/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer one-key\r\n\r\n")
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    got[s] = 0
print("READY", flush=True)
done = 0
while done < n:
    for key, _ in sel.select(timeout=30):
        now = time.monotonic_ns()
        data = key.fileobj.recv(65536)
        stamps = stamp.findall(data)
        lat.extend((now - int(t)) / 1e6 for t in stamps)
        got[key.fileobj] += len(stamps)
        if got[key.fileobj] >= want or not data:
            sel.unregister(key.fileobj)
            done += 1
lat.sort()
print(json.dumps({"n": len(lat), "p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)], "max": lat[-1]}))
"""


def main(a: argparse.Namespace) -> None:
    conn = redis.Redis(port=a.redis_port)
    prefix, sid = f"one{time.time_ns()}", "st_one"
    key = f"{prefix}:{{{sid}}}"
    conn.hset(f"{key}:meta", mapping={"state": "running", "last_seq": 1})
    conn.xadd(f"{key}:events", {"e": b'{"type":"stream.start","stream_id":"st_one","seq":1,"ts":0}'}, id="0-1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{a.redis_port}/0", "FANOUT_REDIS_PREFIX": prefix,
           "FANOUT_API_KEYS": "one-key", "FANOUT_TOKEN_SECRET": "o" * 48}
    edge = subprocess.Popen([a.fanout, "publisher", "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(a.readers), str(a.events)],
                                  stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        client.stdout.readline()
        time.sleep(1.0)
        start, pad = time.monotonic(), b"x" * 60
        for i in range(a.events):
            seq = i + 2
            stamp = time.monotonic_ns()
            data = (b'{"type":"block.delta","stream_id":"st_one","seq":%d,"ts":0,"block":{"id":"b0","index":0,'
                    b'"kind":"text"},"delta":{"kind":"text","text":"t%d"},"pad":"%s"}' % (seq, stamp, pad))
            pipe = conn.pipeline(transaction=False)
            pipe.xadd(f"{key}:events", {"e": data}, id=f"0-{seq}")
            pipe.hset(f"{key}:meta", "last_seq", seq)
            pipe.publish(f"{key}:live", encode_notification(seq, [data], 64 * 1024))
            pipe.execute()
            delay = start + (i + 1) / a.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        result = json.loads(client.communicate(timeout=120)[0].strip().splitlines()[-1])
        print(f"one-lean: {a.readers} readers x {a.events} events at {a.rate:.0f}/s: {result['n']} deliveries, "
              f"p50 {result['p50']:.1f} ms, p99 {result['p99']:.1f} ms, max {result['max']:.1f} ms")
    finally:
        edge.kill()
        edge.wait()
        conn.delete(f"{key}:events", f"{key}:meta")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--readers", type=int, default=1000)
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--fanout", default=str(Path(sys.executable).with_name("fanout")))
    main(ap.parse_args())
