"""The OpenAI Chat Completions adapter: bug cases, the insertion property, and one test per quirk."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.contract import (
    BlockDelta,
    BlockStart,
    BlockStop,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    Usage,
    encode_event,
)
from schema.reducer import ReasoningBlock, TextBlock, ToolCallBlock, reduce
from schema.validate import validate
from tools.replay import replay_reads
from worker.adapters.openai_chat import OpenAIChatAdapter
from worker.adapters.openai_chat_parts import map_usage, read_error, reasoning_text
from worker.frames import JSONFrame, SSEFrame
from worker.normalizer import Normalizer
from worker.pipeline import build_pipeline
from worker.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "transcripts" / "openai_chat").glob("*.sse"))


# -- helpers -----------------------------------------------------------------


def _usage(usage: Usage | None) -> str:
    if usage is None:
        return "null"
    parts = (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)
    return "/".join("null" if p is None else str(p) for p in parts)


def line(event: Event) -> str:
    """Render one event in the BUG-CASES shorthand: ``seq type #index kind payload``."""
    head = f"{event.seq} {type(event).__struct_config__.tag}"
    if isinstance(event, StreamStart):
        return head
    if isinstance(event, BlockStart):
        tool = f" {event.tool.call_id} {event.tool.name}" if event.tool else ""
        return f"{head} #{event.block.index} {event.block.kind}{tool}"
    if isinstance(event, BlockDelta):
        return f"{head} #{event.block.index} {event.delta.kind} {event.delta.text!r}"
    if isinstance(event, BlockStop):
        return f"{head} #{event.block.index}"
    if isinstance(event, StreamDone):
        return (f"{head} {event.status} finish={event.finish_reason} provider={event.provider_finish_reason} "
                f"usage={_usage(event.usage)} id={event.response_id}")
    assert isinstance(event, StreamError)
    err = event.error
    return (f"{head} {event.status} {err.category} retryable={err.retryable} code={err.provider_code} "
            f"finish={event.finish_reason} usage={_usage(event.usage)}")


def short(events: Iterable[Event]) -> list[str]:
    return [line(e) for e in events]


def replay(*reads: bytes) -> list[Event]:
    events, _ = replay_reads(list(reads), provider="openai_chat")
    assert validate(events) == []
    return events


def replay_counted(*reads: bytes) -> tuple[list[Event], dict[str, int]]:
    events, ignored = replay_reads(list(reads), provider="openai_chat")
    assert validate(events) == []
    return events, dict(ignored)


def sse(text: str) -> bytes:
    """A BUG-CASES transcript: the indented block as body bytes (LF line ends)."""
    lines = text.strip("\n").split("\n")
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return ("\n".join(x[indent:] for x in lines) + "\n\n").encode()


def data(payload: Any) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    """One Chat chunk for choice 0 (``delta`` omitted from the choice when None)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    payload: dict[str, Any] = {"id": "chatcmpl-t1", "object": "chat.completion.chunk", "model": "m-1",
                               "choices": [choice]}
    payload.update(top)
    return data(payload)


def tool(index: int | None = None, call_id: str | None = None, name: str | None = None,
         arguments: Any = None) -> dict[str, Any]:
    fragment: dict[str, Any] = {"function": {}}
    if index is not None:
        fragment["index"] = index
    if call_id is not None:
        fragment["id"], fragment["type"] = call_id, "function"
    if name is not None:
        fragment["function"]["name"] = name
    if arguments is not None:
        fragment["function"]["arguments"] = arguments
    return fragment


DONE = data("[DONE]")


def calls(events: list[Event]) -> list[tuple[str, str, dict[str, Any] | None]]:
    result = reduce(events)
    return [(b.call_id, b.name, b.arguments) for b in result.blocks if isinstance(b, ToolCallBlock)]


def last(events: list[Event]) -> str:
    return line(events[-1])


# -- BUG-CASES ---------------------------------------------------------------


def test_b01_utf8_character_split_across_reads() -> None:
    events = replay(
        b'data: {"choices":[{"index":0,"delta":{"content":"cr\xc3',
        b"\xa8me \xf0\x9f",
        b'\xa6\x8a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    )
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'crème 🦊'",
        "4 block.stop #0",
        "5 stream.done completed finish=stop provider=stop usage=null id=None",
    ]
    assert all("\ufffd" not in encode_event(e).decode() for e in events)


def test_b01_body_cut_inside_a_character_is_interrupted() -> None:
    events = replay(
        b'data: {"choices":[{"index":0,"delta":{"content":"cr"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"\xc3',
    )
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'cr'",
        "4 stream.error interrupted transport retryable=True code=None finish=None usage=null",
    ]
    assert all("\ufffd" not in encode_event(e).decode() for e in events)


B04 = sse("""
    id: 7
    data: {"choices":[{"index":0,"delta":{"content":"Good"}}]}

    : keep-alive

    retry: 3000

    event: ping

    id: 8
    data: {"choices":[{"index":0,"delta":{"content":" morning"}}]}

    data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

    data: [DONE]
