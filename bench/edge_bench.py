"""The edge table, naive beside product in one run: many, one, saturation, storm, resume.

``saturation`` offers 1,000 events/s to 1,000 readers, at most 1,000,000 deliveries/s: an
edge that delivers all of them cannot show more than that over the naive edge's figure, so
``saturation-2k`` offers twice as much to show the room above it.

Drives the reference benchmark ``fanout_bench.py`` (``--ref``, default
``/work/shared/bench``; imported from there, never copied) for the naive edge and for
``fanout publisher``, with identical clients, payloads, publish schedule and Redis. For
the product, its publisher loop's ``PUBLISH <live> <seq>`` is replaced by the payload the
worker's append script publishes (:func:`publisher.live.notification.encode_notification`: the event
itself), so both edges see the same three commands per event and the product is measured
as deployed: the product's events are stored in the compact form the worker writes
(field ``c``, :mod:`schema.stored`) and notified compact; ``--json-form`` keeps the JSON
form (field ``e``) of a worker before it; ``--seq-only`` keeps the seq-only payload (an
older worker). ``resume``
stores 10,000 events and times one reader from position 0 on each edge (TTFB and
events/s): the median of ``--resume-runs`` reads after ``--resume-warmup`` reads, and
apart from it the first read of the fresh process.
Needs a private Redis: ``redis-server --port P --save '' --appendonly no``.

    .venv/bin/python bench/edge_bench.py many one saturation storm resume --redis-port P

Prints one ``edge-<row>:`` line per row, with the goal, and writes every figure to
``--json-out`` when given.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from publisher.live.notification import encode_notification
from schema.contract import decode_event
from schema.stored import encode_stored

LIVE_MAX_BYTES = 64 * 1024
ROWS: dict[str, dict[str, Any]] = {
    "many": {"clients": 1000, "streams": 1000, "events": 15000, "rate": 3000.0},
    "one": {"clients": 1000, "streams": 1, "events": 500, "rate": 100.0},
    "saturation": {"clients": 1000, "streams": 1, "events": 5000, "rate": 1000.0},
    "saturation-2k": {"clients": 1000, "streams": 1, "events": 10000, "rate": 2000.0},
    "storm": {"clients": 10000, "streams": 100, "events": 200, "rate": 50.0, "connect_s": 120.0},
}


def _stored(data: bytes, *, json_form: bool) -> tuple[str, bytes]:
    """The (field, value) a worker stores for an event JSON: compact ``c``, or ``e`` with ``json_form``."""
    event = None if json_form else decode_event(data)
    return ("e", data) if event is None else ("c", encode_stored(event))


class _FullPipe:
    """A redis-py pipeline whose ``publish(live, seq)`` carries the event XADDed before it."""

    def __init__(self, pipe: Any, json_form: bool = False) -> None:
        self._pipe, self._event, self._json_form = pipe, b"", json_form

    def xadd(self, name: Any, fields: dict[Any, Any], *args: Any, **kwargs: Any) -> Any:
        if "e" in fields and str(name).endswith(":events"):
            field, self._event = _stored(fields["e"], json_form=self._json_form)
            fields = {field: self._event}
        return self._pipe.xadd(name, fields, *args, **kwargs)

    def publish(self, channel: Any, message: Any) -> Any:
        seq = int(message)
        return self._pipe.publish(channel, encode_notification(seq, [self._event], LIVE_MAX_BYTES,
                                                               compact=not self._json_form))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class _FullConn:
    """The orchestrator's Redis connection, with :class:`_FullPipe` pipelines."""

    def __init__(self, conn: Any, json_form: bool = False) -> None:
        self._conn, self._json_form = conn, json_form

    def pipeline(self, *args: Any, **kwargs: Any) -> _FullPipe:
        return _FullPipe(self._conn.pipeline(*args, **kwargs), self._json_form)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _args(ref: Any, a: argparse.Namespace, edge: str, row: dict[str, Any]) -> argparse.Namespace:
    """The reference script's arguments (its own defaults) for one run."""
    return argparse.Namespace(
        role="orchestrator", edge=edge, fanout_bin=a.fanout, auth="", redis_host="127.0.0.1",
        redis_port=a.redis_port, runs=1, payload_bytes=150, count=500, block_ms=5000, latency_clients=100,
        connect_s=row.get("connect_s", 60.0), drain_s=60.0, max_seconds=1500, json_out=None, edge_port=0,
        max_redis_conns=4000, lifetime_s=600, n_clients=0, url="", deadline_s=120, out="", live_carry=False,
        clients=str(row["clients"]), streams=row["streams"], events=row["events"], rate=row["rate"])


