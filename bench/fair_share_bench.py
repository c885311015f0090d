"""Fair shares under attack: one token's status readers, connections and stalled readers against another's service.

Starts a private ``redis-server`` and a ``fanout publisher`` process (from this tree, or
``--root`` another checkout, e.g. the main branch, to compare), stores three streams
(``st_big``: 100,000 small deltas, finished; ``st_live``: running, two events; ``st_small``:
20 events, finished), then runs each phase while a *victim* process, holding its own API
key and its own read token, submits jobs (``POST /v1/streams``, 10/s) and reads
``st_small`` over SSE (10/s: time to the first event and to the terminal). Phases:

* ``idle``: the victim alone (the baseline).
* ``status``: 150 concurrent status readers (``GET /v1/streams/st_big``) with one public
  token, each asking again at once after a 200 and after ``Retry-After`` after a 429
  (``--status-ignore-retry``: at once after a 429 too).
* ``connections``: 10,000 SSE connections with one public token to ``st_live``, each
  reconnecting after the ``retry:`` hint when turned away, as EventSource does.
* ``stalled``: 300 SSE readers of ``st_big``, each with its own token (``stalled1``, or
  ``--stalled-one-token``: one for all) and its own position (no two share a page), on sockets with a 4 KB receive
  buffer that never read; with ``--stalled-reconnect`` a reader that is dropped comes back
  at once and stalls again.

Each attacker runs in its own process (raw sockets or aiohttp), the victim in another;
``--pin`` keeps the publisher alone on CPU 0 and every other process (Redis, the clients)
on the other CPUs, so the attackers' own CPU does not slow the publisher down.
Prints per phase: the victim's submit and SSE p50/p99 (ms), the attackers' outcomes, the
publisher's RSS (start, peak, end) and its metrics (Prometheus scrape). The machine's fd
limit is raised to its hard limit for the attackers and the publisher.

    .venv/bin/python bench/fair_share_bench.py [--phases idle,status,connections,stalled] [--seconds 20]
        [--root DIR [--python PY]] [--env FANOUT_X=y ...] [--status-ignore-retry] [--stalled-one-token]
        [--stalled-reconnect] [--json-out FILE]

``--root``: the tree whose ``publisher/`` serves (``git archive <commit> | tar -x -C DIR`` of
an older commit, with ``--python .venv/bin/python`` of this tree, measures it before).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import msgspec
import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.fair_share_roles import ROLES  # noqa: E402
from publisher.api.tokens import issue  # noqa: E402
from tests.redis_servers import redis_node  # noqa: E402

SECRET = "f" * 48
VICTIM_KEY, ATTACK_KEY = "victim-key", "other-key"
BIG, LIVE, SMALL = "st_big", "st_live", "st_small"


def raise_fd_limit() -> int:
    """Raise this process's (and its children's) open-file limit to the hard limit; return it."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def token(sid: str, n: int = 0) -> str:
    """A public read token of ``sid``; ``n`` makes another one (another expiry)."""
    return issue(SECRET, sid, "public", int(time.time()) + 3600 + n)


