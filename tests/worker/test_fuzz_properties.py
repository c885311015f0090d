"""Property tests of the byte-level pipeline, for every provider and framing.

The pipeline (``worker.pipeline``) is what the worker, ``fanout replay`` and these tests
drive: bytes in any read sizes, then the clean end of the body. Whatever the bytes, it
must never raise, must end with exactly one terminal event (the last event), must pass
``schema.validate`` (the five invariants of CONTRACT.md), must emit only events that
survive ``encode_event``/``decode_event``, and must not depend on where the reads were
cut. The properties:

1. random bodies (invalid UTF-8, CR/LF soup, ``data:`` lines with random payloads, JSON
   fragments, raw JSON objects, array punctuation, and well-framed provider-shaped
   payloads with random values) end ``failed``/``protocol`` or ``interrupted``/
   ``transport``: the generators never carry a provider error object nor a terminal
   signal, so no other ending is possible (see :data:`RESERVED_KEYS`);
2. any transcript (both directories) cut at any byte offset keeps the full body's events
   up to the cut and ends exactly like the full body or ``interrupted``/``transport``,
   except Gemini SSE cut on an event boundary (see the test's docstring);
3. a few flipped, inserted or deleted bytes in any transcript still give a sound stream;
4. the events do not depend on read boundaries for the bodies of 1 and 3 either;

plus the frame-size limit (``FANOUT_MAX_FRAME_BYTES``): reaching it exactly passes,
one byte past it ends ``failed``/``protocol`` with a message naming the limit, and the
regression tests of the bugs these properties found.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schema.contract import BlockStop, Event, StreamDone, StreamError, decode_event, encode_event
from schema.validate import validate
from tools.replay import REPLAY_MODEL, REPLAY_STREAM_ID, TRANSCRIPT_DIRS, replay_reads, split_reads, transcript_kind
from worker.adapters.base import Framing
from worker.pipeline import build_pipeline
from worker.settings import load_worker_settings

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "transcripts").glob("*/*.sse")) + sorted(
    (ROOT / "tests" / "cases" / "transcripts").glob("*/*.sse")
)
KINDS: list[tuple[str, Framing]] = sorted(set(TRANSCRIPT_DIRS.values()))
"""Every (provider, framing) pair the pipeline serves."""
KIND_IDS = [f"{p}-{f}" for p, f in KINDS]

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Modest budgets (per provider/framing where parametrized): the whole file runs in about 25 s."""
FUZZ_TRANSCRIPTS = settings(FUZZ, max_examples=200)
"""Transcript-based properties are cheap per example and cover 178 files."""

BOUNDARY_ENDINGS = {("interrupted", "transport"), ("failed", "protocol")}
"""The only endings bytes without a provider error object or terminal signal can prove."""


# -- helpers ------------------------------------------------------------------------


def _kind(path: Path) -> tuple[str, Framing]:
    return transcript_kind(path)


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
    for event in events:  # what the worker stores, a consumer can read back
        assert decode_event(encode_event(event)) == event
    return terminals[0]


def _ending(event: StreamDone | StreamError) -> tuple[str, str]:
    if isinstance(event, StreamDone):
        return (event.status, "-")
    return (event.status, event.error.category)


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def _ends_on_line_break(prefix: bytes) -> bool:
    """Whether ``prefix`` ends right after a line terminator (same reference splitter as below).

    Such a prefix ends cleanly for the SSE decoder: a pending event whose lines were all
    terminated is dispatched when its data decodes whole (PROVIDERS.md 1, amended), and
    the body counts as cut otherwise.
    """
    lines = _LINE_BREAK.split(prefix)
    return len(lines) >= 2 and lines[-1] == b""


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


# Provider-shaped payloads: random values in the shapes each adapter reads, so the
# fuzzing reaches blocks, deltas, tool calls and settlement, not only parse errors.
# ``terminals=False`` leaves out every key and ``type`` that proves an end or carries a
# provider error; ``terminals=True`` adds them (used where any ending is allowed).