def _cpu_per_delivery(run: dict[str, Any]) -> float:
    return run["edge_cpu_pct"] / max(1.0, run["delivered_per_s"])


def run_row(name: str, a: argparse.Namespace, ref: Any, conn: Any, redis_proc: Any) -> dict[str, Any]:
    row = {**ROWS[name], "events": int(ROWS[name]["events"] * a.events_scale)}
    product_conn = conn if a.seq_only else _FullConn(conn, a.json_form)
    out: dict[str, Any] = {}
    if (name != "storm" or a.storm_naive) and not a.product_only:
        out["naive"] = ref.one_run(_args(ref, a, "naive", row), row["clients"], conn, redis_proc)
    out["product"] = ref.one_run(_args(ref, a, "product", row), row["clients"], product_conn, redis_proc)
    return out


def summarize(name: str, res: dict[str, Any]) -> str:
    p, n = res["product"], res.get("naive")
    if n is None and name != "storm":
        return f"edge-{name}: product only: {json.dumps(p, default=str)}"
    if name == "storm":
        per_kb = (p["edge_rss_connected_mb"] - p["edge_rss_idle_mb"]) * 1024 / max(1, p["connected"])
        naive = ""
        if n:
            naive_kb = (n["edge_rss_connected_mb"] - n["edge_rss_idle_mb"]) * 1024 / max(1, n["connected"])
            naive = f"; naive connected {n['connected']}, {naive_kb:.1f} KB/reader"
        return (f"edge-storm: connected {p['connected']}/{p['clients']}, refused {p['client_errors']} "
                f"{p['client_error_examples'][:1]}, {per_kb:.1f} KB RSS per reader (goal all, <= 15){naive}")
    ratio = _cpu_per_delivery(p) / max(1e-12, _cpu_per_delivery(n))
    line = (f"edge-{name}: CPU/delivery product/naive {ratio:.2f}; p50 {p['lat_p50_ms']:.1f} ms "
            f"(naive {n['lat_p50_ms']:.1f}); p99 {p['lat_p99_ms']:.1f} ms (naive {n['lat_p99_ms']:.1f}); "
            f"deliveries/s {p['delivered_per_s']:,.0f} (naive {n['delivered_per_s']:,.0f}, "
            f"x{p['delivered_per_s'] / max(1.0, n['delivered_per_s']):.2f}); Redis cmds/delivery "
            f"{p['edge_redis_cmds_per_delivery']:.3f} (naive {n['edge_redis_cmds_per_delivery']:.3f}); "
            f"complete {p['complete_fraction']:.3f}; edge CPU {p['edge_cpu_pct']:.0f}% "
            f"(naive {n['edge_cpu_pct']:.0f}%)")
    goals = {"many": "goal CPU <= 0.25, p99 <= 25 ms, cmds <= 0.05", "one": "goal p99 <= 50 ms",
             "saturation": "goal deliveries/s >= 3x naive; at most 1,000,000/s are offered",
             "saturation-2k": "the same at 2,000 events/s: 2,000,000 deliveries/s offered, room above 3x"}
    return f"{line} [{goals[name]}]"


# --------------------------------------------------------------------------- resume

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _time_read(url: str, headers: dict[str, str], want: int) -> tuple[float, float, int]:
    """Return (TTFB ms, events/s after the first byte, events) of one full read."""
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as resp:
            got, first, tail = 0, 0.0, b""
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                got += (tail + chunk).count(b"\ndata: ")
                tail = chunk[-8:]
                if got >= want:
                    break
            t1 = time.perf_counter()
    return (first - t0) * 1000, got / max(1e-9, t1 - first), got


