"""``fanout replay``: normalize a recorded provider response body offline and print the events."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from schema.contract import encode_event
from schema.reducer import reduce, result_to_builtins
from schema.validate import validate
from worker.replay import TRANSCRIPT_DIRS, replay_reads, split_reads


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``replay`` options."""
    parser.add_argument("path", type=Path, help="response body file (transcripts/<dir>/<case>.sse), or - for stdin")
    parser.add_argument("--provider", choices=sorted(TRANSCRIPT_DIRS),
                        help="provider/framing directory name; default: the file's directory")
    parser.add_argument("--chunk", type=int, default=None, help="feed the body in reads of this many bytes")
    parser.add_argument("--result", action="store_true", help="print the assembled result instead of events")


def run(args: argparse.Namespace) -> int:
    """Replay one body; exit 0 when the events pass the validator, 1 otherwise."""
    kind = args.provider or (args.path.parent.name if str(args.path) != "-" else None)
    if kind not in TRANSCRIPT_DIRS:
        sys.stderr.write(f"fanout replay: say --provider (one of {', '.join(sorted(TRANSCRIPT_DIRS))})\n")
        return 2
    body = sys.stdin.buffer.read() if str(args.path) == "-" else args.path.read_bytes()
    provider, framing = TRANSCRIPT_DIRS[kind]
    sizes = [args.chunk] if args.chunk else None
    events, ignored = replay_reads(split_reads(body, sizes), provider=provider, framing=framing)
    out = sys.stdout
    if args.result:
        result = msgspec.json.encode(result_to_builtins(reduce(events)))
        out.write(msgspec.json.format(result, indent=2).decode() + "\n")
    else:
        for event in events:
            out.write(encode_event(event).decode() + "\n")
    if ignored:
        sys.stderr.write(f"ignored upstream events: {dict(ignored)}\n")
    violations = validate(events)
    for violation in violations:
        sys.stderr.write(f"invariant {violation.rule} broken at seq {violation.seq}: {violation.message}\n")
    return 1 if violations else 0