""")


def test_b04_blocks_without_data_are_not_events() -> None:
    decoder = SSEDecoder()
    frames = decoder.feed(B04) + decoder.close().frames
    assert [f.data for f in frames if isinstance(f, SSEFrame)][-1] == "[DONE]"
    assert len(frames) == 4
    events, ignored = replay_counted(B04)
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'Good'",
        "4 block.delta #0 text ' morning'",
        "5 block.stop #0",
        "6 stream.done completed finish=stop provider=stop usage=null id=None",
    ]
    assert ignored == {}
    assert all(e.seq <= 6 for e in events)  # upstream ids 7 and 8 are never our seq


B06 = sse(r"""
    data: {"id":"chatcmpl-q41","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_w4e","index":0,"type":"function","function":{"name":"append_note","arguments":"{\"file\":\"a.md\",\"line\":\"first\"}"}}]},"finish_reason":null}]}

    data: {"id":"chatcmpl-q41","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_h8r","index":0,"type":"function","function":{"name":"append_note","arguments":"{\"file\":\"b.md\",\"line\":\"second\"}"}}]},"finish_reason":null}]}

    data: {"id":"chatcmpl-q41","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

    data: [DONE]
""")  # noqa: E501


def test_b06_distinct_tool_calls_sharing_index_zero() -> None:
    events = replay(B06)
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 tool_call call_w4e append_note",
        """3 block.delta #0 json_text '{"file":"a.md","line":"first"}'""",
        "4 block.stop #0",
        "5 block.start #1 tool_call call_h8r append_note",
        """6 block.delta #1 json_text '{"file":"b.md","line":"second"}'""",
        "7 block.stop #1",
        "8 stream.done completed finish=tool_calls provider=tool_calls usage=null id=chatcmpl-q41",
    ]
    assert calls(events) == [
        ("call_w4e", "append_note", {"file": "a.md", "line": "first"}),
        ("call_h8r", "append_note", {"file": "b.md", "line": "second"}),
    ]


B12_HEAD = sse("""
    data: {"id":"chatcmpl-u6","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}

    data: {"id":"chatcmpl-u6","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Seven times six is"},"finish_reason":null}]}

    data: {"id":"chatcmpl-u6","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" forty-two"},"finish_reason":"length"}]}

    data: {"id":"chatcmpl-u6","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":13,"completion_tokens":6,"total_tokens":19}}
""")  # noqa: E501


def test_b12_finish_reason_is_not_the_end_of_the_stream() -> None:
    events = replay(B12_HEAD + DONE)
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'Seven times six is'",
        "4 block.delta #0 text ' forty-two'",
        "5 block.stop #0",
        "6 stream.done incomplete finish=length provider=length usage=13/6/null/null id=chatcmpl-u6",
    ]


def test_b12_no_terminal_before_done_is_read() -> None:
    pipeline = build_pipeline(provider="openai_chat", stream_id="st_b12", model="m", clock=lambda: 0)
    events = pipeline.start() + pipeline.feed(B12_HEAD)
    assert pipeline.terminal is None
    assert not any(isinstance(e, StreamDone | StreamError) for e in events)
    assert isinstance(pipeline.feed(DONE)[-1], StreamDone)