_TEXT = st.text(max_size=6) | st.sampled_from(["", "a", "{", '{"k":', "1}", "\u00e9", "\U0001f600", "\n"])
_SMALL = st.integers(0, 3)
_IDS = st.sampled_from(["i0", "i1", "i2", "", "call_1"])
_USAGE_NUMBERS = st.integers(-1, 10) | st.integers() | st.none() | st.text(max_size=2) | st.booleans()


def _some(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict holding a random subset of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


def _chat(terminals: bool) -> st.SearchStrategy[Any]:
    tool = _some(index=_SMALL, id=_IDS, type=st.just("function"),
                 function=_some(name=_TEXT, arguments=_TEXT | _JSON))
    delta = st.fixed_dictionaries({"content": _TEXT | st.none()}) | _some(
        content=_TEXT | st.none(), refusal=_TEXT, reasoning_content=_TEXT, reasoning=_TEXT,
        tool_calls=st.lists(tool, max_size=3), role=st.just("assistant"),
        function_call=_some(name=_TEXT, arguments=_TEXT))
    choice = {"index": st.sampled_from([0, 0, 0, 1, None]), "delta": delta | st.none()}
    if terminals:
        choice["finish_reason"] = st.sampled_from([None, "stop", "length", "tool_calls", "content_filter",
                                                   "error", "weird", 3])
    usage = _some(prompt_tokens=_USAGE_NUMBERS, completion_tokens=_USAGE_NUMBERS,
                  prompt_tokens_details=_some(cached_tokens=_USAGE_NUMBERS),
                  completion_tokens_details=_some(reasoning_tokens=_USAGE_NUMBERS))
    chunk = st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries(choice), min_size=1, max_size=2)},
                                  optional={"id": _IDS, "model": _TEXT, "usage": usage | st.none()})
    if not terminals:
        return chunk
    error = _some(message=_TEXT, code=st.sampled_from(["server_error", 429, "x", None]), type=_TEXT)
    return chunk | st.builds(lambda e: {"error": e}, error) | st.just("[DONE]")


