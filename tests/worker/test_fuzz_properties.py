"""Property tests of the byte-level pipeline, for every provider and framing.

The pipeline (``worker.pipeline``) is what the worker, ``fanout replay`` and these tests
drive: bytes in any read sizes, then the clean end of the body. Whatever the bytes, it
must never raise, must end with exactly one terminal event (the last event), must pass
``schema.validate`` (the five invariants of CONTRACT.md) and must not depend on where
the reads were cut. The properties:

1. random bytes (invalid UTF-8, CR/LF soup, ``data:`` lines with random payloads, JSON
   fragments, raw JSON objects, array punctuation) end ``failed``/``protocol`` or
   ``interrupted``/``transport``: the generators never carry a provider error object
   nor a terminal signal, so no other ending is possible (see :data:`RESERVED_KEYS`);
2. any transcript cut at any byte offset keeps the full body's events up to the cut
   and ends either exactly like the full body or ``interrupted``/``transport`` (or
   ``failed``/``protocol``) — with one documented exception, Gemini SSE (see the test);
3. a few flipped, inserted or deleted bytes in any transcript still give a sound stream;
4. the events do not depend on read boundaries for the bodies of 1 and 3 either;

plus the frame-size limit (``FANOUT_MAX_FRAME_BYTES``): reaching it exactly passes,
one byte past it ends ``failed``/``protocol`` with a message naming the limit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schema.contract import BlockStop, Event, StreamDone, StreamError
from schema.validate import validate
from worker.adapters.base import Framing
from worker.pipeline import build_pipeline
from worker.replay import REPLAY_MODEL, REPLAY_STREAM_ID, TRANSCRIPT_DIRS, replay_reads, split_reads
from worker.settings import load_worker_settings

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "transcripts").glob("*/*.sse")) + sorted(
    (ROOT / "tests" / "cases" / "transcripts").glob("*/*.sse")
)
KINDS: list[tuple[str, Framing]] = sorted(set(TRANSCRIPT_DIRS.values()))
"""Every (provider, framing) pair the pipeline serves."""
KIND_IDS = [f"{p}-{f}" for p, f in KINDS]

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Modest budgets: the whole file runs in seconds."""

BOUNDARY_ENDINGS = {("interrupted", "transport"), ("failed", "protocol")}
"""The only endings bytes without a provider error object or terminal signal can prove."""


# -- helpers ------------------------------------------------------------------------


def _kind(path: Path) -> tuple[str, Framing]:
    return TRANSCRIPT_DIRS[path.parent.name]


def _replay(body: bytes, kind: tuple[str, Framing], sizes: list[int] | None = None) -> list[Event]:
    provider, framing = kind
    events, _ = replay_reads(split_reads(body, sizes), provider=provider, framing=framing)
    return events


def _run(reads: list[bytes], kind: tuple[str, Framing], *, max_frame_bytes: int) -> list[Event]:
    provider, framing = kind
    pipeline = build_pipeline(provider=provider, framing=framing, stream_id=REPLAY_STREAM_ID, model=REPLAY_MODEL,
                              clock=lambda: 0, max_frame_bytes=max_frame_bytes)
    events = pipeline.start()
    for read in reads:
        events.extend(pipeline.feed(read))
    events.extend(pipeline.finish())
    return events


def _assert_sound(events: list[Event]) -> StreamDone | StreamError:
    """Validator clean, exactly one terminal and it is the last event; return it."""
    assert validate(events) == [], validate(events)
    terminals = [e for e in events if isinstance(e, StreamDone | StreamError)]
    assert len(terminals) == 1
    assert terminals[0] is events[-1]
    return terminals[0]


def _ending(event: StreamDone | StreamError) -> tuple[str, str]:
    if isinstance(event, StreamDone):
        return (event.status, "-")
    return (event.status, event.error.category)


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def _ends_on_blank_line(prefix: bytes) -> bool:
    """Whether ``prefix`` ends right after a blank line (an SSE event boundary).

    A reference splitter independent of ``worker.sse``: CRLF, CR or LF end a line, and a
    CR at the very end of the body ends one too (the LF that would follow never comes).
    """
    lines = _LINE_BREAK.split(prefix)
    return len(lines) >= 3 and lines[-1] == b"" and lines[-2] == b""


