"""The cost of routing one job: its plan, the cooldown lookups, and taking and giving back a slot.

What a worker adds per job before its first request and after its last one
(:mod:`worker.routing` through :class:`worker.router.Router`): ``plan_route`` over the
route's endpoints (each a cooldown lookup), ``pick`` of the endpoint with a free slot, the
slot taken and given back (which wakes the jobs waiting for one). Measured for routes of 1,
3 and 8 endpoints, with none cooling, half cooling, and the first endpoint full (the job
falls back to the next), in one process with nothing else running; the whole cycle also
through the asyncio :meth:`Router.take` (no wait). Prints microseconds per job (median of
``--repeats`` runs of ``--jobs`` jobs) and jobs per second.

    PYTHONPATH=. .venv/bin/python bench/routing_bench.py [--jobs 100000] [--repeats 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from worker.control import Stopper  # noqa: E402
from worker.router import Router  # noqa: E402
from worker.routing import CooldownPolicy, pick  # noqa: E402

SIZES = (1, 3, 8)
"""Endpoints per route."""
FAR = 10.0 ** 9
"""A deadline no run reaches (monotonic seconds)."""


def _router(size: int, case: str) -> tuple[Router, list[str]]:
    names = [f"endpoint-{i}" for i in range(size)]
    router = Router(CooldownPolicy(), dict.fromkeys(names, 1 if case == "first_full" else 64),
                    clock=time.monotonic)
    if case == "half_cooling":
        for name in names[: size // 2]:
            router.cooldowns.failed(name, now=time.monotonic(), category="rate_limited", retry_after_s=FAR)
    if case == "first_full":
        router.slots.take(names[0])
    return router, names


def _sync_cycle(router: Router, names: list[str]) -> Callable[[], None]:
    def cycle() -> None:
        steps = router.plan(names)
        name = pick(steps, router.slots, "fallback")
        assert name is not None
        router.slots.take(name)
        router.give(name)
    return cycle


def _time(cycle: Callable[[], None], jobs: int) -> float:
    started = time.perf_counter()
    for _ in range(jobs):
        cycle()
    return (time.perf_counter() - started) / jobs * 1e6


async def _async_us(router: Router, names: list[str], jobs: int) -> float:
    stopper = Stopper()
    started = time.perf_counter()
    for _ in range(jobs):
        name = await router.take(names, (), "fallback", stopper, FAR)
        assert name is not None
        router.give(name)
    return (time.perf_counter() - started) / jobs * 1e6


def measure(jobs: int, repeats: int) -> list[dict[str, object]]:
    """Return one row per (route size, case, path): median us per job over ``repeats`` runs."""
    rows: list[dict[str, object]] = []
    for size in SIZES:
        for case in ("none_cooling", "half_cooling", "first_full"):
            if size == 1 and case != "none_cooling":
                continue
            sync = [_time(_sync_cycle(*_router(size, case)), jobs) for _ in range(repeats)]
            rows.append({"endpoints": size, "case": case, "path": "plan+pick+slot", "us_per_job":
                         statistics.median(sync)})
            loop = [asyncio.run(_async_us(*_router(size, case), jobs)) for _ in range(repeats)]
            rows.append({"endpoints": size, "case": case, "path": "Router.take+give", "us_per_job":
                         statistics.median(loop)})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per row (the median is printed)")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = measure(args.jobs, args.repeats)
    print(f"{'endpoints':>9}  {'case':<13} {'path':<17} {'us/job':>8} {'jobs/s':>11}")
    for row in rows:
        us = float(row["us_per_job"])  # type: ignore[arg-type]
        print(f"{row['endpoints']:>9}  {row['case']:<13} {row['path']:<17} {us:8.2f} {1e6 / us:11,.0f}")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
