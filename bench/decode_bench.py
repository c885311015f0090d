"""Decoding + normalization throughput: SSE, JSON array and AWS event-stream (Bedrock) side by side.

Run: ``PYTHONPATH=. .venv/bin/python bench/decode_bench.py [--rounds N] [--read-bytes N] [--deltas N]``.

Part 1 replays every bundled transcript (``transcripts/*/*.sse`` and the Bedrock
``*.eventstream`` bodies) through the whole pipeline (decoder, adapter, normalizer) in
reads of ``--read-bytes`` bytes, the way a worker sees a network body, and prints MB/s,
reads (chunks) per second and events/s per framing.

Part 2 streams one long answer of ``--deltas`` text deltas in three framings (Anthropic
SSE, Bedrock InvokeModelWithResponseStream for the same Anthropic events, Bedrock
ConverseStream) and prints provider events per second for the framing decoder alone
(:class:`~worker.sse.SSEDecoder`, :class:`~worker.eventstream.EventStreamDecoder`) and
for the whole pipeline, so the event-stream path and the Converse adapter can be compared
with the SSE path on the same content.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.eventstream_build import message_of
from tools.replay import replay_reads, split_reads, transcript_kind
from worker.adapters.base import Framing
from worker.eventstream import EventStreamDecoder
from worker.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[1]


def _group(path: Path) -> str:
    provider, framing = transcript_kind(path)
    return f"{framing} ({provider})" if framing == "eventstream" else framing


def transcripts(rounds: int, read_bytes: int) -> None:
    """Part 1: every bundled transcript, grouped by framing."""
    paths = sorted([*(ROOT / "transcripts").glob("*/*.sse"), *(ROOT / "transcripts").glob("*/*.eventstream")])
    totals: dict[str, list[float]] = {}
    for path in paths:
        body, (provider, framing) = path.read_bytes(), transcript_kind(path)
        reads = list(split_reads(body, [read_bytes]))
        started = time.perf_counter()
        for _ in range(rounds):
            events, _ = replay_reads(reads, provider=provider, framing=framing)
        row = totals.setdefault(_group(path), [0.0, 0, 0, 0, 0])
        row[0] += time.perf_counter() - started
        row[1], row[2], row[3], row[4] = row[1] + 1, row[2] + len(body) * rounds, row[3] + len(reads) * rounds, \
            row[4] + len(events) * rounds
    print(f"Part 1: bundled transcripts x {rounds} rounds, reads of {read_bytes} B")
    for name, (elapsed, files, size, reads_n, events_n) in sorted(totals.items()):
        print(f"  {name:32} {int(files):3} files  {size / elapsed / 1e6:6.2f} MB/s  "
              f"{reads_n / elapsed:10,.0f} chunks/s  {events_n / elapsed:10,.0f} events/s")


def _answer(deltas: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The same answer as Anthropic events and as Converse events (text pieces of ~12 bytes)."""
    pieces = [f"word{i % 97:02d} and " for i in range(deltas)]
    anthropic: list[dict[str, object]] = [
        {"type": "message_start", "message": {"id": "msg_b", "model": "m", "usage": {"input_tokens": 9}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in pieces),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": deltas}},
        {"type": "message_stop"},
    ]
    converse: list[dict[str, object]] = [
        {"event": "messageStart", "payload": {"role": "assistant"}},
        *({"event": "contentBlockDelta", "payload": {"contentBlockIndex": 0, "delta": {"text": p}}} for p in pieces),
        {"event": "contentBlockStop", "payload": {"contentBlockIndex": 0}},
        {"event": "messageStop", "payload": {"stopReason": "end_turn"}},
        {"event": "metadata", "payload": {"usage": {"inputTokens": 9, "outputTokens": deltas}}},
    ]
    return anthropic, converse


def _rate(label: str, frames: int, chunks: int, rounds: int, run: Callable[[], object]) -> None:
    started = time.perf_counter()
    for _ in range(rounds):
        run()
    elapsed = time.perf_counter() - started
    print(f"  {label:44} {chunks * rounds / elapsed:9,.0f} chunks/s "
          f"{frames * rounds / elapsed:10,.0f} provider events/s")


def _decode(framing: Framing, reads: list[bytes]) -> int:
    """Feed every read to one fresh framing decoder; return the frames it gave."""
    decoder = SSEDecoder() if framing == "sse" else EventStreamDecoder()
    return sum(len(decoder.feed(read)) for read in reads)


def long_answer(rounds: int, read_bytes: int, deltas: int) -> None:
    """Part 2: one long answer in three framings, decoder alone and whole pipeline."""
    anthropic, converse = _answer(deltas)
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in anthropic).encode()
    invoke = b"".join(message_of({"chunk": e}) for e in anthropic)
    conv = b"".join(message_of(e) for e in converse)
    bodies: list[tuple[str, bytes, str, Framing, int]] = [
        ("Anthropic SSE", sse, "anthropic", "sse", len(anthropic)),
        ("Bedrock invoke (event-stream, Anthropic events)", invoke, "anthropic", "eventstream", len(anthropic)),
        ("Bedrock ConverseStream (event-stream)", conv, "bedrock_converse", "eventstream", len(converse)),
    ]
    print(f"Part 2: one answer of {deltas} text deltas x {rounds} rounds, reads of {read_bytes} B")
    for label, body, provider, framing, frames in bodies:
        reads = list(split_reads(body, [read_bytes]))
        print(f"  {label}: {len(body):,} B, {len(reads):,} chunks")
        _rate("decoder alone", frames, len(reads), rounds, lambda: _decode(framing, reads))  # noqa: B023 - called before the next turn
        _rate("pipeline (decoder + adapter + normalizer)", frames, len(reads), rounds,
              lambda: replay_reads(reads, provider=provider, framing=framing))  # noqa: B023 - called before the next turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--read-bytes", type=int, default=1024)
    parser.add_argument("--deltas", type=int, default=2000)
    args = parser.parse_args()
    transcripts(args.rounds, args.read_bytes)
    long_answer(args.rounds, args.read_bytes, args.deltas)


if __name__ == "__main__":
    main()