# -- generators ---------------------------------------------------------------------

RESERVED_KEYS = frozenset({"error", "type", "object", "finish_reason", "finishReason", "blockReason"})
"""Keys the random JSON never uses: they carry provider errors (``error``, vLLM's
``object: error``, OpenRouter's ``finish_reason: error``, Gemini's ``blockReason``) or
terminal signals (Chat's ``finish_reason``, Gemini's ``finishReason``, Anthropic's and
Responses' ``type``). ``type`` only appears with a value from :data:`SAFE_TYPES`."""

SAFE_TYPES = [
    "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "ping",
    "response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
    "response.content_part.added", "response.content_part.done", "response.output_text.delta",
    "response.output_text.done", "response.function_call_arguments.delta", "response.function_call_arguments.done",
    "response.reasoning_summary_text.delta", "response.reasoning_text.delta", "response.refusal.delta",
    "keepalive", "chat.completion.chunk", "text", "thinking", "tool_use", "text_delta", "input_json_delta",
    "signature_delta", "thinking_delta", "message", "function_call", "reasoning", "output_text",
]
"""``type`` values that neither end a stream nor report a provider error anywhere."""

_KEYS = st.sampled_from([
    "a", "id", "index", "delta", "content", "text", "choices", "candidates", "parts", "message", "model",
    "usage", "thought", "thoughtSignature", "functionCall", "name", "args", "willContinue", "partialArgs",
    "tool_calls", "function", "arguments", "reasoning_content", "refusal", "content_block", "item",
    "output_index", "content_index", "item_id", "response", "usageMetadata", "promptFeedback", "stop_reason",
    "input", "signature", "partial_json", "thinking", "call_id", "output", "status", "summary_index",
]) | st.text(max_size=6).filter(lambda k: k not in RESERVED_KEYS)

_SCALARS = (
    st.none() | st.booleans() | st.integers(-3, 3) | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
    | st.sampled_from(["", "[DONE]", "{", "}", "\\", '"', "\u2028", "\ud7ff", "STOP"])
)
_JSON: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=5),
    max_leaves=12,
)
_OBJECTS = st.builds(
    lambda obj, typ: {**obj, "type": typ} if typ is not None else obj,
    st.dictionaries(_KEYS, _JSON, max_size=6),
    st.none() | st.sampled_from(SAFE_TYPES),
)


def _encode(value: Any) -> bytes:
    return msgspec.json.encode(value)


_PAYLOADS = st.one_of(
    _OBJECTS.map(_encode),
    _JSON.map(_encode),
    st.tuples(_OBJECTS.map(_encode), st.integers(0, 200)).map(lambda t: t[0][: t[1]]),  # a JSON fragment
    st.binary(max_size=24),
    st.sampled_from([b"[DONE]", b"", b" ", b"{", b"}", b'"', b"\\", b"\xff\xfe", b"\xe2\x80", b"\xef\xbb\xbf"]),
)
_EVENT_NAMES = st.sampled_from(["message", "ping", "content_block_delta", "response.output_text.delta", "x"]) | (
    st.text(max_size=8).filter(
        lambda n: not any(w in n for w in ("error", "stop", "response.", "done", "cancel", "fail", "complete"))
    )
)
_EOL = st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n", b"\r\r"])
_PIECES = st.one_of(
    st.binary(max_size=32),
    _EOL,
    st.tuples(st.sampled_from([b"data:", b"data: ", b"data:  ", b"DATA:", b"data"]), _PAYLOADS, _EOL).map(b"".join),
    st.tuples(st.sampled_from([b"event:", b"event: "]), _EVENT_NAMES.map(str.encode), _EOL).map(b"".join),
    st.sampled_from([b": ping\n", b":\r\n", b"id: 7\n", b"id\n", b"retry: 10\n", b"retry: x\n", b"\xef\xbb\xbf"]),
    st.tuples(_OBJECTS.map(_encode), _EOL).map(b"".join),  # a raw JSON object line (SSE) / an element (array)
    st.sampled_from([b"[", b"]", b",", b" ", b"\t", b"[\n", b"\n,\r\n", b"\n]"]),
)
RANDOM_BODIES = st.lists(_PIECES, max_size=14).map(b"".join)
"""Bodies made of SSE and JSON-array shaped soup, never carrying an error object or terminal signal."""

