"""``fanout replay``: normalize a recorded provider response body offline and print the events.

``--provider`` takes the provider names jobs use (``openai_chat``, ``openai_responses``,
``anthropic``, ``gemini``); Gemini's framing is detected from the body (a JSON array
starts with ``[`` after any whitespace, anything else is SSE). The transcript directory
names ``gemini_sse`` and ``gemini_json_array`` stay accepted and force the framing;
``bedrock_converse`` and ``bedrock_invoke`` read Bedrock's binary event-stream bodies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

import msgspec

from schema.cli import EXIT_REFUSED, CommandError
from schema.contract import encode_event
from schema.job import PROVIDERS
from schema.reducer import reduce, result_to_builtins
from schema.validate import validate
from tools.replay import OFFLINE_DIRS, TRANSCRIPT_DIRS, replay_reads, split_reads
from worker.adapters.base import Framing

_DIRS: Final = {**TRANSCRIPT_DIRS, **OFFLINE_DIRS}
KINDS: Final = (*PROVIDERS, *(name for name in sorted(_DIRS) if name not in PROVIDERS))
"""Accepted ``--provider`` values: the job provider names, then the transcript directory names
(``bedrock_invoke``: Anthropic events in Bedrock's event-stream framing)."""


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= 1 (got {text!r})")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``replay`` options (``--chunk`` is a hidden alias of ``--chunk-size``)."""
    parser.add_argument("path", help="response body file (e.g. transcripts/anthropic/simple_text.sse), or - for stdin")
    parser.add_argument("--provider", choices=KINDS, metavar="PROVIDER",
                        help=f"{', '.join(PROVIDERS)} (gemini: framing detected from the body; gemini_sse and "
                             "gemini_json_array force it; bedrock_invoke: Anthropic events in Bedrock's binary "
                             "event-stream); default: the name of the file's directory")
    parser.add_argument("--chunk-size", type=_positive, metavar="BYTES", dest="chunk_size",
                        help="feed the body in reads of this many bytes (default: one read)")
    parser.add_argument("--chunk", type=_positive, dest="chunk_size", help=argparse.SUPPRESS)
    parser.add_argument("--result", action="store_true", help="print the assembled result instead of events")


def detect_framing(body: bytes) -> Framing:
    """Return ``json_array`` when ``body`` starts with ``[`` after whitespace, else ``sse``."""
    return "json_array" if body.lstrip()[:1] == b"[" else "sse"


def resolve_kind(kind: str, body: bytes) -> tuple[str, Framing]:
    """Return (provider API, framing) for a ``--provider`` value or directory name.

    Raises:
        KeyError: ``kind`` is neither a provider name nor a transcript directory.
    """
    if kind == "gemini":
        return "gemini", detect_framing(body)
    return _DIRS[kind]


def _example_in(directory: Path) -> str:
    """Return the path of a body file in ``directory`` or one level below, or a pattern when there is none.

    ``.sse`` files come before ``.eventstream`` (Bedrock) and ``.json`` ones (a ``.json``
    beside them is more often a request body than a Gemini array), the first by name of
    each; hidden entries are skipped. The search goes no deeper: ``fanout replay ~`` must not walk a home directory.
    """
    for pattern in ("*.sse", "*/*.sse", "*.eventstream", "*/*.eventstream", "*.json", "*/*.json"):
        try:
            found = sorted(p for p in directory.glob(pattern) if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(directory).parts))
        except OSError:
            continue
        if found:
            return str(found[0])
    return f"{str(directory).rstrip('/')}/<case>.sse"


def _read_body(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise CommandError(f"{path}: no such file; give a recorded response body (e.g. "
                           "transcripts/anthropic/simple_text.sse), or - for stdin") from exc
    except IsADirectoryError as exc:
        raise CommandError(f"{path}: is a directory; give one body file in it (e.g. {_example_in(Path(path))})"
                           ) from exc
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc


def run(args: argparse.Namespace) -> int:
    """Replay one body; exit 0 when the events pass the validator, 1 otherwise.

    Raises:
        CommandError: No provider could be told (exit 2), or the file cannot be read (exit 2).
    """
    body = _read_body(args.path)
    kind = args.provider or (Path(args.path).parent.name if args.path != "-" else None)
    if kind not in KINDS:
        raise CommandError(f"say which provider recorded the body: --provider {{{','.join(KINDS)}}} "
                           "(the file's directory names none)")
    provider, framing = resolve_kind(kind, body)
    sizes = [args.chunk_size] if args.chunk_size else None
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
    return EXIT_REFUSED if violations else 0