def test_b12_without_done_is_interrupted() -> None:
    events = replay(B12_HEAD)
    assert short(events)[:4] == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'Seven times six is'",
        "4 block.delta #0 text ' forty-two'",
    ]
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.status, end.error.category, end.error.retryable) == ("interrupted", "transport", True)
    assert not any(isinstance(e, StreamDone) for e in events)


B15_HEAD = sse("""
    data: {"id":"chatcmpl-e15","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Rivers flow toward"},"finish_reason":null}]}

    data: {"error":{"message":"The server had an error.","type":"server_error","param":null,"code":null}}
""")  # noqa: E501


def test_b15_error_object_then_done_fails_and_done_changes_nothing() -> None:
    events, ignored = replay_counted(B15_HEAD + DONE)
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'Rivers flow toward'",
        "4 stream.error failed upstream_error retryable=True code=server_error finish=None usage=null",
    ]
    assert ignored == {"after_terminal": 1}
    assert replay(B15_HEAD) == events
    result = reduce(events)
    assert result.status == "failed"
    assert [b.text for b in result.blocks if not isinstance(b, ToolCallBlock)] == ["Rivers flow toward"]


def test_b16_clean_eof_without_finish_or_done_is_interrupted() -> None:
    events = replay(chunk({"role": "assistant", "content": "The file"}) + chunk({"content": " contains"}))
    assert short(events) == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'The file'",
        "4 block.delta #0 text ' contains'",
        "5 stream.error interrupted transport retryable=True code=None finish=None usage=null",
    ]


# -- insertion property ------------------------------------------------------

NOISE = [
    b": OPENROUTER PROCESSING\n\n",
    b": keep-alive\r\n\r\n",
    b"retry: 1500\n\n",
    b"event: ping\n\n",
    b'event: ping\ndata: {"type":"ping"}\n\n',
    b'data: {"object":"chat.completion.heartbeat","created":1}\n\n',
    b'event: x-trace\ndata: {"type":"trace","span":"s1"}\n\n',
    b"data: {}\n\n",
]


def _boundaries(body: bytes) -> list[int]:
    """Offsets where a frame has just ended (and the start of the body)."""
    cuts = {0}
    for sep in (b"\n\n", b"\r\n\r\n"):
        start = 0
        while (found := body.find(sep, start)) >= 0:
            cuts.add(found + len(sep))
            start = found + 1
    return sorted(cuts)


@settings(max_examples=100, deadline=None)
@given(
    path=st.sampled_from(TRANSCRIPTS),
    inserts=st.lists(st.tuples(st.integers(min_value=0), st.sampled_from(NOISE)), max_size=6),
)
def test_noise_inserted_at_frame_boundaries_changes_nothing(path: Path, inserts: list[tuple[int, bytes]]) -> None:
    body = path.read_bytes()
    cuts = _boundaries(body)
    noisy = body
    for pick, noise in sorted(((cuts[i % len(cuts)], n) for i, n in inserts), reverse=True):
        noisy = noisy[:pick] + noise + noisy[pick:]
    expected, _ = replay_reads([body], provider="openai_chat")
    got, _ = replay_reads([noisy], provider="openai_chat")
    assert got == expected


def test_transcripts_exist_for_every_quirk() -> None:
    assert len(TRANSCRIPTS) >= 17


# -- terminal signals --------------------------------------------------------


def test_done_without_finish_reason_fails_protocol() -> None:
    events = replay(chunk({"content": "hi"}) + DONE)
    assert last(events) == "4 stream.error failed protocol retryable=False code=None finish=None usage=null"


def test_finish_then_eof_is_interrupted_and_keeps_finish_and_usage() -> None:
    usage = {"prompt_tokens": 4, "completion_tokens": 2}
    events = replay(chunk({"content": "hi"}) + chunk({}, "stop", usage=usage))
    assert short(events)[-2:] == [  # the finish_reason is not the end: the block stays open, no fake stop
        "3 block.delta #0 text 'hi'",
        "4 stream.error interrupted transport retryable=True code=None finish=stop usage=4/2/null/null",
    ]