def _anthropic(terminals: bool) -> st.SearchStrategy[Any]:
    block = st.sampled_from(["text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "x"])
    usage = _some(input_tokens=_USAGE_NUMBERS, output_tokens=_USAGE_NUMBERS,
                  cache_read_input_tokens=_USAGE_NUMBERS, cache_creation_input_tokens=_USAGE_NUMBERS)
    delta_type = st.sampled_from(["text_delta", "thinking_delta", "signature_delta", "input_json_delta",
                                  "citations_delta"])
    shapes = [
        st.fixed_dictionaries({"type": st.just("message_start"),
                               "message": _some(id=st.sampled_from(["m1", "m2"]), model=_TEXT, usage=usage)}),
        st.fixed_dictionaries({"type": st.just("content_block_start"), "index": _SMALL,
                               "content_block": st.builds(lambda t, rest: {"type": t, **rest}, block, _some(
                                   text=_TEXT, thinking=_TEXT, signature=_TEXT, data=_TEXT, id=_IDS, name=_TEXT,
                                   input=st.dictionaries(_KEYS, _SCALARS, max_size=2)))}),
        st.fixed_dictionaries({"type": st.just("content_block_delta"), "index": _SMALL,
                               "delta": st.builds(lambda t, rest: {"type": t, **rest}, delta_type, _some(
                                   text=_TEXT, thinking=_TEXT, signature=_TEXT, partial_json=_TEXT))}),
        st.fixed_dictionaries({"type": st.just("content_block_stop"), "index": _SMALL}),
        st.fixed_dictionaries({"type": st.just("message_delta"), "usage": usage,
                               "delta": _some(stop_reason=st.sampled_from(["end_turn", "max_tokens", "tool_use",
                                                                           "refusal", "pause_turn", "odd"]))}),
        st.just({"type": "ping"}),
    ]
    if terminals:
        shapes += [st.just({"type": "message_stop"}),
                   st.builds(lambda t: {"type": "error", "error": {"type": t, "message": "m"}},
                             st.sampled_from(["overloaded_error", "api_error", "x"]))]
    return st.one_of(shapes)


def _responses(terminals: bool) -> st.SearchStrategy[Any]:
    item_type = st.sampled_from(["message", "reasoning", "function_call", "web_search_call"])
    part = st.builds(lambda t, rest: {"type": t, **rest}, st.sampled_from(["output_text", "refusal", "x"]),
                     _some(text=_TEXT, refusal=_TEXT))
    item = st.builds(lambda t, rest: {"type": t, **rest}, item_type, _some(
        id=_IDS, call_id=_IDS, name=_TEXT, arguments=_TEXT, encrypted_content=_TEXT,
        content=st.lists(part, max_size=2),
        summary=st.lists(_some(type=st.just("summary_text"), text=_TEXT), max_size=2)))
    where = {"item_id": _IDS, "output_index": _SMALL, "content_index": _SMALL, "summary_index": _SMALL}
    shapes = [
        st.fixed_dictionaries({"type": st.sampled_from(["response.created", "response.in_progress"]),
                               "response": _some(id=_IDS, model=_TEXT)}),
        st.fixed_dictionaries({"type": st.sampled_from(["response.output_item.added", "response.output_item.done"]),
                               "output_index": _SMALL, "item": item}),
        st.fixed_dictionaries({"type": st.sampled_from(["response.content_part.added", "response.content_part.done"]),
                               "part": part}, optional=where),
        st.fixed_dictionaries({"type": st.sampled_from([
            "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta",
            "response.reasoning_summary_text.delta", "response.reasoning_text.delta"]), "delta": _TEXT},
            optional=where),
        st.fixed_dictionaries({"type": st.sampled_from([
            "response.output_text.done", "response.refusal.done", "response.function_call_arguments.done",
            "response.reasoning_summary_text.done", "response.reasoning_text.done"])},
            optional={**where, "text": _TEXT, "refusal": _TEXT, "arguments": _TEXT, "name": _TEXT}),
    ]
    if terminals:
        response = _some(id=_IDS, status=st.sampled_from(["completed", "incomplete", "failed", "x"]),
                         output=st.lists(item, max_size=2),
                         usage=_some(input_tokens=_USAGE_NUMBERS, output_tokens=_USAGE_NUMBERS),
                         incomplete_details=_some(reason=st.sampled_from(["max_output_tokens", "content_filter"])),
                         error=_some(code=_TEXT, message=_TEXT))
        shapes += [st.fixed_dictionaries({"type": st.sampled_from([
            "response.completed", "response.incomplete", "response.failed", "response.cancelled", "response.done"]),
            "response": response}), st.just({"type": "error", "code": "server_error", "message": "m"})]
    return st.one_of(shapes)


def _gemini(terminals: bool) -> st.SearchStrategy[Any]:
    piece = _some(jsonPath=st.sampled_from(["$.a", "$.a.b", "$.n[0]", "$.n[2]", "$['k']", "$", "x", "$.a[0].b"]),
                  stringValue=_TEXT, numberValue=st.integers(-2, 2), boolValue=st.booleans(), nullValue=st.none(),
                  willContinue=st.booleans())
    call = _some(name=_TEXT, id=_IDS, args=st.dictionaries(_KEYS, _SCALARS, max_size=2) | _SCALARS,
                 willContinue=st.booleans(), partialArgs=st.lists(piece, max_size=3))
    part = _some(text=_TEXT, thought=st.booleans(), thoughtSignature=_TEXT, functionCall=call,
                 executableCode=_some(code=_TEXT))
    text_part = st.fixed_dictionaries({"text": _TEXT}, optional={"thought": st.booleans(), "thoughtSignature": _TEXT})
    candidate = {"index": st.sampled_from([0, 0, 0, 1]),
                 "content": st.fixed_dictionaries({"parts": st.lists(text_part | part, max_size=3)})}
    if terminals:
        candidate["finishReason"] = st.sampled_from(["", "STOP", "MAX_TOKENS", "SAFETY", "OTHER"])
    usage = _some(promptTokenCount=_USAGE_NUMBERS, candidatesTokenCount=_USAGE_NUMBERS,
                  thoughtsTokenCount=_USAGE_NUMBERS)
    chunk = st.fixed_dictionaries({"candidates": st.lists(st.fixed_dictionaries(candidate), min_size=1, max_size=2)},
                                  optional={"usageMetadata": usage, "responseId": _IDS, "modelVersion": _TEXT})
    if not terminals:
        return chunk
    error = _some(code=st.sampled_from([400, 429, 500, 503]), message=_TEXT, status=_TEXT)
    return chunk | st.builds(lambda e: {"error": e}, error) | st.just({"promptFeedback": {"blockReason": "SAFETY"}})


def _interactions(terminals: bool) -> st.SearchStrategy[Any]:
    """Gemini Interactions events: steps of any type at small indexes, deltas of any type, and the ends."""
    index = st.integers(0, 2)
    step = _some(type=st.sampled_from(["model_output", "thought", "function_call", "google_search_call"]),
                 id=_IDS, name=_TEXT, signature=_TEXT, arguments=st.dictionaries(_KEYS, _SCALARS, max_size=2))
    delta = _some(type=st.sampled_from(["text", "thought_summary", "thought_signature", "arguments_delta", "x"]),
                  text=_TEXT, arguments=_TEXT, signature=_TEXT, content=_some(text=_TEXT))
    usage = _some(total_input_tokens=_USAGE_NUMBERS, total_output_tokens=_USAGE_NUMBERS)
    events = [st.fixed_dictionaries({"event_type": st.just("step.start"), "index": index, "step": step}),
              st.fixed_dictionaries({"event_type": st.just("step.delta"), "index": index, "delta": delta}),
              st.fixed_dictionaries({"event_type": st.just("step.stop"), "index": index}, optional={"usage": usage}),
              st.fixed_dictionaries({"event_type": st.just("interaction.created"),
                                     "interaction": _some(id=_IDS, model=_TEXT)})]
    if terminals:
        status = st.sampled_from(["completed", "requires_action", "incomplete", "failed", "cancelled", "queued"])
        events += [st.fixed_dictionaries({"event_type": st.just("interaction.completed"),
                                          "interaction": _some(status=status, usage=usage)}),
                   st.fixed_dictionaries({"event_type": st.just("interaction.status_update"), "status": status}),
                   st.fixed_dictionaries({"event_type": st.just("error"),
                                          "error": _some(code=st.sampled_from([429, "SAFETY", "INTERNAL"]))})]
    return st.one_of(*events).map(lambda e: {**e, "event_id": "e"})


@st.composite
def _anthropic_script(draw: st.DrawFn, terminals: bool) -> list[Any]:
    """A mostly coherent Anthropic message: start, blocks with fitting deltas, stop reason."""
    fits = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
            "tool_use": ("input_json_delta", "partial_json"), "redacted_thinking": ("signature_delta", "signature"),
            "server_tool_use": ("input_json_delta", "partial_json")}
    out: list[Any] = [{"type": "message_start", "message": {"id": "m1", "model": "c", "usage": {"input_tokens": 1}}}]
    for index, block in enumerate(draw(st.lists(st.sampled_from(sorted(fits)), max_size=3))):
        out.append({"type": "content_block_start", "index": index,
                    "content_block": {"type": block, "id": f"t{index}", "name": "f", "input": {}}})
        delta_type, field = fits[block]
        for piece in draw(st.lists(_TEXT, max_size=3)):
            out.append({"type": "content_block_delta", "index": index, "delta": {"type": delta_type, field: piece}})
        if draw(st.booleans()):
            out.append({"type": "content_block_stop", "index": index})
    out.append({"type": "message_delta", "delta": {"stop_reason": draw(st.sampled_from(["end_turn", "max_tokens",
                                                                                       "tool_use"]))}})
    if terminals and draw(st.booleans()):
        out.append({"type": "message_stop"})
    return out


@st.composite
def _responses_script(draw: st.DrawFn, terminals: bool) -> list[Any]:
    """A mostly coherent Responses stream: items with their parts, deltas and ``.done`` events."""
    out: list[Any] = [{"type": "response.created", "response": {"id": "r1", "model": "g"}}]
    finals: list[Any] = []
    for n, kind in enumerate(draw(st.lists(st.sampled_from(["message", "function_call", "reasoning"]),
                                           max_size=3))):
        item_id = f"i{n}"
        where = {"item_id": item_id, "output_index": n}
        out.append({"type": "response.output_item.added", "output_index": n,
                    "item": {"type": kind, "id": item_id, "call_id": f"c{n}", "name": "f"}})
        pieces = draw(st.lists(_TEXT, max_size=3))
        full = "".join(pieces) + draw(st.sampled_from(["", "", "x"]))
        if kind == "message":
            part_type = draw(st.sampled_from(["output_text", "refusal"]))
            field = "text" if part_type == "output_text" else "refusal"
            event = "response.output_text" if part_type == "output_text" else "response.refusal"
            out.append({"type": "response.content_part.added", **where, "content_index": 0,
                        "part": {"type": part_type, field: ""}})
            out += [{"type": f"{event}.delta", **where, "content_index": 0, "delta": p} for p in pieces]
            out.append({"type": f"{event}.done", **where, "content_index": 0, field: full})
            done = {"type": kind, "id": item_id, "content": [{"type": part_type, field: full}]}
        elif kind == "function_call":
            out += [{"type": "response.function_call_arguments.delta", **where, "delta": p} for p in pieces]
            out.append({"type": "response.function_call_arguments.done", **where, "arguments": full})
            done = {"type": kind, "id": item_id, "call_id": f"c{n}", "name": "f", "arguments": full}
        else:
            out += [{"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": p}
                    for p in pieces]
            done = {"type": kind, "id": item_id, "summary": [{"type": "summary_text", "text": full}],
                    "encrypted_content": draw(_TEXT)}
        finals.append(done)
        if draw(st.booleans()):
            out.append({"type": "response.output_item.done", "output_index": n, "item": done})
    if terminals and draw(st.booleans()):
        name = draw(st.sampled_from(["response.completed", "response.incomplete"]))
        out.append({"type": name, "response": {"id": "r1", "status": name.split(".")[1], "output": finals,
                                               "incomplete_details": {"reason": "max_output_tokens"}}})
    return out


_SHAPES = {"openai_chat": _chat, "anthropic": _anthropic, "openai_responses": _responses, "gemini": _gemini,
           "gemini_interactions": _interactions}
_SCRIPTS = {"anthropic": _anthropic_script, "openai_responses": _responses_script}


def shaped_bodies(kind: tuple[str, Framing], *, terminals: bool) -> st.SearchStrategy[bytes]:
    """Well-framed bodies of provider-shaped payloads, with some random soup mixed in."""
    provider, framing = kind
    payload = _SHAPES[provider](terminals).map(lambda v: v.encode() if isinstance(v, str) else _encode(v))
    soup = _PIECES
    if framing == "json_array":
        element = st.one_of(payload, payload, payload, soup)
        return st.tuples(st.lists(element, max_size=12), st.sampled_from([b"]", b"\n]", b""]),
                         st.sampled_from([b",", b"\n,\r\n"])).map(lambda t: b"[" + t[2].join(t[0]) + t[1])
    event = st.tuples(st.sampled_from([b"data: ", b"data:"]), payload,
                      st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"])).map(b"".join)
    random_events = st.lists(st.one_of(event, event, event, soup), max_size=14).map(b"".join)
    if provider not in _SCRIPTS:
        return random_events
    script = st.tuples(_SCRIPTS[provider](terminals), st.lists(st.tuples(st.integers(0, 30), event), max_size=2))
    return random_events | script.map(_frame_script)


def _frame_script(script: tuple[list[Any], list[tuple[int, bytes]]]) -> bytes:
    """SSE-frame a scripted payload list and insert a few random events into it."""
    payloads, noise = script
    events = [b"data: " + _encode(p) + b"\n\n" for p in payloads]
    for at, extra in noise:
        events.insert(at % (len(events) + 1), extra)
    return b"".join(events)


READ_SIZES = st.lists(st.integers(1, 48), min_size=1, max_size=12)
"""Read sizes, cycled by :func:`tools.replay.split_reads`."""


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


def _bodies(kind: tuple[str, Framing], *, terminals: bool) -> st.SearchStrategy[bytes]:
    return RANDOM_BODIES | shaped_bodies(kind, terminals=terminals)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@FUZZ
@given(data=st.data(), sizes=READ_SIZES)
def test_random_bytes_end_protocol_or_transport(kind: tuple[str, Framing], data: st.DataObject,
                                                sizes: list[int]) -> None:
    """Random bytes in random reads: no exception, one terminal, last, validator clean.

    The bodies are byte soup or well-framed provider-shaped payloads with random values.
    The generators never write an error object nor a terminal signal (see
    :data:`RESERVED_KEYS`), so the only endings are ``failed``/``protocol`` (the bytes
    broke the framing or the provider's protocol) and ``interrupted``/``transport``
    (the body ended without a terminal signal).
    """
    body = data.draw(_bodies(kind, terminals=False), label="body")
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


@FUZZ_TRANSCRIPTS
@given(case=_cuts(), sizes=READ_SIZES)
def test_truncation_at_any_offset(case: tuple[Path, int], sizes: list[int]) -> None:
    """A transcript cut after ``cut`` bytes (the connection closed cleanly there), fed in random reads.

    With ``full`` the events of the whole body and ``cut_events`` those of the prefix,
    asserted for every cut:

    * no exception; the validator finds nothing; exactly one terminal, the last event;
    * either ``cut_events == full``: the cut came after the frame that proved the full
      body's terminal. This covers a full body that failed earlier than the cut with a
      provider error (or ``protocol``): the prefix carries that same frame whole, so it
      fails with the same category, message and seq;
    * or the cut came first: every event but the terminal is the full body's event at
      the same place (a prefix never invents, reorders or renumbers output: a partial
      frame is never parsed), and the terminal is ``stream.error``
      ``interrupted``/``transport``, the body having ended without a terminal signal.
      For every framing but Gemini SSE that is the only other outcome, since the end of
      the body proves nothing there (and a JSON array without its ``]`` never ends cleanly);
    * Gemini SSE: a ``finishReason`` is proven only by the clean end of the body, and a
      cut right after a line terminator after the ``finishReason`` chunk *is* such an
      end: on an event boundary (after a blank line), or after the chunk's own ``data:``
      line, since a pending event whose lines were all terminated and whose data decodes
      whole is dispatched at a clean end (PROVIDERS.md 1, amended). The bytes cannot tell
      it from a complete response. There the prefix may end ``stream.done`` with the
      full body's ``finish_reason`` (after the ``block.stop`` events of the blocks the
      end closed), or ``failed``/``protocol`` when that end is impossible (``STOP`` with
      a streamed call open). A cut inside a line ends ``interrupted``.
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
    clean_gemini_end = path.parent.name == "gemini_sse" and _ends_on_line_break(body[:cut])
    if isinstance(terminal, StreamDone):
        assert clean_gemini_end, (path.name, cut, terminal)
        assert terminal.finish_reason == full[-1].finish_reason  # type: ignore[union-attr]
        while before and isinstance(before[-1], BlockStop):  # the blocks the clean end closed
            before.pop()
    elif clean_gemini_end:
        assert _ending(terminal) in BOUNDARY_ENDINGS, (path.name, cut, terminal)
    else:
        assert _ending(terminal) == ("interrupted", "transport"), (path.name, cut, terminal)
    assert before == full[: len(before)], (path.name, cut)


SSE_TRANSCRIPTS = [p for p in TRANSCRIPTS if _kind(p)[1] == "sse"]


@pytest.mark.parametrize("path", SSE_TRANSCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in SSE_TRANSCRIPTS])
def test_dropping_the_final_blank_line_changes_nothing(path: Path) -> None:
    """Every SSE transcript without its last blank line (a gateway dropped it) gives the same events.

    The last event's lines are all terminated, so it is dispatched at the clean end when
    its data decodes whole (PROVIDERS.md 1, amended); when it does not (a malformed last
    payload), the body counts as cut: the same events up to the terminal, which is then
    ``interrupted``/``transport``. Transcripts whose last bytes are not a complete event
    followed by one blank line are skipped.
    """
    body = path.read_bytes()
    for blank in (b"\r\n", b"\n", b"\r"):
        if body.endswith(blank) and _ends_on_blank_line(body) and not _ends_on_blank_line(body[: -len(blank)]):
            break
    else:
        pytest.skip("the body does not end with one blank line after a terminated event")
    full, stripped = _replay(body, _kind(path)), _replay(body[: -len(blank)], _kind(path), [1])
    if stripped != full:
        assert _ending(_assert_sound(stripped)) == ("interrupted", "transport")
        assert stripped[:-1] == full[: len(stripped) - 1]


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in TRANSCRIPTS])
def test_cut_inside_the_last_event_is_never_done(path: Path) -> None:
    """Every transcript cut inside its last bytes (not on an event boundary) never proves an end it did not see.

    Each of the last 4 offsets that does not fall right after a blank line leaves the
    last event (or the array) unfinished: the events are the full body's (its terminal
    came earlier, or the cut fell after the last event's terminated data line, which is
    dispatched at the clean end) or end ``interrupted``/``transport``, for every
    provider, Gemini SSE included (where the terminal needs the clean end of the body).
    Deterministic: every transcript, in 1-byte reads.
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
            assert _ending(terminal) == ("interrupted", "transport"), (cut, terminal)


# -- 3. corruption ------------------------------------------------------------------


@FUZZ_TRANSCRIPTS
@given(case=CORRUPTED, sizes=READ_SIZES)
def test_corrupted_transcripts_stay_sound(case: tuple[Path, bytes], sizes: list[int]) -> None:
    """Flipped, inserted and deleted bytes: no exception, validator clean, one terminal, last."""
    path, body = case
    _assert_sound(_replay(body, _kind(path), sizes))


# -- 4. read boundaries -------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@FUZZ
@given(data=st.data(), sizes=READ_SIZES)
def test_random_bytes_independent_of_read_boundaries(kind: tuple[str, Framing], data: st.DataObject,
                                                     sizes: list[int]) -> None:
    """The events of a random body are the same in one read, in random reads and in 1-byte reads.

    Bodies as in property 1, plus provider-shaped ones that may carry terminal signals
    and error objects; any ending is fine here, as long as the stream is sound.
    """
    body = data.draw(_bodies(kind, terminals=data.draw(st.booleans(), label="terminals")), label="body")
    whole = _replay(body, kind)
    _assert_sound(whole)
    assert _replay(body, kind, sizes) == whole
    assert _replay(body, kind, [1]) == whole


@FUZZ_TRANSCRIPTS
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
        (_chat_body, ("openai_chat", "sse"),
         "SSE line exceeds max_frame_bytes={limit} bytes (still unterminated at the limit)"),
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


# -- regressions of bugs these properties found -------------------------------------


def test_regression_json_array_error_message_does_not_depend_on_reads() -> None:
    """worker/jsonarray.py quoted up to 20 bytes after the bad byte, as far as the read went.

    So ``b"\\x00\\x00"`` in one read and in two reads gave different ``stream.error``
    messages. The message now names the offending byte and its offset only.
    """
    kind: tuple[str, Framing] = ("gemini", "json_array")
    for body, got in [(b"\x00\x00", "got b'\\x00' at byte 0"), (b'[{"a":1}\n,{"b":2} x]', "got b'x' at byte 18")]:
        outcomes = [_replay(body, kind, sizes) for sizes in (None, [1], [2, 5])]
        assert outcomes[1:] == outcomes[:-1]
        terminal = _assert_sound(outcomes[0])
        assert isinstance(terminal, StreamError)
        assert _ending(terminal) == ("failed", "protocol")
        assert terminal.error.message.endswith(got), terminal.error.message


def test_regression_sse_overlong_line_message_does_not_depend_on_reads() -> None:
    """worker/sse.py said "line" when the overlong line's terminator was in the same read, else
    "line (unterminated)"; the same body gave different events by read boundaries."""
    body = b"data: " + b"x" * 40 + b"\n\n"
    outcomes = [_run(list(split_reads(body, sizes)), ("openai_chat", "sse"), max_frame_bytes=20)
                for sizes in (None, [1], [30])]
    assert outcomes[1:] == outcomes[:-1]
    terminal = _assert_sound(outcomes[0])
    assert isinstance(terminal, StreamError)
    assert terminal.error.message == "SSE line exceeds max_frame_bytes=20 bytes (still unterminated at the limit)"


def _streamed_call(*paths: str) -> bytes:
    """A Gemini SSE body opening a Vertex streamed call, then one ``partialArgs`` piece per path, then STOP."""
    opening = {"functionCall": {"name": "f", "willContinue": True}}
    chunks: list[Any] = [{"candidates": [{"content": {"parts": [opening]}}]}]
    chunks += [{"candidates": [{"content": {"parts": [{"functionCall": {
        "partialArgs": [{"jsonPath": path, "stringValue": "v"}], "willContinue": True}}]}}]} for path in paths]
    chunks.append({"candidates": [{"content": {"parts": [{"functionCall": {}}]}, "finishReason": "STOP"}]})
    return b"".join(b"data: " + _encode(c) + b"\n\n" for c in chunks)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("$.a[99999999999999999999]", "with an array index out of range"),  # was OverflowError out of feed()
        ("$.a[" + "9" * 5000 + "]", "with an array index out of range"),  # was ValueError (int digit limit)
        ("$.a[100000000]", "index skips too many elements"),  # was a 100M-element list (~800 MB)
        ("$" + ".a" * 2000, "with a jsonPath nested too deeply"),  # was RecursionError encoding the arguments
    ],
    ids=["overflow", "digit-limit", "huge-gap", "deep-path"],
)
def test_regression_gemini_streamed_argument_paths_are_bounded(path: str, message: str) -> None:
    """worker/adapters/gemini_parts.py built whatever a ``partialArgs`` ``jsonPath`` named.

    A 20-digit index raised OverflowError and a 5000-digit one ValueError out of
    ``Pipeline.feed``; a 9-digit index padded a list with that many nulls; a long path
    nested past the JSON encoder's recursion limit. Each now ends ``failed``/``protocol``.
    """
    events = _replay(_streamed_call(path), ("gemini", "sse"))
    terminal = _assert_sound(events)
    assert isinstance(terminal, StreamError)
    assert _ending(terminal) == ("failed", "protocol")
    assert terminal.error.message == f"streamed function call argument {message}"


def test_streamed_argument_paths_within_the_bounds_still_assemble() -> None:
    """The bounds leave real paths alone: a small gap is padded with nulls, 128 segments nest."""
    deep = "$" + ".a" * 128
    events = _replay(_streamed_call("$.n[3]", "$.n[3]", deep), ("gemini", "sse"))
    terminal = _assert_sound(events)
    assert isinstance(terminal, StreamDone), terminal
    arguments = "".join(e.delta.text for e in events if getattr(e, "delta", None) and e.delta.kind == "json_text")
    parsed = msgspec.json.decode(arguments)
    assert parsed["n"] == [None, None, None, "v"]
    node = parsed
    for _ in range(128):
        node = node["a"]
    assert node == "v"