def _wait_http(url: str, proc: subprocess.Popen[Any]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"edge exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("edge did not start")


def run_resume(a: argparse.Namespace, ref: Any, conn: Any) -> dict[str, Any]:
    events, prefix, sid = a.resume_events, f"perfr{time.time_ns()}", "st_resume"
    key = f"{prefix}:{{{sid}}}"
    pipe = conn.pipeline(transaction=False)
    pipe.hset(f"{key}:meta", mapping={"state": "running", "last_seq": events, "provider": "p", "model": "m"})
    pad = "x" * 90
    for seq in range(1, events + 1):
        data = (b'{"type":"block.delta","stream_id":"%s","seq":%d,"ts":0,"block":{"id":"b0","index":0,"kind":"text"},'
                b'"delta":{"kind":"text","text":"%s"}}' % (sid.encode(), seq, pad.encode()))
        field, value = _stored(data, json_form=a.json_form)
        pipe.xadd(f"{key}:events", {field: value}, id=f"0-{seq}")
        pipe.xadd(f"{prefix}-naive", {"d": data}, id=f"0-{seq}")  # no braces: the naive route takes the key raw
    pipe.execute()
    out: dict[str, Any] = {}
    try:
        for edge in ("naive", "product"):
            port = _free_port()
            if edge == "naive":
                cmd = [sys.executable, ref.__file__, "--role", "edge", "--edge-port", str(port), "--redis-port",
                       str(a.redis_port), "--count", "500", "--block-ms", "5000", "--lifetime-s", "300"]
                env = dict(os.environ)
                url, headers = f"http://127.0.0.1:{port}/sse/{prefix}-naive", {"Last-Event-ID": "0"}
                ready = f"http://127.0.0.1:{port}/sse/none"
            else:
                cmd = [a.fanout, "publisher", "--host", "127.0.0.1", "--port", str(port)]
                env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{a.redis_port}/0", "FANOUT_REDIS_PREFIX": prefix,
                       "FANOUT_API_KEYS": "perf-key", "FANOUT_TOKEN_SECRET": "p" * 48}
                url, headers = f"http://127.0.0.1:{port}/v1/streams/{sid}/events", {"Authorization": "Bearer perf-key"}
                ready = f"http://127.0.0.1:{port}/healthz"
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if edge == "product":
                    _wait_http(ready, proc)
                else:
                    time.sleep(2.0)
                warmup = [asyncio.run(_time_read(url, headers, events)) for _ in range(a.resume_warmup)]
                runs = [asyncio.run(_time_read(url, headers, events)) for _ in range(a.resume_runs)]
            finally:
                proc.kill()
                proc.wait()
            best = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
            first = (warmup or runs)[0]
            out[edge] = {"ttfb_ms": best[0], "events_per_s": best[1], "events": best[2], "runs": runs,
                         "warmup": warmup, "first_ttfb_ms": first[0], "first_events_per_s": first[1]}
    finally:
        conn.delete(f"{key}:events", f"{key}:meta", f"{prefix}-naive")
    return out


def summarize_resume(res: dict[str, Any]) -> str:
    p, n = res["product"], res["naive"]
    warm = len(p["warmup"])
    return (f"edge-resume: {p['events']} events, TTFB {p['ttfb_ms']:.1f} ms (naive {n['ttfb_ms']:.1f}), "
            f"{p['events_per_s']:,.0f} events/s (naive {n['events_per_s']:,.0f}), median of {len(p['runs'])} reads "
            f"after {warm} warm-up read(s); a fresh process's first read: TTFB {p['first_ttfb_ms']:.1f} ms "
            f"(naive {n['first_ttfb_ms']:.1f}), {p['first_events_per_s']:,.0f} events/s "
            f"(naive {n['first_events_per_s']:,.0f}) [goal TTFB <= 20 ms, >= 300k/s]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", choices=[*ROWS, "resume"])
    ap.add_argument("--redis-port", type=int, required=True, help="a private redis-server (never the shared one)")
    ap.add_argument("--fanout", default=str(Path(sys.executable).with_name("fanout")))
    ap.add_argument("--ref", default="/work/shared/bench", help="directory of the reference fanout_bench.py")
    ap.add_argument("--seq-only", action="store_true", help="product gets seq-only notifications (older worker)")
    ap.add_argument("--json-form", action="store_true", help="product's events stored as JSON (field e, older worker)")
    ap.add_argument("--events-scale", type=float, default=1.0, help="multiply each row's event count (longer runs)")
    ap.add_argument("--product-only", action="store_true", help="skip the naive edge (profiling; no ratios)")
    ap.add_argument("--storm-naive", action="store_true", help="also run the naive edge in the storm")
    ap.add_argument("--resume-events", type=int, default=10_000)
    ap.add_argument("--resume-runs", type=int, default=5)
    ap.add_argument("--resume-warmup", type=int, default=2,
                    help="reads of each edge before the measured ones (a fresh process's first reads run slower:"
                         " its allocator and connections are new); the first is reported apart")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    sys.path.insert(0, a.ref)
    ref = importlib.import_module("fanout_bench")
    conn = redis.Redis(port=a.redis_port)
    proc = psutil.Process(int(conn.info("server")["process_id"]))
    results: dict[str, Any] = {}
    for name in a.rows:
        if name == "resume":
            results[name] = run_resume(a, ref, conn)
            print(summarize_resume(results[name]), flush=True)
        else:
            results[name] = run_row(name, a, ref, conn, proc)
            print(summarize(name, results[name]), flush=True)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
