"""Failover of a Redis Cluster master while streams run: how many streams end whole, explicit, or not at all.

Run: ``.venv/bin/python bench/failover_bench.py [--streams N] [--runs R]``. Each run starts a
private 3-master, 3-replica cluster on loopback (the machine's ``redis-server``), one worker,
one publisher and one SSE reader per stream, SIGKILLs the master holding most streams once
all run, and prints the figures of :class:`tests.worker.failover.Figures`: streams whole,
ended with an explicit error, unfinished, and readers with a silent gap (must be 0), plus
how long the promotion took. Bounded: ``--runs`` runs of ``--streams`` five-second streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the scenario lives beside the tests

from tests.worker.failover import run_failover


def main() -> None:
    """Parse arguments, run the scenario, print one table row per run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=12, help="concurrent streams per run")
    parser.add_argument("--runs", type=int, default=1, help="independent runs (a fresh cluster each)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| run | streams | on killed master | promoted after s | whole | explicit error | unfinished | "
          "silent gaps | readers 410/gap | reader events lost by storage |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in range(1, args.runs + 1):
        f = asyncio.run(run_failover(args.streams))
        print(f"| {run} | {f.streams} | {f.streams_on_killed_master} | {f.promoted_after_s} | {f.whole} | "
              f"{f.explicit_error} | {f.unfinished} | {f.silent_gaps} | {f.readers_with_410_or_gap} | "
              f"{f.reader_events_lost_by_storage} |")
        for error in sorted(set(f.errors)):
            print(f"  explicit error: {error}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