def test_done_prefix_is_checked_with_startswith() -> None:
    events = replay(chunk({"content": "hi"}, "stop") + data("[DONE] trailing"))
    assert isinstance(events[-1], StreamDone)


def test_response_id_and_model_come_from_first_nonempty_chunk() -> None:
    azure_first = data({"choices": [], "id": "", "model": "", "object": "", "prompt_filter_results": []})
    events = replay(azure_first + chunk({"content": "x"}, "stop") + DONE)
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.response_id, done.model) == ("chatcmpl-t1", "m-1")


def test_repeated_finish_reason_is_counted_and_the_last_one_counts() -> None:
    events, ignored = replay_counted(chunk({"content": "x"}, "stop") + chunk({}, "length") + DONE)
    assert last(events).startswith("5 stream.done incomplete finish=length provider=length")
    assert ignored["repeated_finish_reason"] == 1


def test_output_after_finish_reason_continues_the_same_block() -> None:
    # PROVIDERS.md 2.2 (amended): relays stamp finish_reason on chunks that still carry content.
    events = replay(chunk({"content": "a"}, "stop") + chunk({"content": "b"}, "stop") + chunk({}, "stop") + DONE)
    assert short(events)[1:] == [
        "2 block.start #0 text", "3 block.delta #0 text 'a'", "4 block.delta #0 text 'b'", "5 block.stop #0",
        "6 stream.done completed finish=stop provider=stop usage=null id=chatcmpl-t1",
    ]


def test_new_kind_after_finish_reason_opens_the_next_block() -> None:
    tool = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}
    events = replay(chunk({"content": "a"}, "stop") + chunk(tool, "tool_calls") + DONE)
    assert short(events)[3:6] == ["4 block.stop #0", "5 block.start #1 tool_call call_1 f",
                                  "6 block.delta #1 json_text '{}'"]
    assert last(events).startswith("8 stream.done completed finish=tool_calls provider=tool_calls")


# -- errors ------------------------------------------------------------------


def test_vllm_flat_error_object_fails() -> None:
    flat = {"object": "error", "message": "bad tool parser output", "type": "BadRequestError", "param": None,
            "code": 400}
    events = replay(chunk({"content": "a"}) + data(flat) + DONE)
    assert last(events) == (
        "4 stream.error failed invalid_request retryable=False code=BadRequestError finish=None usage=null"
    )


def test_openrouter_error_chunk_with_finish_error_uses_the_error_object() -> None:
    err = {"code": 503, "message": "No instances available", "metadata": {"flagged_input": "secret prompt"}}
    events = replay(chunk({"content": "a"}) + chunk({"content": ""}, "error", error=err) + DONE)
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.error.category, end.error.provider_code, end.error.retryable) == ("upstream_overloaded", "503", True)
    assert "secret prompt" not in end.error.message


def test_finish_reason_error_without_error_object_fails_upstream_error() -> None:
    events = replay(chunk({"content": "a"}) + chunk({}, "error") + DONE)
    assert last(events) == "4 stream.error failed upstream_error retryable=True code=None finish=None usage=null"


def test_error_after_finish_carries_the_finish_reason() -> None:
    err = data({"error": {"message": "late", "type": "server_error"}})
    events = replay(chunk({"content": "a"}, "stop") + err + DONE)
    assert last(events) == (  # the block is still open (only [DONE] closes it): no block.stop first
        "4 stream.error failed upstream_error retryable=True code=server_error finish=stop usage=null"
    )


def test_error_as_unframed_json_frame_fails() -> None:
    norm = Normalizer(stream_id="st_j", provider="openai_chat", model="m", clock=lambda: 0)
    adapter = OpenAIChatAdapter(norm)
    adapter.start()
    events = adapter.feed(JSONFrame(text='{"error": {"message": "Too many requests", "code": 429}}'))
    assert line(events[-1]) == "2 stream.error failed rate_limited retryable=True code=429 finish=None usage=null"


