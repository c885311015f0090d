"""Decoding + normalization throughput over every bundled transcript.

Run: ``.venv/bin/python bench/decode_bench.py [--rounds N] [--read-bytes N]``. Prints MB/s and
events/s for the whole pipeline (SSE/JSON-array decoder, adapter, normalizer) fed in reads of
``--read-bytes`` bytes, the way a worker sees a network body.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from worker.replay import replay_reads, split_reads, transcript_kind

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--read-bytes", type=int, default=1024)
    args = parser.parse_args()
    bodies = [(p, p.read_bytes()) for p in sorted((ROOT / "transcripts").glob("*/*.sse"))]
    total_bytes = total_events = 0
    started = time.perf_counter()
    for _ in range(args.rounds):
        for path, body in bodies:
            provider, framing = transcript_kind(path)
            events, _ = replay_reads(split_reads(body, [args.read_bytes]), provider=provider, framing=framing)
            total_bytes += len(body)
            total_events += len(events)
    elapsed = time.perf_counter() - started
    print(f"{len(bodies)} transcripts x {args.rounds} rounds, reads of {args.read_bytes} B")
    print(f"{total_bytes / elapsed / 1e6:.2f} MB/s, {total_events / elapsed:,.0f} events/s")


if __name__ == "__main__":
    main()