READ_SIZES = st.lists(st.integers(1, 48), min_size=1, max_size=12)
"""Read sizes, cycled by :func:`worker.replay.split_reads`."""


@st.composite
def _corrupted(draw: st.DrawFn) -> tuple[Path, bytes]:
    path = draw(st.sampled_from(TRANSCRIPTS))
    body = bytearray(path.read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(body)))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip" and pos < len(body):
            body[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            body[pos:pos] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b"\n", b"\r", b"\n\n", b"{"]))
        else:
            del body[pos : pos + draw(st.integers(1, 4))]
    return path, bytes(body)


CORRUPTED = _corrupted()


# -- 1. random bytes ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@FUZZ
@given(body=RANDOM_BODIES, sizes=READ_SIZES)
def test_random_bytes_end_protocol_or_transport(kind: tuple[str, Framing], body: bytes, sizes: list[int]) -> None:
    """Random bytes in random reads: no exception, one terminal, last, validator clean.

    The generators never write an error object nor a terminal signal (see
    :data:`RESERVED_KEYS`), so the only endings are ``failed``/``protocol`` (the bytes
    broke the framing or the provider's protocol) and ``interrupted``/``transport``
    (the body ended without a terminal signal).
    """
    events = _replay(body, kind, sizes)
    terminal = _assert_sound(events)
    assert isinstance(terminal, StreamError)
    assert _ending(terminal) in BOUNDARY_ENDINGS, terminal


# -- 2. truncation ------------------------------------------------------------------


@st.composite
def _cuts(draw: st.DrawFn) -> tuple[Path, int]:
    path = draw(st.sampled_from(TRANSCRIPTS))
    size = len(path.read_bytes())
    cut = draw(st.one_of(
        st.integers(0, size),
        st.integers(max(0, size - 120), size),  # inside or around the last events
    ))
    return path, cut


@FUZZ
@given(case=_cuts(), sizes=READ_SIZES)
def test_truncation_at_any_offset(case: tuple[Path, int], sizes: list[int]) -> None:
    """A transcript cut after ``cut`` bytes (the connection closed cleanly there), fed in random reads.

    Asserted, with ``full`` the events of the whole body and ``cut_events`` those of the
    prefix:

    * no exception; the validator finds nothing; exactly one terminal, the last event;
    * ``cut_events == full``: the cut came after the event that proved the full body's
      terminal (``stream.done``, or a ``stream.error`` of any category, e.g. a provider
      error earlier than the cut, which the prefix then carries whole); or
    * the cut came first: every event but the terminal is the full body's event at the
      same place (a prefix never invents, reorders or renumbers output, and a partial
      frame is never parsed), and the terminal is a ``stream.error``
      ``interrupted``/``transport`` (no terminal signal before the cut) or
      ``failed``/``protocol``; or
    * Gemini SSE only: a ``finishReason`` is proven by the clean end of the body, and a
      cut exactly on an event boundary after the ``finishReason`` chunk *is* a clean end
      (the bytes cannot tell it apart from a complete response), so the prefix may end
      ``stream.done`` with the full body's ``finish_reason``, after closing its blocks.
      A cut anywhere inside an event (the last one included) still ends ``interrupted``.
    """
    path, cut = case
    kind = _kind(path)
    body = path.read_bytes()
    full = _replay(body, kind)
    cut_events = _replay(body[:cut], kind, sizes)
    terminal = _assert_sound(cut_events)
    if cut_events == full:
        return
    before = cut_events[:-1]
    if isinstance(terminal, StreamDone):
        assert path.parent.name == "gemini_sse", (path.name, cut, terminal)
        assert _ends_on_blank_line(body[:cut]), (path.name, cut)
        assert terminal.finish_reason == full[-1].finish_reason  # type: ignore[union-attr]
        while before and isinstance(before[-1], BlockStop):  # the blocks the clean end closed
            before.pop()
    else:
        assert _ending(terminal) in BOUNDARY_ENDINGS, (path.name, cut, terminal)
    assert before == full[: len(before)], (path.name, cut)


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in TRANSCRIPTS])
def test_cut_inside_the_last_event_is_never_done(path: Path) -> None:
    """A cut one byte before the end, in every transcript, never proves a normal end it did not see.

    For a body whose last byte ends its last event, losing that byte leaves the event
    unfinished: the result is the full body's (the terminal came earlier) or an
    ``interrupted``/``transport`` (or ``failed``/``protocol``) ``stream.error``, for every
    provider, Gemini SSE included.
    """
    kind = _kind(path)
    body = path.read_bytes()
    full = _replay(body, kind)
    for cut in range(max(0, len(body) - 4), len(body)):
        if _ends_on_blank_line(body[:cut]):
            continue
        events = _replay(body[:cut], kind, [1])
        terminal = _assert_sound(events)
        if events != full:
            assert _ending(terminal) in BOUNDARY_ENDINGS, (cut, terminal)