def test_malformed_json_payload_fails_protocol() -> None:
    events = replay(chunk({"content": "a"}) + b'data: {"choices":[\n\n' + DONE)
    assert last(events) == "4 stream.error failed protocol retryable=False code=None finish=None usage=null"


def test_choices_that_are_not_a_list_fail_protocol() -> None:
    events = replay(data({"id": "x", "choices": {"index": 0}}) + DONE)
    assert last(events) == "2 stream.error failed protocol retryable=False code=None finish=None usage=null"


@pytest.mark.parametrize(
    ("error", "category", "retryable", "code"),
    [
        ({"type": "server_error", "code": None}, "upstream_error", None, "server_error"),
        ({"type": "tokens", "code": "rate_limit_exceeded"}, "rate_limited", None, "rate_limit_exceeded"),
        ({"code": 429}, "rate_limited", None, "429"),
        ({"type": "insufficient_quota", "code": "insufficient_quota"}, "rate_limited", False, "insufficient_quota"),
        ({"code": 402}, "rate_limited", False, "402"),
        ({"type": "invalid_request_error", "code": "context_length_exceeded"}, "context_length_exceeded", None,
         "context_length_exceeded"),
        ({"type": "invalid_request_error", "code": None}, "invalid_request", None, "invalid_request_error"),
        ({"code": 400}, "invalid_request", None, "400"),
        ({"code": 401}, "authentication", None, "401"),
        ({"code": 403}, "permission", None, "403"),
        ({"code": 404}, "not_found", None, "404"),
        ({"code": 503}, "upstream_overloaded", None, "503"),
        ({"type": "overloaded", "code": None}, "upstream_overloaded", None, "overloaded"),
        ({"code": 500}, "upstream_error", None, "500"),
        ({"code": 502}, "upstream_error", None, "502"),
        ({"code": 418}, "invalid_request", None, "418"),
        ({"type": "InternalServerError", "code": 500}, "upstream_error", None, "InternalServerError"),
        ({}, "upstream_error", None, None),
    ],
)
def test_error_object_maps_to_category(error: dict[str, Any], category: str, retryable: bool | None,
                                       code: str | None) -> None:
    report = read_error({"message": "m", **error})
    assert (report.category, report.retryable, report.provider_code) == (category, retryable, code)


def test_error_given_as_a_string_is_upstream_error() -> None:
    events = replay(data({"error": "upstream timed out"}))
    assert last(events) == "2 stream.error failed upstream_error retryable=True code=None finish=None usage=null"


# -- blocks and runs ---------------------------------------------------------


def test_null_and_empty_content_open_nothing() -> None:
    events = replay(chunk({"role": "assistant", "content": None, "refusal": ""}) + chunk({"content": ""}, "stop")
                    + DONE)
    assert short(events) == ["1 stream.start",
                             "2 stream.done completed finish=stop provider=stop usage=null id=chatcmpl-t1"]


def test_kind_change_closes_the_run_and_opens_a_new_block() -> None:
    events = replay(chunk({"reasoning": "r1"}) + chunk({"content": "t1"}) + chunk({"content": "t2"})
                    + chunk({"reasoning": "r2"}, "stop") + DONE)
    assert short(events)[1:-1] == [
        "2 block.start #0 reasoning", "3 block.delta #0 text 'r1'", "4 block.stop #0",
        "5 block.start #1 text", "6 block.delta #1 text 't1'", "7 block.delta #1 text 't2'", "8 block.stop #1",
        "9 block.start #2 reasoning", "10 block.delta #2 text 'r2'", "11 block.stop #2",
    ]


def test_refusal_only_with_stop_is_refusal() -> None:
    events = replay(chunk({"content": None, "refusal": "No."}, "stop") + DONE)
    assert last(events).startswith("5 stream.done completed finish=refusal provider=stop")


def test_length_closes_the_open_tool_block_and_is_incomplete() -> None:
    events = replay(chunk({"tool_calls": [tool(0, "call_1", "f", '{"a":')]}, "length") + DONE)
    assert short(events)[-2:] == ["4 block.stop #0",
                                  "5 stream.done incomplete finish=length provider=length usage=null id=chatcmpl-t1"]
    assert calls(events) == [("call_1", "f", None)]


