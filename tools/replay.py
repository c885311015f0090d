"""Offline replay: a recorded response body through the pipeline, as ``fanout replay`` does.

Transcripts live in ``transcripts/<dir>/<case>.sse`` (Bedrock: ``<case>.eventstream``) beside their golden
``<case>.events.jsonl``; the directory names the provider API and framing
(:data:`TRANSCRIPT_DIRS`). Pure: no I/O beyond reading the given files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from schema.contract import Event
from worker.adapters.base import Framing
from worker.pipeline import build_pipeline

TRANSCRIPT_DIRS: Final[dict[str, tuple[str, Framing]]] = {
    "openai_chat": ("openai_chat", "sse"),
    "openai_responses": ("openai_responses", "sse"),
    "anthropic": ("anthropic", "sse"),
    "gemini_sse": ("gemini", "sse"),
    "gemini_json_array": ("gemini", "json_array"),
    "gemini_interactions": ("gemini_interactions", "sse"),
}
"""Transcript directory → (provider API, framing), for the APIs a worker serves."""

OFFLINE_DIRS: Final[dict[str, tuple[str, Framing]]] = {
    "bedrock_invoke": ("anthropic", "eventstream"),
    "bedrock_converse": ("bedrock_converse", "eventstream"),
}
"""Transcript directories replayed offline only: Bedrock bodies (``<case>.eventstream``,
built from ``<case>.frames.jsonl`` by ``tests/eventstream_build.py``) whose worker route
does not exist yet. They move to :data:`TRANSCRIPT_DIRS` when a worker serves them."""

BODY_SUFFIXES: Final = (".sse", ".eventstream")
"""File suffixes of transcript bodies."""

REPLAY_STREAM_ID: Final = "st_replay"
"""Stream id stamped on replayed events (goldens use it)."""
REPLAY_MODEL: Final = "replay-model"
"""Requested model stamped on replayed ``stream.start`` events."""


def split_reads(body: bytes, sizes: Iterable[int] | None) -> Iterator[bytes]:
    """Cut ``body`` into reads of the given sizes (cycled); ``None`` gives one read."""
    if sizes is None:
        yield body
        return
    cycle = [max(1, s) for s in sizes] or [len(body) or 1]
    pos, i = 0, 0
    while pos < len(body):
        size = cycle[i % len(cycle)]
        yield body[pos : pos + size]
        pos, i = pos + size, i + 1


def replay_reads(
    reads: Iterable[bytes],
    *,
    provider: str,
    framing: Framing = "sse",
    stream_id: str = REPLAY_STREAM_ID,
    model: str = REPLAY_MODEL,
) -> tuple[list[Event], Counter[str]]:
    """Feed reads through a fresh pipeline, end the body, and return (events, ignored counts).

    Timestamps are 0 so the output is byte-stable.
    """
    pipeline = build_pipeline(provider=provider, framing=framing, stream_id=stream_id, model=model, clock=lambda: 0)
    events = pipeline.start()
    for read in reads:
        events.extend(pipeline.feed(read))
    events.extend(pipeline.finish())
    return events, pipeline.adapter.ignored


def transcript_kind(path: Path) -> tuple[str, Framing]:
    """Return (provider, framing) for a transcript by its directory name.

    Raises:
        KeyError: The directory is not one of :data:`TRANSCRIPT_DIRS` or :data:`OFFLINE_DIRS`.
    """
    name = path.parent.name
    return TRANSCRIPT_DIRS[name] if name in TRANSCRIPT_DIRS else OFFLINE_DIRS[name]


def replay_file(path: Path, *, sizes: Iterable[int] | None = None) -> tuple[list[Event], Counter[str]]:
    """Replay one transcript file, optionally in reads of ``sizes`` bytes."""
    provider, framing = transcript_kind(path)
    return replay_reads(split_reads(path.read_bytes(), sizes), provider=provider, framing=framing)