# -- 3. corruption ------------------------------------------------------------------


@FUZZ
@given(case=CORRUPTED, sizes=READ_SIZES)
def test_corrupted_transcripts_stay_sound(case: tuple[Path, bytes], sizes: list[int]) -> None:
    """Flipped, inserted and deleted bytes: no exception, validator clean, one terminal, last."""
    path, body = case
    _assert_sound(_replay(body, _kind(path), sizes))


# -- 4. read boundaries -------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@FUZZ
@given(body=RANDOM_BODIES, sizes=READ_SIZES)
def test_random_bytes_independent_of_read_boundaries(kind: tuple[str, Framing], body: bytes,
                                                     sizes: list[int]) -> None:
    """The events of a random body are the same in one read, in random reads and in 1-byte reads."""
    whole = _replay(body, kind)
    assert _replay(body, kind, sizes) == whole
    assert _replay(body, kind, [1]) == whole


@FUZZ
@given(case=CORRUPTED, sizes=READ_SIZES)
def test_corrupted_transcripts_independent_of_read_boundaries(case: tuple[Path, bytes], sizes: list[int]) -> None:
    """The events of a corrupted transcript are the same in one read, random reads and 1-byte reads."""
    path, body = case
    whole = _replay(body, _kind(path))
    assert _replay(body, _kind(path), sizes) == whole
    assert _replay(body, _kind(path), [1]) == whole


# -- the frame-size limit -----------------------------------------------------------

_LIMIT_READS = [None, [1], [7, 3, 64]]


def _limit_outcomes(body: bytes, kind: tuple[str, Framing], limit: int) -> list[list[Event]]:
    return [_run(list(split_reads(body, sizes)), kind, max_frame_bytes=limit) for sizes in _LIMIT_READS]


def _chat_body(content: str) -> tuple[bytes, int]:
    """A complete Chat body whose longest line is its first ``data:`` line; (body, that line's size)."""
    first = b'data: {"choices":[{"index":0,"delta":{"content":' + _encode(content) + b"}}]}"
    body = (first + b"\n\n"
            + b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
            + b"data: [DONE]\n\n")
    return body, len(first)