def test_content_filter_finish_is_incomplete() -> None:
    events = replay(chunk({"content": "x"}, "content_filter") + DONE)
    assert last(events).startswith("5 stream.done incomplete finish=content_filter provider=content_filter")


def test_unknown_finish_reason_is_incomplete_other() -> None:
    events = replay(chunk({"content": "x"}, "abort") + DONE)
    assert last(events).startswith("5 stream.done incomplete finish=other provider=abort")


@pytest.mark.parametrize("raw", ["eos", "eos_token"])
def test_eos_spellings_are_a_normal_stop(raw: str) -> None:
    events = replay(chunk({"content": "x"}, raw) + DONE)
    assert last(events).startswith(f"5 stream.done completed finish=stop provider={raw}")


def test_late_content_filter_choice_without_delta_neither_reopens_nor_ends() -> None:
    late = data({"choices": [{"index": 0, "finish_reason": None, "content_filter_offsets": {"end_offset": 9},
                              "content_filter_results": {}}], "id": "", "model": "", "object": ""})
    events, ignored = replay_counted(chunk({"content": "x"}) + chunk({}, "stop") + late + DONE)
    assert short(events)[-2:] == ["4 block.stop #0",
                                  "5 stream.done completed finish=stop provider=stop usage=null id=chatcmpl-t1"]
    assert ignored == {"choice_without_delta": 1}


def test_choices_other_than_zero_are_ignored_and_counted() -> None:
    both = data({"id": "c", "choices": [{"index": 1, "delta": {"content": "B"}, "finish_reason": None},
                                        {"index": 0, "delta": {"content": "A"}, "finish_reason": None}]})
    events, ignored = replay_counted(both + chunk({}, "stop") + DONE)
    assert reduce(events).blocks[0].text == "A"  # type: ignore[union-attr]
    assert ignored == {"choice_index_nonzero": 1}


def test_unknown_payload_is_counted_under_its_object() -> None:
    events, ignored = replay_counted(data({"object": "chat.completion.heartbeat"}) + chunk({}, "stop") + DONE)
    assert isinstance(events[-1], StreamDone)
    assert ignored == {"chat.completion.heartbeat": 1}


# -- reasoning ---------------------------------------------------------------


def test_mirrored_reasoning_fields_are_read_once() -> None:
    delta = {"reasoning_content": "think", "reasoning": "think",
             "reasoning_details": [{"type": "reasoning.text", "text": "think"}]}
    events = replay(chunk(delta) + chunk({}, "stop") + DONE)
    assert short(events)[1:3] == ["2 block.start #0 reasoning", "3 block.delta #0 text 'think'"]
    assert len(events) == 5


def test_reasoning_precedence_skips_empty_fields() -> None:
    assert reasoning_text({"reasoning_content": "", "reasoning": "b", "reasoning_details": [{"text": "c"}]}) == "b"
    assert reasoning_text({"reasoning_content": None, "reasoning_details": [{"text": "c"}, {"data": "enc"}]}) == "c"
    assert reasoning_text({"reasoning_content": {"text": "a"}, "reasoning": "b"}) == "a"
    assert reasoning_text({"reasoning_details": [{"type": "reasoning.encrypted", "data": "x"}]}) == ""


# -- tool calls --------------------------------------------------------------


def test_same_id_and_name_on_closing_fragment_are_not_doubled() -> None:
    body = (chunk({"tool_calls": [tool(0, "chatcmpl-tool-1", "search")]})
            + chunk({"tool_calls": [tool(0, arguments='{"q": ')]})
            + chunk({"tool_calls": [tool(0, "chatcmpl-tool-1", "search", '"x"}')]}, "tool_calls") + DONE)
    events = replay(body)
    assert calls(events) == [("chatcmpl-tool-1", "search", {"q": "x"})]
    assert sum(isinstance(e, BlockStart) for e in events) == 1


