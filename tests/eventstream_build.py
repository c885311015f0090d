"""Encode AWS event-stream messages, and build the Bedrock transcripts from their sources.

A test helper and the script that makes ``transcripts/bedrock_*/<case>.eventstream``:
each body is built from ``<case>.frames.jsonl`` beside it, one message per line, so a
reviewer reads JSON and can rebuild the bytes::

    .venv/bin/python -m tests.eventstream_build            # rewrite every .eventstream
    .venv/bin/python -m tests.eventstream_build --check    # exit 1 if one differs

A source line is one JSON object with exactly one of these keys:

``{"chunk": {...}}``
    InvokeModelWithResponseStream: an ``event`` message, ``:event-type chunk``, payload
    ``{"bytes": base64(<the Anthropic event JSON>)}``.
``{"chunk_text": "..."}``
    The same, with the text to base64 given verbatim (malformed events).
``{"event": "<type>", "payload": {...}}``
    ConverseStream: an ``event`` message of that ``:event-type``, the payload as JSON.
``{"exception": "<type>", "payload": {...}}``
    An ``exception`` message (``:exception-type``), the payload as JSON.
``{"error": {"code": "...", "message": "..."}}``
    An ``error`` message with ``:error-code`` and ``:error-message`` and no payload.

and optionally ``"corrupt": "prelude_crc" | "message_crc"`` (flip a CRC bit) or
``"cut": N`` (keep only the first N bytes: the body ends inside that message). JSON is
serialized compactly, non-ASCII kept as UTF-8. Follows the layout in
:mod:`worker.eventstream` (UPSTREAMS.md C.2).
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("bedrock_invoke", "bedrock_converse")
"""Transcript directories whose bodies are built here."""

Header = tuple[str, int, Any]
"""(name, value type 0-9, value) as the wire carries it."""


def encode_value(kind: int, value: Any) -> bytes:
    """Encode one header value of type ``kind`` (without the type byte)."""
    if kind in (0, 1):
        return b""
    if kind in (2, 3, 4, 5):
        return struct.pack({2: ">b", 3: ">h", 4: ">i", 5: ">q"}[kind], value)
    if kind in (6, 7):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return struct.pack(">H", len(raw)) + raw
    if kind == 8:
        millis = value if isinstance(value, int) else round(value.timestamp() * 1000)
        return struct.pack(">q", millis)
    assert kind == 9
    return uuid.UUID(str(value)).bytes


def encode_message(headers: list[Header], payload: bytes, *, corrupt: str | None = None) -> bytes:
    """Encode one message with correct CRCs (or one CRC flipped by ``corrupt``)."""
    head = b"".join(
        bytes([len(name.encode())]) + name.encode() + bytes([kind]) + encode_value(kind, value)
        for name, kind, value in headers
    )
    total = 12 + len(head) + len(payload) + 4
    first = struct.pack(">II", total, len(head))
    prelude_crc = zlib.crc32(first) ^ (1 if corrupt == "prelude_crc" else 0)
    body = first + struct.pack(">I", prelude_crc) + head + payload
    message_crc = zlib.crc32(body) ^ (1 if corrupt == "message_crc" else 0)
    return body + struct.pack(">I", message_crc)


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _typed(kind: str, name_header: str, name: str) -> list[Header]:
    return [(name_header, 7, name), (":content-type", 7, "application/json"), (":message-type", 7, kind)]


def message_of(line: dict[str, Any]) -> bytes:
    """Encode one source line (see the module docstring)."""
    corrupt = line.get("corrupt")
    if "chunk" in line or "chunk_text" in line:
        text = line["chunk_text"].encode() if "chunk_text" in line else _json(line["chunk"])
        payload = _json({"bytes": base64.b64encode(text).decode()})
        raw = encode_message(_typed("event", ":event-type", "chunk"), payload, corrupt=corrupt)
    elif "event" in line:
        raw = encode_message(_typed("event", ":event-type", line["event"]), _json(line["payload"]), corrupt=corrupt)
    elif "exception" in line:
        headers = _typed("exception", ":exception-type", line["exception"])
        raw = encode_message(headers, _json(line["payload"]), corrupt=corrupt)
    else:
        error = line["error"]
        headers = [(":error-code", 7, error["code"]), (":error-message", 7, error["message"]),
                   (":message-type", 7, "error")]
        raw = encode_message(headers, b"", corrupt=corrupt)
    return raw[: line["cut"]] if "cut" in line else raw


def build(source: Path) -> bytes:
    """Return the body built from one ``<case>.frames.jsonl`` source."""
    lines = [json.loads(text) for text in source.read_text(encoding="utf-8").splitlines() if text.strip()]
    return b"".join(message_of(line) for line in lines)


def sources() -> list[Path]:
    """Every ``.frames.jsonl`` source under the Bedrock transcript directories."""
    return sorted(p for name in DIRS for p in (ROOT / "transcripts" / name).glob("*.frames.jsonl"))


def target(source: Path) -> Path:
    """The ``.eventstream`` body built from ``source``."""
    return source.with_name(source.name.removesuffix(".frames.jsonl") + ".eventstream")


def main(argv: list[str] | None = None) -> int:
    """Rebuild (or, with ``--check``, compare) every Bedrock transcript body; return the exit status."""
    parser = argparse.ArgumentParser(description="Build transcripts/bedrock_*/*.eventstream from their sources.")
    parser.add_argument("--check", action="store_true", help="report bodies that differ instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        body, path = build(source), target(source)
        if args.check:
            if not path.exists() or path.read_bytes() != body:
                stale.append(path)
        else:
            path.write_bytes(body)
    for path in stale:
        print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