def _array_body(text: str) -> tuple[bytes, int]:
    """A complete Gemini JSON-array body whose largest element is the first; (body, its size)."""
    first = b'{"candidates":[{"content":{"parts":[{"text":' + _encode(text) + b"}]},\"index\":0}]}"
    body = (b"[" + first + b'\n,\r\n{"candidates":[{"content":{"parts":[]},"finishReason":"STOP"}]}\n]')
    return body, len(first)


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (_chat_body, ("openai_chat", "sse"), "SSE line exceeds max_frame_bytes={limit} bytes (still unterminated at the limit)"),
        (_array_body, ("gemini", "json_array"), "JSON array element exceeds max_element_bytes={limit} bytes"),
    ],
    ids=["sse", "json_array"],
)
@pytest.mark.parametrize("content", ["x" * 1500, "é" * 700 + "x", "\u65e5\u672c" * 400])
def test_frame_limit_passes_at_the_limit_and_fails_past_it(make: Any, kind: tuple[str, Framing], message: str,
                                                           content: str) -> None:
    """``FANOUT_MAX_FRAME_BYTES`` reached exactly passes; one byte less ends ``failed``/``protocol``.

    The limit counts bytes (multi-byte UTF-8 included), excludes the line terminator
    (SSE) and the separators (array), and the outcome does not depend on read sizes.
    """
    body, size = make(content)
    limit = load_worker_settings({"FANOUT_MAX_FRAME_BYTES": str(size)}).max_frame_bytes
    assert limit == size
    for events in _limit_outcomes(body, kind, limit):
        terminal = _assert_sound(events)
        assert isinstance(terminal, StreamDone), terminal
        assert (terminal.status, terminal.finish_reason) == ("completed", "stop")
    outcomes = _limit_outcomes(body, kind, limit - 1)
    for events in outcomes:
        terminal = _assert_sound(events)
        assert isinstance(terminal, StreamError)
        assert _ending(terminal) == ("failed", "protocol")
        assert terminal.error.retryable is False
        assert terminal.error.message == message.format(limit=limit - 1)
        assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    assert outcomes[1:] == outcomes[:-1]


def test_frame_limit_counts_an_sse_events_joined_data() -> None:
    r"""An event's ``data`` lines joined with ``\n`` may reach the limit, not pass it; lines alone are shorter."""
    lines = [b'{"type":"ping",', b'"pad":"' + b"p" * 1200 + b'",', b'"more":"' + b"q" * 1200 + b'"}']
    data_size = sum(len(x) for x in lines) + len(lines) - 1
    body = (b"event: ping\n" + b"".join(b"data: " + x + b"\n" for x in lines) + b"\n"
            + b'data: {"type":"message_start","message":{"id":"m1","model":"c"}}\n\n'
            + b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n'
            + b'data: {"type":"message_stop"}\n\n')
    kind = ("anthropic", "sse")
    for events in _limit_outcomes(body, kind, data_size):
        terminal = _assert_sound(events)
        assert isinstance(terminal, StreamDone), terminal
    outcomes = _limit_outcomes(body, kind, data_size - 1)
    for events in outcomes:
        terminal = _assert_sound(events)
        assert isinstance(terminal, StreamError)
        assert _ending(terminal) == ("failed", "protocol")
        assert terminal.error.message == f"SSE event data exceeds max_frame_bytes={data_size - 1} bytes"
    assert outcomes[1:] == outcomes[:-1]


@FUZZ
@given(path=st.sampled_from(TRANSCRIPTS), limit=st.integers(1, 2048), sizes=READ_SIZES)
def test_any_frame_limit_gives_the_full_events_or_a_protocol_failure(path: Path, limit: int,
                                                                      sizes: list[int]) -> None:
    """Under any limit a transcript replays as without it, or fails ``protocol`` naming the limit.

    Before the failure, the events are the unlimited ones; the outcome does not depend
    on read sizes.
    """
    kind = _kind(path)
    body = path.read_bytes()
    full = _replay(body, kind)
    whole = _run([body], kind, max_frame_bytes=limit)
    assert _run(list(split_reads(body, sizes)), kind, max_frame_bytes=limit) == whole
    terminal = _assert_sound(whole)
    if whole == full:
        return
    assert isinstance(terminal, StreamError)
    assert _ending(terminal) == ("failed", "protocol")
    assert f"max_frame_bytes={limit} bytes" in terminal.error.message or (
        f"max_element_bytes={limit} bytes" in terminal.error.message
    )
    assert whole[:-1] == full[: len(whole) - 1]