def test_fragment_without_id_continues_the_call_at_its_index() -> None:
    body = (chunk({"tool_calls": [tool(0, "c1", "f", '{"a"')]}) + chunk({"tool_calls": [tool(0, arguments=":1}")]})
            + chunk({}, "tool_calls") + DONE)
    assert calls(replay(body)) == [("c1", "f", {"a": 1})]


def test_calls_without_index_use_their_list_position() -> None:
    body = chunk({"tool_calls": [tool(None, "c1", "f", "{}"), tool(None, "c2", "g", '{"x":2}')]}, "stop") + DONE
    events = replay(body)
    assert calls(events) == [("c1", "f", {}), ("c2", "g", {"x": 2})]
    assert last(events).startswith("8 stream.done completed finish=tool_calls provider=stop")


def test_arguments_before_the_name_are_buffered_until_the_name_arrives() -> None:
    body = (chunk({"tool_calls": [tool(0, arguments='{"k":')]}) + chunk({"tool_calls": [tool(0, "c9", "late")]})
            + chunk({"tool_calls": [tool(0, arguments="1}")]}, "tool_calls") + DONE)
    events = replay(body)
    assert short(events)[1:4] == ["2 block.start #0 tool_call c9 late", "3 block.delta #0 json_text '{\"k\":'",
                                  "4 block.delta #0 json_text '1}'"]


def test_arguments_without_a_name_ever_fail_protocol() -> None:
    events = replay(chunk({"tool_calls": [tool(0, "c1", arguments='{"k":1}')]}, "tool_calls") + DONE)
    assert last(events) == "2 stream.error failed protocol retryable=False code=None finish=None usage=null"


def test_unnamed_call_replaced_at_its_index_fails_protocol() -> None:
    body = (chunk({"tool_calls": [tool(0, "c1", arguments='{"k":1}')]})
            + chunk({"tool_calls": [tool(0, "c2", "f", "{}")]}, "tool_calls") + DONE)
    assert last(replay(body)).startswith("2 stream.error failed protocol")


def test_arguments_for_a_call_already_closed_fail_protocol() -> None:
    body = (chunk({"tool_calls": [tool(0, "c1", "f", "{")]}) + chunk({"tool_calls": [tool(1, "c2", "g", "{}")]})
            + chunk({"tool_calls": [tool(0, arguments="}")]}) + chunk({}, "tool_calls") + DONE)
    events = replay(body)
    assert last(events).startswith("7 stream.error failed protocol")


def test_empty_or_omitted_arguments_mean_an_empty_object() -> None:
    body = (chunk({"tool_calls": [tool(0, "c1", "list_all")]}) + chunk({"tool_calls": [tool(0, arguments="")]})
            + chunk({}, "tool_calls") + DONE)
    events = replay(body)
    assert calls(events) == [("c1", "list_all", {})]
    assert not any(isinstance(e, BlockDelta) for e in events)


def test_arguments_sent_as_an_object_are_serialized_once() -> None:
    events = replay(chunk({"tool_calls": [tool(0, "c1", "f", {"n": 1, "s": "é"})]}, "tool_calls") + DONE)
    assert calls(events) == [("c1", "f", {"n": 1, "s": "é"})]


def test_stop_with_tool_calls_is_tool_calls() -> None:
    events = replay(chunk({"tool_calls": [tool(0, "c1", "f", "{}")]}, "stop") + DONE)
    assert last(events).startswith("5 stream.done completed finish=tool_calls provider=stop")


def test_deprecated_function_call_is_a_tool_call_with_generated_id() -> None:
    body = (chunk({"function_call": {"name": "legacy", "arguments": '{"a"'}})
            + chunk({"function_call": {"arguments": ":1}"}}) + chunk({}, "function_call") + DONE)
    events = replay(body)
    assert calls(events) == [("call_fanout_0", "legacy", {"a": 1})]
    assert last(events).startswith("6 stream.done completed finish=tool_calls provider=function_call")


def test_completed_end_with_unparseable_arguments_fails_protocol() -> None:
    events = replay(chunk({"tool_calls": [tool(0, "c1", "f", '{"a":')]}, "tool_calls") + DONE)
    assert short(events)[-2:] == [
        "4 block.stop #0",
        "5 stream.error failed protocol retryable=False code=None finish=tool_calls usage=null",
    ]