def store_streams(conn: redis.Redis, prefix: str, big_events: int) -> None:
    def event(sid: str, seq: int, kind: str) -> bytes:
        base: dict[str, Any] = {"type": kind, "stream_id": sid, "seq": seq, "ts": 1}
        if kind == "stream.start":
            base.update(provider="openai_chat", model="m")
        elif kind == "block.start":
            base.update(block={"id": "b0", "index": 0, "kind": "text"})
        elif kind == "block.delta":
            base.update(block={"id": "b0", "index": 0, "kind": "text"}, delta={"kind": "text", "text": "t" * 20})
        elif kind == "stream.done":
            base.update(status="completed", finish_reason="stop", provider_finish_reason="stop", usage=None,
                        response_id="r", model="m")
        return msgspec.json.encode(base)

    for sid, deltas, finished in ((BIG, big_events - 3, True), (LIVE, 0, False), (SMALL, 17, True)):
        kinds = ["stream.start", "block.start", *["block.delta"] * deltas] + (["stream.done"] if finished else [])
        pipe = conn.pipeline(transaction=False)
        for seq, kind in enumerate(kinds, 1):
            pipe.xadd(f"{prefix}:{{{sid}}}:events", {"e": event(sid, seq, kind)}, id=f"0-{seq}")
            if seq % 5000 == 0:
                pipe.execute()
        meta = {"state": "done" if finished else "running", "provider": "openai_chat", "model": "m",
                "created_ms": 1, "last_seq": len(kinds)}
        if finished:
            meta["status"] = "completed"
        pipe.hset(f"{prefix}:{{{sid}}}:meta", mapping=meta)
        pipe.execute()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def publisher(a: argparse.Namespace, url: str, prefix: str) -> Any:
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "REDIS_URL": url, "FANOUT_REDIS_PREFIX": prefix, "FANOUT_TOKEN_SECRET": SECRET,
           "FANOUT_API_KEYS": f"{VICTIM_KEY},{ATTACK_KEY}", "FANOUT_SHUTDOWN_WINDOW_S": "0",
           "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics_port),
           "FANOUT_LOG_LEVEL": "WARNING"}
    env.update(dict(item.split("=", 1) for item in a.env))
    root = Path(a.root)
    python = os.path.abspath(a.python) if a.python else root / ".venv" / "bin" / "python"
    proc = subprocess.Popen([str(python), "-m", "fanout_cli", "publisher", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(a.log, "w") if a.log else subprocess.DEVNULL)  # noqa: SIM115
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            time.sleep(0.05)
        yield proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        proc.terminate()
        proc.wait(30)


def scrape(metrics_url: str) -> dict[str, float]:
    wanted = re.compile(r"^(fanout_(status_assemblies_total|fair_share_refused_total|sse_budget_drops_total|"
                        r"sse_refused_total|sse_readers|sse_stalled_size|status_cache_size|redis_errors_total)"
                        r"(\{[^}]*\})?) ([0-9.e+-]+)$")
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in urllib.request.urlopen(metrics_url, timeout=5).read().decode().splitlines():
            if (match := wanted.match(line)) and float(match[4]):
                labels = re.sub(r'(otel_scope_\w+|job|instance|service_name)="[^"]*",?', "", match[3] or "")
                out[match[2] + (labels if labels not in ("{}", "") else "")] = float(match[4])
    return out


PINS: dict[str, set[int]] = {}
"""``--pin``: the CPUs of the publisher (``publisher``) and of every other process (``clients``)."""


def pin(pid: int, who: str) -> None:
    """Keep process ``pid`` on the CPUs of ``who`` when ``--pin`` asked for it."""
    if who in PINS:
        os.sched_setaffinity(pid, PINS[who])


def spawn(role: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--role", role, *args], stdout=subprocess.PIPE, text=True)
    pin(proc.pid, "clients")
    return proc


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def run_phase(a: argparse.Namespace, name: str, base: str, metrics_url: str, pub: psutil.Process) -> dict[str, Any]:
    attacker: subprocess.Popen[str] | None = None
    host_port = base.removeprefix("http://")
    if name == "status":
        attacker = spawn("status", base, token(BIG), str(a.status_readers), "1" if a.status_ignore_retry else "0")
    elif name == "connections":
        attacker = spawn("connections", host_port, LIVE, token(LIVE), str(a.connections))
    elif name in ("stalled", "stalled1"):
        one = a.stalled_one_token or name == "stalled1"
        tokens = token(BIG) if one else ",".join(token(BIG, n) for n in range(1, a.stalled + 1))
        attacker = spawn("stalled", host_port, BIG, tokens, f"{a.stalled}/{a.big_events}",
                         "1" if a.stalled_reconnect else "0")
    rss = [pub.memory_info().rss]
    settle_until = time.monotonic() + (a.settle_s if attacker else 0)
    while time.monotonic() < settle_until:
        rss.append(pub.memory_info().rss)
        time.sleep(0.1)
    victim = spawn("victim", base, VICTIM_KEY, SMALL, token(SMALL), str(a.seconds))
    began, cpu, redis_cpu = time.monotonic(), _cpu(pub), _cpu(a.redis_process)
    attacker_cpu = _cpu(psutil.Process(attacker.pid)) if attacker else 0.0
    while victim.poll() is None:
        rss.append(pub.memory_info().rss)
        time.sleep(0.1)
    elapsed = time.monotonic() - began
    cpu_share = {"publisher": (_cpu(pub) - cpu) / elapsed, "redis": (_cpu(a.redis_process) - redis_cpu) / elapsed}
    if attacker is not None:
        cpu_share["attacker"] = (_cpu(psutil.Process(attacker.pid)) - attacker_cpu) / elapsed
    assert victim.stdout is not None
    seen = json.loads(victim.stdout.read())
    metrics = scrape(metrics_url)  # while the attack still holds what it holds
    attack: dict[str, Any] = {}
    if attacker is not None:
        assert attacker.stdout is not None
        attacker.terminate()
        out = attacker.stdout.read().strip().splitlines()
        attacker.wait()
        attack = json.loads(out[-1]) if out else {}
    time.sleep(a.cool_s)
    return {"phase": name, "attack": attack, "metrics": metrics, "cpu": cpu_share,
            "rss_mb": {"start": rss[0] / 2**20, "peak": max(rss) / 2**20, "end": rss[-1] / 2**20},
            "submit_ms": {"n": len(seen["submit"]), **_quantiles(seen["submit"]), "errors": seen["submit_errors"]},
            "sse_first_ms": {"n": len(seen["first"]), **_quantiles(seen["first"])},
            "sse_all_ms": {**_quantiles(seen["all"]), "errors": seen["sse_errors"]}}


def _quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p90": pct(values, 0.9), "p99": pct(values, 0.99),
            "max": max(values, default=float("nan"))}


def report(result: dict[str, Any]) -> None:
    s, f, w, r = result["submit_ms"], result["sse_first_ms"], result["sse_all_ms"], result["rss_mb"]
    print(f"{result['phase']:>12}: submit p50 {s['p50']:.1f} p90 {s['p90']:.1f} p99 {s['p99']:.1f} "
          f"max {s['max']:.0f} ms "
          f"({s['n']}, {s['errors']} errors) | SSE first event p50 {f['p50']:.1f} p90 {f['p90']:.1f} "
          f"p99 {f['p99']:.1f} max {f['max']:.0f} ms, whole p50 {w['p50']:.1f} p99 {w['p99']:.1f} ms "
          f"({f['n']}, {w['errors']} errors) | RSS {r['start']:.0f} -> peak {r['peak']:.0f} -> {r['end']:.0f} MB | "
          f"CPU {', '.join(f'{k} {v:.0%}' for k, v in result['cpu'].items())}")
    if result["attack"]:
        print(f"{'':>14}attack: {json.dumps(result['attack'])}")
    if result["metrics"]:
        print(f"{'':>14}metrics: {json.dumps(result['metrics'])}")


def main(a: argparse.Namespace) -> None:
    print(f"fd limit {raise_fd_limit()}; publisher from {a.root}; env {a.env}", flush=True)
    prefix = f"fair{uuid.uuid4().hex[:8]}"
    with redis_node(extra=["--maxclients", "20000"]) as node:
        conn = redis.Redis.from_url(node.url)
        a.redis_process = psutil.Process(int(conn.info("server")["process_id"]))
        if a.pin:
            PINS.update(publisher={0}, clients=set(range(1, os.cpu_count() or 2)))
            pin(os.getpid(), "clients")
            pin(a.redis_process.pid, "clients")
        store_streams(conn, prefix, a.big_events)
        with publisher(a, node.url, prefix) as (proc, base, metrics_url):
            pub = psutil.Process(proc.pid)
            pin(proc.pid, "publisher")
            print(f"publisher pid {proc.pid} at {base}", flush=True)
            results = []
            for name in a.phases.split(","):
                results.append(run_phase(a, name, base, metrics_url, pub))
                report(results[-1])
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--phases", default="idle,status,connections,stalled")
    ap.add_argument("--seconds", type=float, default=20.0, help="victim measurement per phase")
    ap.add_argument("--settle-s", type=float, default=8.0, help="attack ramp-up before the victim starts")
    ap.add_argument("--cool-s", type=float, default=3.0, help="pause after each phase")
    ap.add_argument("--big-events", type=int, default=100_000)
    ap.add_argument("--status-readers", type=int, default=150)
    ap.add_argument("--status-ignore-retry", action="store_true")
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--stalled", type=int, default=300)
    ap.add_argument("--stalled-one-token", action="store_true", help="one token for every stalled reader")
    ap.add_argument("--stalled-reconnect", action="store_true", help="a dropped stalled reader comes back")
    ap.add_argument("--root", default=str(ROOT), help="checkout whose publisher runs (python -m fanout_cli there)")
    ap.add_argument("--python", default="", help="interpreter of the publisher (default: <root>/.venv/bin/python)")
    ap.add_argument("--env", action="append", default=[], help="FANOUT_X=y for the publisher")
    ap.add_argument("--log", default="", help="publisher stderr to this file")
    ap.add_argument("--pin", action="store_true", help="publisher alone on CPU 0, every other process on the others")
    ap.add_argument("--json-out", default="")
    args, rest = ap.parse_known_args()
    if args.role:
        raise_fd_limit()
        ROLES[args.role](*rest)
    else:
        main(args)