# -- usage -------------------------------------------------------------------


def test_usage_maps_details_and_null_details() -> None:
    full = {"prompt_tokens": 10, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 3}}
    assert map_usage(full) == Usage(input_tokens=10, output_tokens=7, cached_input_tokens=4, reasoning_tokens=3)
    vllm = {"prompt_tokens": 10, "completion_tokens": 7, "prompt_tokens_details": None}
    assert map_usage(vllm) == Usage(input_tokens=10, output_tokens=7)


def test_deepseek_cache_hit_tokens_stand_in_when_details_are_absent() -> None:
    raw = {"prompt_tokens": 30, "completion_tokens": 5, "prompt_cache_hit_tokens": 24, "prompt_cache_miss_tokens": 6}
    assert map_usage(raw).cached_input_tokens == 24


def test_usage_on_the_finish_chunk_is_reported() -> None:
    events = replay(chunk({"content": "x"}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 1}) + DONE)
    assert "usage=3/1/null/null" in last(events)


def test_groq_usage_under_x_groq_is_reported() -> None:
    events = replay(chunk({"content": "x"}, "stop", x_groq={"usage": {"prompt_tokens": 8, "completion_tokens": 2}})
                    + DONE)
    assert "usage=8/2/null/null" in last(events)


def test_the_last_usage_report_wins() -> None:
    tail = data({"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 9}})
    events = replay(chunk({"content": "x"}, "stop", usage={"prompt_tokens": 1, "completion_tokens": 1}) + tail
                    + DONE)
    assert "usage=9/9/null/null" in last(events)


def test_gemini_thought_signature_on_a_tool_fragment_rides_as_signature() -> None:
    fragment = {**tool(None, "fc-1", "f", "{}"), "extra_content": {"google": {"thought_signature": "c2ln"}}}
    events = replay(chunk({"tool_calls": [fragment]}, "tool_calls") + DONE)
    assert short(events)[1:4] == [
        "2 block.start #0 tool_call fc-1 f",
        "3 block.delta #0 json_text '{}'",
        "4 block.delta #0 signature 'c2ln'",
    ]
    assert reduce(events).blocks[0].signature == "c2ln"


# -- amended rows: Copilot reasoning, empty data events ------------------------


def test_copilot_reasoning_text_is_reasoning_and_reasoning_opaque_its_signature() -> None:
    events = replay(chunk({"reasoning_text": "hmm"}), chunk({"reasoning_opaque": "T1BR"}), chunk({"content": "ok"}),
                    chunk({}, "stop"), DONE)
    assert reduce(events).blocks[0] == ReasoningBlock(index=0, text="hmm", signature="T1BR")
    assert isinstance(reduce(events).blocks[1], TextBlock)


def test_copilot_opaque_in_the_chunk_of_the_first_content_signs_the_reasoning_before_the_text() -> None:
    events = replay(chunk({"reasoning_text": "a"}), chunk({"reasoning_opaque": "U0c=", "content": "b"}),
                    chunk({}, "stop"), DONE)
    assert short(events)[1:7] == ["2 block.start #0 reasoning", "3 block.delta #0 text 'a'",
                                  "4 block.delta #0 signature 'U0c='", "5 block.stop #0",
                                  "6 block.start #1 text", "7 block.delta #1 text 'b'"]


def test_reasoning_text_is_not_read_when_reasoning_content_is_present() -> None:
    events = replay(chunk({"reasoning_content": "one", "reasoning_text": "one"}), chunk({}, "stop"), DONE)
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="one")]


def test_empty_and_blank_data_events_are_counted_as_empty_data_and_skipped() -> None:
    body = b"data:\n\n" + chunk({"content": "x"}) + b"data: \n\ndata:  \t\n\n" + chunk({}, "stop") + DONE
    events, ignored = replay_counted(body)
    assert short(events)[-1].startswith("5 stream.done completed")
    assert ignored == {"empty_data": 3}
