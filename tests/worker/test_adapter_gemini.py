"""The Gemini streamGenerateContent adapter: BUG-CASES B05, the insertion property, each quirk."""

from __future__ import annotations

import json
from collections import Counter
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
)
from schema.errors import UpstreamProtocolError
from schema.reducer import ReasoningBlock, TextBlock, ToolCallBlock, reduce
from schema.validate import validate
from tools.replay import replay_reads
from worker.adapters.gemini import GeminiAdapter
from worker.adapters.gemini_parts import FINISH, StreamedArgs, parse_path
from worker.frames import Frame, JSONFrame, SSEFrame
from worker.jsonarray import JSONArrayDecoder
from worker.normalizer import Normalizer
from worker.pipeline import build_pipeline
from worker.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("gemini_sse", "gemini_json_array")
BODIES = [
    path
    for base in (ROOT / "transcripts", ROOT / "tests" / "cases" / "transcripts")
    for name in DIRS
    for path in sorted((base / name).glob("*.sse"))
]

# -- helpers ------------------------------------------------------------------


def _q(value: str | None) -> str:
    return "null" if value is None else f'"{value}"'


def _usage(usage: Usage | None) -> str:
    if usage is None:
        return "null"
    parts = (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)
    return "/".join("null" if p is None else str(p) for p in parts)


def render(event: Event) -> str:
    """One event in BUG-CASES shorthand: ``seq type #index kind payload``."""
    if isinstance(event, StreamStart):
        return f"{event.seq} stream.start"
    if isinstance(event, BlockStart):
        line = f"{event.seq} block.start #{event.block.index} {event.block.kind}"
        if event.tool is not None:
            line += f" tool {{call_id {_q(event.tool.call_id)}, name {_q(event.tool.name)}}}"
        return line
    if isinstance(event, BlockDelta):
        return f"{event.seq} block.delta #{event.block.index} {event.delta.kind} '{event.delta.text}'"
    if isinstance(event, BlockStop):
        return f"{event.seq} block.stop  #{event.block.index}"
    if isinstance(event, StreamDone):
        return (
            f"{event.seq} stream.done {event.status}, finish_reason {event.finish_reason}, "
            f"provider_finish_reason {_q(event.provider_finish_reason)}, usage {_usage(event.usage)}, "
            f"response_id {_q(event.response_id)}, model {_q(event.model)}"
        )
    assert isinstance(event, StreamError)
    err = event.error
    return (
        f"{event.seq} stream.error {event.status}, category {err.category}, "
        f"retryable {str(err.retryable).lower()}, provider_code {_q(err.provider_code)}, "
        f"usage {_usage(event.usage)}, finish_reason {event.finish_reason or 'null'}"
    )


def chunk(*parts: dict[str, Any] | None, finish: str | None = None, usage: dict[str, Any] | None = None,
          **top: Any) -> dict[str, Any]:
    """A GenerateContentResponse with one candidate (index 0); ``None`` parts → no content."""
    candidate: dict[str, Any] = {"index": 0}
    if parts != (None,):
        candidate["content"] = {"parts": list(parts), "role": "model"}
    if finish:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], **top}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def t(text: str, **extra: Any) -> dict[str, Any]:
    return {"text": text, **extra}


def th(text: str, **extra: Any) -> dict[str, Any]:
    return {"text": text, "thought": True, **extra}


def fc(name: str | None = None, **call: Any) -> dict[str, Any]:
    sig = call.pop("sig", None)
    body = {"name": name, **call} if name is not None else call
    return {"functionCall": body, **({"thoughtSignature": sig} if sig else {})}


def run(*items: dict[str, Any] | Frame, framing: str = "sse", truncated: bool = False,
        ) -> tuple[list[Event], Counter[str]]:
    """Feed payloads (dicts → data events / array elements) or frames, then end the body."""
    norm = Normalizer(stream_id="st_test", provider="gemini", model="m", clock=lambda: 0)
    adapter = GeminiAdapter(norm, framing="json_array" if framing == "json_array" else "sse")
    events = adapter.start()
    for item in items:
        events += adapter.feed(as_frame(item, framing))
    events += adapter.finish(truncated=truncated)
    assert validate(events) == []
    return events, adapter.ignored


def as_frame(item: dict[str, Any] | Frame, framing: str) -> Frame:
    if not isinstance(item, dict):
        return item
    text = json.dumps(item, ensure_ascii=False)
    return SSEFrame(data=text) if framing == "sse" else JSONFrame(text=text)


def lines(*items: dict[str, Any] | Frame, **kw: Any) -> list[str]:
    return [render(e) for e in run(*items, **kw)[0]]


def last(*items: dict[str, Any] | Frame, **kw: Any) -> StreamDone | StreamError:
    end = run(*items, **kw)[0][-1]
    assert isinstance(end, StreamDone | StreamError)
    return end


def error_of(*items: dict[str, Any] | Frame, **kw: Any) -> StreamError:
    end = last(*items, **kw)
    assert isinstance(end, StreamError), render(end)
    return end


STOP = chunk(None, finish="STOP")

# -- (a) BUG-CASES B05 --------------------------------------------------------

B05 = [
    b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"Gu',
    b'ten Tag","thoughtSignature":"c2lnLUE5"}]},"index":0}]}\r\n',
    b'\r\ndata: {"candidates":[{"content":{"role":"model","parts":[{"text":"!"}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}\r\n\r\n',  # noqa: E501 - BUG-CASES input kept byte-exact
]

B05_EXPECTED = [
    "1 stream.start",
    "2 block.start #0 text",
    "3 block.delta #0 text 'Guten Tag'",
    "4 block.delta #0 signature 'c2lnLUE5'",
    "5 block.delta #0 text '!'",
    "6 block.stop  #0",
    '7 stream.done completed, finish_reason stop, provider_finish_reason "STOP", usage 5/3/null/null, '
    "response_id null, model null",
]


def test_b05_read_boundaries_are_not_event_boundaries() -> None:
    events, ignored = replay_reads(B05, provider="gemini", framing="sse")
    assert [render(e) for e in events] == B05_EXPECTED
    assert ignored == Counter()
    result = reduce(events)
    assert result.status == "completed"
    assert result.blocks == [TextBlock(index=0, text="Guten Tag!", signature="c2lnLUE5")]


def test_b05_nothing_is_emitted_before_the_third_read_and_done_waits_for_the_end_of_body() -> None:
    pipeline = build_pipeline(provider="gemini", framing="sse", stream_id="st_b05", model="m", clock=lambda: 0)
    assert [render(e) for e in pipeline.start()] == ["1 stream.start"]
    assert pipeline.feed(B05[0]) == []
    assert pipeline.feed(B05[1]) == []
    third = [render(e) for e in pipeline.feed(B05[2])]
    assert third == B05_EXPECTED[1:5]
    assert [render(e) for e in pipeline.finish()] == B05_EXPECTED[5:]


def test_b05_signature_comes_after_its_own_text_and_before_the_next_part() -> None:
    kinds = [r.split()[3] for r in B05_EXPECTED[2:5]]
    events, _ = replay_reads([b"".join(B05)], provider="gemini", framing="sse")
    deltas = [e for e in events if isinstance(e, BlockDelta)]
    assert [d.delta.kind for d in deltas] == kinds == ["text", "signature", "text"]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_b05_any_read_size_gives_the_same_events(size: int) -> None:
    body = b"".join(B05)
    reads = [body[i : i + size] for i in range(0, len(body), size)]
    events, _ = replay_reads(reads, provider="gemini", framing="sse")
    assert [render(e) for e in events] == B05_EXPECTED


def test_b05_same_chunks_as_a_json_array_split_mid_element() -> None:
    first = '{"candidates":[{"content":{"role":"model","parts":[{"text":"Guten Tag","thoughtSignature":"c2lnLUE5"}]},"index":0}]}'  # noqa: E501
    second = '{"candidates":[{"content":{"role":"model","parts":[{"text":"!"}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}'  # noqa: E501
    body = f"[{first}\n,\r\n{second}\n]".encode()
    reads = [body[:60], body[60:61], body[61:200], body[200:]]
    events, _ = replay_reads(reads, provider="gemini", framing="json_array")
    assert [render(e) for e in events] == B05_EXPECTED


# -- (b) insertion property ---------------------------------------------------


def frames_of(path: Path) -> tuple[list[Frame], bool, UpstreamProtocolError | None]:
    """Decode a transcript into frames with the real decoder: (frames, truncated, decoder error)."""
    body = path.read_bytes()
    try:
        if path.parent.name == "gemini_json_array":
            array = JSONArrayDecoder()
            frames: list[Frame] = list(array.feed(body))
            end = array.close()
            return frames + list(end.frames), end.truncated or not end.closed, None
        sse = SSEDecoder()
        frames = list(sse.feed(body))
        close = sse.close()
        return frames + list(close.frames), close.truncated, None
    except UpstreamProtocolError as exc:
        return [], False, exc


def replay_frames(frames: list[Frame], framing: str, truncated: bool,
                  failure: UpstreamProtocolError | None) -> tuple[list[Event], Counter[str]]:
    norm = Normalizer(stream_id="st_prop", provider="gemini", model="m", clock=lambda: 0)
    adapter = GeminiAdapter(norm, framing="json_array" if framing == "gemini_json_array" else "sse")
    events = adapter.start()
    for frame in frames:
        events += adapter.feed(frame)
    events += adapter.fail(failure) if failure else adapter.finish(truncated=truncated)
    return events, adapter.ignored


SSE_NOISE: list[Frame] = [
    SSEFrame(event="keepalive", data="{}"),
    SSEFrame(event="ping", data="not json at all"),
    SSEFrame(data="{}"),
    SSEFrame(data='{"sdkTrace": {"span": "7f3a", "candidates_like": [1, 2]}}'),
    JSONFrame(text='{"serverTiming": {"ms": 12}}'),
]
ARRAY_NOISE: list[Frame] = [JSONFrame(text="{}"), JSONFrame(text='{"sdkHttpResponse": {"headers": {}}}')]
NOISE_NAMES = {"event:keepalive", "event:ping", "unknown_payload", "after_terminal"}


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_inserted_keepalives_and_unknown_payloads_change_only_the_ignored_counter(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(BODIES), label="transcript")
    frames, truncated, failure = frames_of(path)
    base, base_ignored = replay_frames(frames, path.parent.name, truncated, failure)
    noise = SSE_NOISE if path.parent.name == "gemini_sse" else ARRAY_NOISE
    inserts = data.draw(st.lists(st.tuples(st.integers(0, len(frames)), st.sampled_from(noise)), max_size=6))
    mixed = list(frames)
    for position, frame in sorted(inserts, key=lambda p: -p[0]):
        mixed.insert(position, frame)
    events, ignored = replay_frames(mixed, path.parent.name, truncated, failure)
    assert events == base
    added = ignored - base_ignored
    assert set(added) <= NOISE_NAMES
    assert sum(added.values()) == len(inserts)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_sse_comments_inserted_between_events_change_nothing(data: st.DataObject) -> None:
    sse_bodies = [p for p in BODIES if p.parent.name == "gemini_sse"]
    path = data.draw(st.sampled_from(sse_bodies), label="transcript")
    body = path.read_bytes()
    cuts = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") for i in range(len(body)) if body.startswith(sep, i)]
    cuts = sorted({0, *cuts})
    chosen = data.draw(st.lists(st.sampled_from(cuts), max_size=4))
    noisy = body
    for cut in sorted(chosen, reverse=True):
        noisy = noisy[:cut] + b": keep-alive\r\n\r\n" + noisy[cut:]
    base, base_ignored = replay_reads([body], provider="gemini")
    events, ignored = replay_reads([noisy], provider="gemini")
    assert events == base
    assert ignored == base_ignored


# -- (c) blocks ---------------------------------------------------------------


def test_text_parts_merge_across_chunks_into_one_block() -> None:
    assert lines(chunk(t("Hal")), chunk(t("lo")), chunk(t(" ✓"), finish="STOP"))[1:6] == [
        "2 block.start #0 text", "3 block.delta #0 text 'Hal'", "4 block.delta #0 text 'lo'",
        "5 block.delta #0 text ' ✓'", "6 block.stop  #0",
    ]


def test_several_text_parts_in_one_chunk_merge() -> None:
    events, _ = run(chunk(t("a"), t("b"), t("c")), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="abc")]


def test_thought_parts_form_a_reasoning_block() -> None:
    events, _ = run(chunk(th("hmm")), chunk(th(" ok")), STOP)
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="hmm ok")]
    start = events[1]
    assert isinstance(start, BlockStart)
    assert (start.visibility, start.redacted) == ("public", False)


def test_change_of_kind_closes_the_open_block_before_the_next_opens() -> None:
    assert lines(chunk(th("x")), chunk(t("y")), chunk(th("z")), STOP)[1:11] == [
        "2 block.start #0 reasoning", "3 block.delta #0 text 'x'", "4 block.stop  #0",
        "5 block.start #1 text", "6 block.delta #1 text 'y'", "7 block.stop  #1",
        "8 block.start #2 reasoning", "9 block.delta #2 text 'z'", "10 block.stop  #2",
        '11 stream.done completed, finish_reason stop, provider_finish_reason "STOP", usage null, '
        "response_id null, model null",
    ]


def test_empty_text_and_empty_thought_parts_add_nothing() -> None:
    events, _ = run(chunk(t("")), chunk(th("")), chunk(t("a")), chunk(t("")), STOP)
    assert [render(e) for e in events][1:4] == ["2 block.start #0 text", "3 block.delta #0 text 'a'",
                                                "4 block.stop  #0"]


def test_text_and_reasoning_blocks_stay_open_until_the_end_of_body() -> None:
    norm = Normalizer(stream_id="st_x", provider="gemini", model="m", clock=lambda: 0)
    adapter = GeminiAdapter(norm)
    adapter.start()
    fed = adapter.feed(SSEFrame(data=json.dumps(chunk(t("a"), finish="STOP"))))
    assert [type(e).__name__ for e in fed] == ["BlockStart", "BlockDelta"]
    assert [type(e).__name__ for e in adapter.finish()] == ["BlockStop", "StreamDone"]


@pytest.mark.parametrize("content", [None, {}, {"role": "model"}, {"role": "model", "parts": []}])
def test_missing_or_empty_content_is_accepted(content: dict[str, Any] | None) -> None:
    candidate: dict[str, Any] = {"finishReason": "STOP", "index": 0}
    if content is not None:
        candidate["content"] = content
    end = last(chunk(t("a")), {"candidates": [candidate]})
    assert isinstance(end, StreamDone)
    assert end.status == "completed"


def test_finish_only_chunk_closes_blocks_and_completes() -> None:
    assert lines(chunk(t("a")), chunk(None, finish="STOP"))[-2:] == [
        "4 block.stop  #0",
        '5 stream.done completed, finish_reason stop, provider_finish_reason "STOP", usage null, '
        "response_id null, model null",
    ]


def test_candidate_without_index_is_candidate_zero() -> None:
    events, _ = run({"candidates": [{"content": {"parts": [t("a")]}, "finishReason": "STOP"}]})
    assert reduce(events).blocks == [TextBlock(index=0, text="a")]


def test_candidates_with_other_index_are_counted_not_blocks() -> None:
    both = {"candidates": [{"content": {"parts": [t("A")]}, "index": 0},
                           {"content": {"parts": [t("B")]}, "index": 1, "finishReason": "MAX_TOKENS"}]}
    events, ignored = run(both, STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="A")]
    assert ignored == Counter({"candidate_other_index": 1})
    assert isinstance(events[-1], StreamDone)
    assert events[-1].finish_reason == "stop"


@pytest.mark.parametrize("name", ["executableCode", "codeExecutionResult", "inlineData", "fileData", "newPartKind"])
def test_non_text_parts_are_counted_not_blocks(name: str) -> None:
    events, ignored = run(chunk(t("a"), {name: {"x": 1}}, t("b")), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="ab")]
    assert ignored == Counter({f"part:{name}": 1})


def test_signature_on_an_ignored_part_is_dropped_with_it() -> None:
    events, ignored = run(chunk(t("a"), {"executableCode": {"code": "1"}, "thoughtSignature": "sig"}), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="a")]
    assert ignored == Counter({"part:executableCode": 1})


# -- (c) function calls --------------------------------------------------------


def test_function_call_is_one_block_with_one_json_text_delta_closed_at_once() -> None:
    norm = Normalizer(stream_id="st_x", provider="gemini", model="m", clock=lambda: 0)
    adapter = GeminiAdapter(norm)
    adapter.start()
    fed = adapter.feed(SSEFrame(data=json.dumps(chunk(fc("f", id="c1", args={"a": [1, {"b": None}]})))))
    assert [render(e) for e in fed] == [
        '2 block.start #0 tool_call tool {call_id "c1", name "f"}',
        "3 block.delta #0 json_text '{\"a\":[1,{\"b\":null}]}'",
        "4 block.stop  #0",
    ]


@pytest.mark.parametrize("call", [{"name": "f"}, {"name": "f", "args": None}, {"name": "f", "args": {}}])
def test_absent_or_null_args_are_an_empty_object(call: dict[str, Any]) -> None:
    events, _ = run(chunk({"functionCall": call}), STOP)
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert (block.arguments, block.arguments_text) == ({}, "{}")


def test_args_keep_non_ascii_text_unescaped() -> None:
    events, _ = run(chunk(fc("f", args={"city": "Kraków", "t": "東京"})), STOP)
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert block.arguments_text == '{"city":"Kraków","t":"東京"}'


@pytest.mark.parametrize("args", ['{"a":1}', [1, 2], 5, True])
def test_args_that_are_not_an_object_fail_protocol(args: Any) -> None:
    end = error_of(chunk(fc("f", args=args)), STOP)
    assert (end.status, end.error.category) == ("failed", "protocol")


def test_several_function_calls_in_one_chunk_are_separate_blocks_in_order() -> None:
    events, _ = run(chunk(t("x"), fc("a", args={"i": 1}), fc("b", args={"i": 2})), STOP)
    blocks = reduce(events).blocks
    assert [(type(b).__name__, getattr(b, "name", None)) for b in blocks] == [
        ("TextBlock", None), ("ToolCallBlock", "a"), ("ToolCallBlock", "b")]
    assert isinstance(events[-1], StreamDone)
    assert (events[-1].finish_reason, events[-1].provider_finish_reason) == ("tool_calls", "STOP")


def test_missing_call_id_is_generated_from_the_block_index() -> None:
    events, _ = run(chunk(th("r")), chunk(fc("a"), fc("b", id="given")), chunk(fc("c")), STOP)
    ids = [b.call_id for b in reduce(events).blocks if isinstance(b, ToolCallBlock)]
    assert ids == ["call_1", "given", "call_3"]


def test_generated_call_ids_are_identical_across_replays_and_chunkings() -> None:
    path = ROOT / "transcripts" / "gemini_sse" / "missing_call_ids_generated.sse"
    body = path.read_bytes()
    whole, _ = replay_reads([body], provider="gemini")
    again, _ = replay_reads([body[i : i + 3] for i in range(0, len(body), 3)], provider="gemini")
    ids = [e.tool.call_id for e in whole if isinstance(e, BlockStart) and e.tool]
    assert ids == [e.tool.call_id for e in again if isinstance(e, BlockStart) and e.tool]
    assert ids == ["call_1", "call_2", "call_3"]


@pytest.mark.parametrize("call", [{"args": {"a": 1}}, {"id": "x"}, {"name": ""}])
def test_function_call_without_a_name_fails_protocol(call: dict[str, Any]) -> None:
    assert error_of(chunk({"functionCall": call}), STOP).error.category == "protocol"


def test_function_call_that_is_not_an_object_fails_protocol() -> None:
    assert error_of(chunk({"functionCall": "f()"}), STOP).error.category == "protocol"


# -- (c) signatures -----------------------------------------------------------


def test_signature_on_a_thought_part_rides_on_the_reasoning_block() -> None:
    events, _ = run(chunk(th("a")), chunk(th("b", thoughtSignature="S1")), chunk(t("c")), STOP)
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="ab", signature="S1"),
                                     TextBlock(index=1, text="c")]


def test_signature_on_a_function_call_rides_on_its_block_right_after_start() -> None:
    assert lines(chunk(fc("f", sig="S2", args={"q": 1})), STOP)[1:5] == [
        '2 block.start #0 tool_call tool {call_id "call_0", name "f"}',
        "3 block.delta #0 signature 'S2'",
        "4 block.delta #0 json_text '{\"q\":1}'",
        "5 block.stop  #0",
    ]


def test_only_the_first_signed_call_carries_a_signature() -> None:
    events, _ = run(chunk(fc("f", sig="S"), fc("f")), STOP)
    assert [b.signature for b in reduce(events).blocks] == ["S", None]


def test_signature_on_empty_text_part_rides_on_the_open_block() -> None:
    events, _ = run(chunk(t("Hi")), chunk(t("", thoughtSignature="S3"), finish="STOP"))
    assert reduce(events).blocks == [TextBlock(index=0, text="Hi", signature="S3")]


def test_signature_on_empty_text_part_rides_on_an_open_reasoning_block() -> None:
    events, _ = run(chunk(th("r")), chunk(t("", thoughtSignature="S3"), finish="STOP"))
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="r", signature="S3")]


@pytest.mark.parametrize("part", [{"thoughtSignature": "S4"}, {"thought": True, "thoughtSignature": "S4"}])
def test_signature_only_part_rides_on_the_open_block(part: dict[str, Any]) -> None:
    events, ignored = run(chunk(t("a")), chunk(part), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="a", signature="S4")]
    assert ignored == Counter()


def test_signature_on_empty_text_part_with_no_block_creates_none_and_is_counted() -> None:
    events, ignored = run(chunk(t("", thoughtSignature="S5"), finish="STOP"))
    assert [render(e) for e in events][1:] == [
        '2 stream.done completed, finish_reason stop, provider_finish_reason "STOP", usage null, '
        "response_id null, model null"]
    assert ignored == Counter({"thoughtSignature_without_block": 1})


def test_signature_on_empty_text_part_after_a_closed_call_is_counted() -> None:
    events, ignored = run(chunk(fc("f")), chunk(t("", thoughtSignature="S6"), finish="STOP"))
    assert reduce(events).blocks[0].signature is None
    assert ignored == Counter({"thoughtSignature_without_block": 1})


def test_second_signed_part_of_the_same_kind_starts_a_new_block() -> None:
    events, _ = run(chunk(t("a", thoughtSignature="S1")), chunk(t("b", thoughtSignature="S2")),
                    chunk(t("c")), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="a", signature="S1"),
                                     TextBlock(index=1, text="bc", signature="S2")]


def test_unsigned_part_after_a_signed_one_merges() -> None:
    events, _ = run(chunk(th("a", thoughtSignature="S1")), chunk(th("b")), STOP)
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="ab", signature="S1")]


def test_loose_signature_on_an_already_signed_block_is_counted() -> None:
    events, ignored = run(chunk(t("a", thoughtSignature="S1")), chunk(t("", thoughtSignature="S2")), STOP)
    assert reduce(events).blocks == [TextBlock(index=0, text="a", signature="S1")]
    assert ignored == Counter({"thoughtSignature_without_block": 1})


# -- (c) terminal -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "finish"),
    [
        ("STOP", "completed", "stop"),
        ("MAX_TOKENS", "incomplete", "length"),
        *[(r, "incomplete", "content_filter") for r in (
            "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
            "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION")],
        *[(r, "incomplete", "other") for r in (
            "MALFORMED_FUNCTION_CALL", "OTHER", "LANGUAGE", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS",
            "NO_IMAGE", "IMAGE_OTHER", "FINISH_REASON_UNSPECIFIED", "SOMETHING_NEW")],
    ],
)
def test_finish_reason_maps_to_status_and_finish_reason(raw: str, status: str, finish: str) -> None:
    end = last(chunk(t("a")), chunk(None, finish=raw))
    assert isinstance(end, StreamDone)
    assert (end.status, end.finish_reason, end.provider_finish_reason) == (status, finish, raw)


def test_finish_table_lists_only_stop_max_tokens_and_filters() -> None:
    assert set(FINISH.values()) == {("completed", "stop"), ("incomplete", "length"),
                                             ("incomplete", "content_filter")}


@pytest.mark.parametrize("raw", ["MAX_TOKENS", "SAFETY", "OTHER"])
def test_incomplete_finish_closes_open_blocks_in_index_order(raw: str) -> None:
    assert [r for r in lines(chunk(th("r")), chunk(t("a"), finish=raw)) if "stop " in r] == [
        "4 block.stop  #0", "7 block.stop  #1"]


def test_max_tokens_with_function_call_keeps_length() -> None:
    end = last(chunk(fc("f")), chunk(None, finish="MAX_TOKENS"))
    assert isinstance(end, StreamDone)
    assert (end.status, end.finish_reason) == ("incomplete", "length")


def test_finish_reason_then_truncated_body_is_interrupted_with_finish_reason() -> None:
    end = error_of(chunk(t("a"), finish="STOP"), truncated=True)
    assert (end.status, end.error.category, end.finish_reason) == ("interrupted", "transport", "stop")


def test_body_ended_without_finish_reason_is_interrupted_without_block_stop() -> None:
    out = lines(chunk(t("a")), chunk(t("b")))
    assert "block.stop" not in " ".join(out)
    assert out[-1] == ("5 stream.error interrupted, category transport, retryable true, provider_code null, "
                       "usage null, finish_reason null")


def test_empty_body_is_interrupted() -> None:
    assert error_of().status == "interrupted"


def test_json_array_never_closed_after_finish_is_interrupted() -> None:
    body = b'[{"candidates":[{"content":{"parts":[{"text":"a"}]},"finishReason":"STOP","index":0}]}\n'
    events, _ = replay_reads([body], provider="gemini", framing="json_array")
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.status, end.finish_reason) == ("interrupted", "stop")


def test_json_array_closed_after_finish_completes() -> None:
    body = b'[{"candidates":[{"content":{"parts":[{"text":"a"}]},"finishReason":"STOP","index":0}]}\n]'
    events, _ = replay_reads([body], provider="gemini", framing="json_array")
    assert isinstance(events[-1], StreamDone)


def test_usage_only_chunk_after_finish_updates_usage() -> None:
    usage = {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5}
    end = last(chunk(t("a"), finish="STOP", usage={"promptTokenCount": 3}), {"usageMetadata": usage})
    assert isinstance(end, StreamDone)
    assert end.usage == Usage(input_tokens=3, output_tokens=2)


@pytest.mark.parametrize(("late", "blocks"), [
    (chunk(t("more")), [TextBlock(index=0, text="amore")]),
    (chunk(th("more")), [TextBlock(index=0, text="a"), ReasoningBlock(index=1, text="more")]),
])
def test_content_after_an_intermediate_finish_continues_and_the_last_finish_counts(
        late: dict[str, Any], blocks: list[Any]) -> None:
    # PROVIDERS.md 5.3 (amended): a finishReason followed by more content is not final.
    events, ignored = run(chunk(t("a"), finish="STOP"), late, chunk(None, finish="MAX_TOKENS"))
    end = events[-1]
    assert isinstance(end, StreamDone)
    assert (end.status, end.finish_reason, end.provider_finish_reason) == ("incomplete", "length", "MAX_TOKENS")
    assert reduce(events).blocks == blocks
    assert ignored["finishReason_not_final"] == 1


def test_output_after_the_last_finish_reason_leaves_no_terminal() -> None:
    end = last(chunk(t("a"), finish="STOP"), chunk(t("b")))
    assert isinstance(end, StreamError)
    assert (end.status, end.error.category, end.finish_reason) == ("interrupted", "transport", None)


def test_stop_on_leading_empty_chunks_keeps_the_answer() -> None:
    empty = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]}
    events, _ = run(empty, empty, chunk(t("hi")), empty)
    assert isinstance(events[-1], StreamDone)
    assert reduce(events).blocks == [TextBlock(index=0, text="hi")]


def test_function_call_after_an_intermediate_stop_is_a_tool_call_turn() -> None:
    end = last(chunk(t("a"), finish="STOP"), chunk(fc("f"), finish="STOP"))
    assert isinstance(end, StreamDone)
    assert (end.status, end.finish_reason) == ("completed", "tool_calls")


def test_empty_signed_part_after_finish_is_accepted() -> None:
    events, _ = run(chunk(t("a"), finish="STOP"), chunk(t("", thoughtSignature="S")))
    assert reduce(events).blocks == [TextBlock(index=0, text="a", signature="S")]
    assert isinstance(events[-1], StreamDone)


def test_repeated_finish_reason_is_counted_and_the_last_wins() -> None:
    events, ignored = run(chunk(t("a"), finish="STOP"), chunk(None, finish="MAX_TOKENS"))
    assert isinstance(events[-1], StreamDone)
    assert events[-1].provider_finish_reason == "MAX_TOKENS"
    assert ignored == Counter({"finishReason_repeated": 1})


def test_response_id_and_model_version_reach_done() -> None:
    end = last(chunk(t("a"), responseId="r1", modelVersion="gemini-x"), chunk(None, finish="STOP"))
    assert isinstance(end, StreamDone)
    assert (end.response_id, end.model) == ("r1", "gemini-x")


def test_events_after_the_terminal_are_counted() -> None:
    err = {"error": {"code": 503, "message": "busy", "status": "UNAVAILABLE"}}
    events, ignored = run(chunk(t("a")), err, chunk(t("b")), STOP)
    assert isinstance(events[-1], StreamError)
    assert ignored == Counter({"after_terminal": 2})


# -- (c) errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "category", "retryable", "code"),
    [
        ({"code": 503, "status": "UNAVAILABLE"}, "upstream_overloaded", True, "UNAVAILABLE"),
        ({"code": 429, "status": "RESOURCE_EXHAUSTED"}, "rate_limited", True, "RESOURCE_EXHAUSTED"),
        ({"code": 500, "status": "INTERNAL"}, "upstream_error", True, "INTERNAL"),
        ({"code": 400, "status": "INVALID_ARGUMENT"}, "invalid_request", False, "INVALID_ARGUMENT"),
        ({"code": 401, "status": "UNAUTHENTICATED"}, "authentication", False, "UNAUTHENTICATED"),
        ({"code": 403, "status": "PERMISSION_DENIED"}, "permission", False, "PERMISSION_DENIED"),
        ({"code": 404, "status": "NOT_FOUND"}, "not_found", False, "NOT_FOUND"),
        ({"code": 504, "status": "DEADLINE_EXCEEDED"}, "upstream_error", True, "DEADLINE_EXCEEDED"),
        ({"code": 499, "status": "CANCELLED"}, "upstream_error", True, "CANCELLED"),
        ({"code": 400, "status": "FAILED_PRECONDITION"}, "invalid_request", False, "FAILED_PRECONDITION"),
        ({"code": 503}, "upstream_overloaded", True, "503"),
        ({"code": 429}, "rate_limited", True, "429"),
        ({"code": 502}, "upstream_error", True, "502"),
        ({}, "upstream_error", True, None),
    ],
)
def test_error_object_maps_to_category(error: dict[str, Any], category: str, retryable: bool,
                                       code: str | None) -> None:
    end = error_of(chunk(t("a")), {"error": {"message": "m", **error}})
    assert (end.status, end.error.category, end.error.retryable, end.error.provider_code) == (
        "failed", category, retryable, code)


@pytest.mark.parametrize("message", [
    "The input token count (1290417) exceeds the maximum number of tokens allowed (1048576).",
    "Request exceeds the context window of this model",
])
def test_invalid_argument_about_token_count_is_context_length_exceeded(message: str) -> None:
    end = error_of({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
    assert end.error.category == "context_length_exceeded"


def test_error_message_is_kept_and_credentials_are_masked() -> None:
    message = "API key not valid. key=AIzaSyA1234567890abcdefghijklmnopq"
    end = error_of({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
    assert "AIzaSyA1234567890" not in end.error.message
    assert end.error.message.startswith("API key not valid.")


def test_error_as_raw_json_frame_in_sse_fails_with_usage_so_far() -> None:
    error = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    raw = JSONFrame(text=json.dumps(error, indent=2))
    end = error_of(chunk(t("a"), usage={"promptTokenCount": 7}), raw)
    assert (end.error.category, end.error.provider_code) == ("upstream_overloaded", "UNAVAILABLE")
    assert end.usage == Usage(input_tokens=7, output_tokens=0)


def test_error_as_array_element_fails() -> None:
    end = error_of(chunk(t("a")), {"error": {"code": 500, "message": "x", "status": "INTERNAL"}}, framing="json_array")
    assert end.error.category == "upstream_error"


def test_error_after_finish_reason_fails_and_keeps_the_finish_reason() -> None:
    end = error_of(chunk(t("a"), finish="MAX_TOKENS"), {"error": {"code": 500, "status": "INTERNAL"}})
    assert (end.status, end.finish_reason) == ("failed", "length")


def test_error_given_as_a_string_is_upstream_error_with_its_message() -> None:
    end = error_of({"error": "backend exploded"})
    assert (end.error.category, end.error.provider_code, end.error.message) == (
        "upstream_error", None, "backend exploded")


def test_error_does_not_close_open_blocks() -> None:
    out = lines(chunk(t("a")), {"error": {"code": 503, "status": "UNAVAILABLE"}})
    assert not any("block.stop" in r for r in out)


def test_prompt_block_reason_without_candidates_fails_content_filter() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 9}}
    assert lines(blocked) == [
        "1 stream.start",
        '2 stream.error failed, category content_filter, retryable false, provider_code "SAFETY", '
        "usage 9/0/null/null, finish_reason null",
    ]


def test_prompt_feedback_without_block_reason_is_not_an_error() -> None:
    end = last({"promptFeedback": {"safetyRatings": []}}, chunk(t("a"), finish="STOP"))
    assert isinstance(end, StreamDone)


# -- (c) usage ------------------------------------------------------------------


def test_usage_is_the_latest_snapshot_with_thoughts_and_cache() -> None:
    first = {"promptTokenCount": 100, "thoughtsTokenCount": 10, "cachedContentTokenCount": 80}
    final = {"promptTokenCount": 100, "candidatesTokenCount": 7, "thoughtsTokenCount": 12,
             "cachedContentTokenCount": 80, "totalTokenCount": 119}
    end = last(chunk(th("r"), usage=first), chunk(t("a"), finish="STOP", usage=final))
    assert isinstance(end, StreamDone)
    assert end.usage == Usage(input_tokens=100, output_tokens=19, cached_input_tokens=80, reasoning_tokens=12)


def test_missing_candidates_count_counts_as_zero() -> None:
    end = last(chunk(None, finish="SAFETY", usage={"promptTokenCount": 31, "totalTokenCount": 31}))
    assert isinstance(end, StreamDone)
    assert end.usage == Usage(input_tokens=31, output_tokens=0)


def test_usage_snapshot_without_token_counts_is_not_a_report() -> None:
    counted = {"promptTokenCount": 4, "candidatesTokenCount": 1}
    end = last(chunk(t("a"), usage=counted), chunk(t("b"), finish="STOP", usage={"trafficType": "ON_DEMAND"}))
    assert isinstance(end, StreamDone)
    assert end.usage == Usage(input_tokens=4, output_tokens=1)


def test_usage_is_null_when_no_report_came() -> None:
    end = last(chunk(t("a"), finish="STOP"))
    assert isinstance(end, StreamDone)
    assert end.usage is None


# -- (c) framing and payload shapes ----------------------------------------------


def test_named_sse_event_is_counted_and_ignored() -> None:
    events, ignored = run(SSEFrame(event="keepalive", data="not json"), chunk(t("a"), finish="STOP"))
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"event:keepalive": 1})


@pytest.mark.parametrize("payload", [{}, {"somethingNew": {"a": 1}}])
def test_payload_with_no_known_field_is_counted(payload: dict[str, Any]) -> None:
    events, ignored = run(payload, chunk(t("a"), finish="STOP"))
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"unknown_payload": 1})


def test_unknown_fields_in_a_known_chunk_are_fine() -> None:
    odd = chunk(t("a", partMetadata={"x": 1}), finish="STOP", createTime="2025", sdkHttpResponse={})
    odd["candidates"][0]["avgLogprobs"] = -0.1
    events, ignored = run(odd)
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter()


@pytest.mark.parametrize("text", ['{"candidates": [', "[DONE]", "[1, 2]", '"text"'])
def test_malformed_or_non_object_payload_fails_protocol(text: str) -> None:
    assert error_of(chunk(t("a")), SSEFrame(data=text)).error.category == "protocol"


@pytest.mark.parametrize("text", ["", " ", " \t "])
def test_empty_or_blank_data_event_is_counted_as_empty_data_and_skipped(text: str) -> None:
    # PROVIDERS.md 1, amended: relays insert empty data events; they carry nothing.
    adapter = GeminiAdapter(Normalizer(stream_id="st_t", provider="gemini", model="m", clock=lambda: 0))
    adapter.start()
    assert adapter.feed(SSEFrame(data=text)) == []
    assert adapter.ignored == Counter({"empty_data": 1})


@pytest.mark.parametrize("bad", [
    {"candidates": "x"},
    {"candidates": [5]},
    {"candidates": [{"content": "x", "index": 0}]},
    {"candidates": [{"content": {"parts": {"text": "a"}}, "index": 0}]},
    {"candidates": [{"content": {"parts": ["a"]}, "index": 0}]},
    {"candidates": [{"content": {"parts": [{"text": 5}]}, "index": 0}]},
])
def test_impossible_shapes_fail_protocol(bad: dict[str, Any]) -> None:
    assert error_of(bad).error.category == "protocol"


def test_non_object_array_element_fails_protocol() -> None:
    assert error_of(JSONFrame(text="[1]"), framing="json_array").error.category == "protocol"


# -- (c) Vertex streamed function-call arguments ---------------------------------


def pa(*pieces: dict[str, Any], more: bool = True) -> dict[str, Any]:
    call: dict[str, Any] = {"partialArgs": list(pieces)}
    if more:
        call["willContinue"] = True
    return {"functionCall": call}


def test_streamed_arguments_are_assembled_into_one_json_text_delta() -> None:
    out = lines(
        chunk(fc("f", willContinue=True, sig="S")),
        chunk(pa({"jsonPath": "$.a.b", "stringValue": "x"}, {"jsonPath": "$.n[1]", "numberValue": 2})),
        chunk({"functionCall": {"willContinue": True}}),
        chunk(pa({"jsonPath": "$.ok", "boolValue": False}, {"jsonPath": "$['odd key']", "nullValue": None})),
        chunk({"functionCall": {}}, finish="STOP"),
    )
    assert out[1:6] == [
        '2 block.start #0 tool_call tool {call_id "call_0", name "f"}',
        "3 block.delta #0 signature 'S'",
        "4 block.delta #0 json_text '{\"a\":{\"b\":\"x\"},\"n\":[null,2],\"ok\":false,\"odd key\":null}'",
        "5 block.stop  #0",
        '6 stream.done completed, finish_reason tool_calls, provider_finish_reason "STOP", usage null, '
        "response_id null, model null",
    ]


def test_streamed_string_pieces_with_will_continue_are_appended() -> None:
    events, _ = run(
        chunk(fc("f", willContinue=True)),
        chunk(pa({"jsonPath": "$.s", "stringValue": "Bos", "willContinue": True})),
        chunk(pa({"jsonPath": "$.s", "stringValue": "ton", "willContinue": True})),
        chunk(pa({"jsonPath": "$.s", "stringValue": ""})),
        chunk(pa({"jsonPath": "$.s2", "stringValue": "new"}, more=False)),
        STOP,
    )
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert block.arguments == {"s": "Boston", "s2": "new"}


def test_string_piece_without_continuation_replaces_the_value() -> None:
    args = StreamedArgs()
    args.add({"jsonPath": "$.s", "stringValue": "a"})
    args.add({"jsonPath": "$.s", "stringValue": "b"})
    assert args.text() == '{"s":"b"}'


def test_last_piece_without_will_continue_ends_the_streamed_call() -> None:
    events, _ = run(chunk(fc("f", willContinue=True)), chunk(pa({"jsonPath": "$.p", "numberValue": 0.3}, more=False)),
                    chunk(t(""), finish="STOP"))
    assert isinstance(events[-1], StreamDone)
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert block.arguments == {"p": 0.3}


def test_two_streamed_calls_in_a_row_are_two_blocks() -> None:
    events, _ = run(chunk(fc("f", willContinue=True)), chunk(pa({"jsonPath": "$.x", "numberValue": 1})),
                    chunk({"functionCall": {}}), chunk(fc("g", willContinue=True)), chunk({"functionCall": {}}),
                    STOP)
    blocks = reduce(events).blocks
    assert [(getattr(b, "name", None), getattr(b, "arguments", None)) for b in blocks] == [("f", {"x": 1}), ("g", {})]


def test_end_marker_without_a_streamed_call_is_counted() -> None:
    events, ignored = run(chunk(t("a")), chunk({"functionCall": {}}), STOP)
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"functionCall_end_without_call": 1})


def test_partial_args_without_a_streamed_call_fail_protocol() -> None:
    assert error_of(chunk(pa({"jsonPath": "$.a", "numberValue": 1}))).error.category == "protocol"


def test_new_call_before_the_streamed_one_ended_fails_protocol() -> None:
    assert error_of(chunk(fc("f", willContinue=True)), chunk(fc("g"))).error.category == "protocol"


def test_text_inside_a_streamed_call_fails_protocol() -> None:
    assert error_of(chunk(fc("f", willContinue=True)), chunk(t("x"))).error.category == "protocol"


def test_stop_with_a_streamed_call_open_fails_protocol() -> None:
    end = error_of(chunk(fc("f", willContinue=True)), chunk(pa({"jsonPath": "$.a", "numberValue": 1})), STOP)
    assert (end.status, end.error.category, end.finish_reason) == ("failed", "protocol", "stop")


def test_max_tokens_with_a_streamed_call_open_closes_it_with_what_arrived() -> None:
    events, _ = run(chunk(fc("f", willContinue=True)), chunk(pa({"jsonPath": "$.a", "numberValue": 1})),
                    chunk(None, finish="MAX_TOKENS"))
    end = events[-1]
    assert isinstance(end, StreamDone)
    assert (end.status, end.finish_reason) == ("incomplete", "length")
    assert reduce(events).blocks[0] == ToolCallBlock(index=0, call_id="call_0", name="f", arguments={"a": 1},
                                                     arguments_text='{"a":1}', closed=True)


def test_signature_on_a_later_streamed_piece_rides_on_the_call() -> None:
    events, _ = run(chunk(fc("f", willContinue=True)), chunk({**pa(), "thoughtSignature": "S"}),
                    chunk({"functionCall": {}}), STOP)
    assert reduce(events).blocks[0].signature == "S"


@pytest.mark.parametrize(("path", "segments"), [
    ("$.a", ("a",)),
    ("$.a.b[0].c", ("a", "b", 0, "c")),
    ("$['x y'][12]", ("x y", 12)),
    ('$["q"]', ("q",)),
    ("$", ()),
])
def test_parse_path_forms(path: str, segments: tuple[str | int, ...]) -> None:
    assert parse_path(path) == segments


@pytest.mark.parametrize("path", ["a.b", "$.", "$[x]", "$.a..b", 5, None])
def test_parse_path_rejects_bad_paths(path: object) -> None:
    with pytest.raises(UpstreamProtocolError):
        parse_path(path)


@pytest.mark.parametrize("pieces", [
    [{"jsonPath": "$.a", "numberValue": 1}, {"jsonPath": "$.a[0]", "numberValue": 2}],
    [{"jsonPath": "$.a[0]", "numberValue": 1}, {"jsonPath": "$.a.b", "numberValue": 2}],
    [{"jsonPath": "$.a.b", "numberValue": 1}, {"jsonPath": "$.a", "numberValue": 2}],
    [{"jsonPath": "$.a"}],
    [{"jsonPath": "$", "numberValue": 1}],
    ["x"],
])
def test_streamed_pieces_that_cannot_apply_fail_protocol(pieces: list[Any]) -> None:
    args = StreamedArgs()
    for piece in pieces[:-1]:
        args.add(piece)
    with pytest.raises(UpstreamProtocolError):
        args.add(pieces[-1])


# -- every transcript -------------------------------------------------------------


@pytest.mark.parametrize("path", BODIES, ids=[f"{p.parent.name}/{p.stem}" for p in BODIES])
def test_every_transcript_ends_with_exactly_one_terminal_and_valid_events(path: Path) -> None:
    events, _ = replay_reads([path.read_bytes()], provider="gemini",
                             framing="json_array" if path.parent.name == "gemini_json_array" else "sse")
    assert validate(events) == []
    assert sum(isinstance(e, StreamDone | StreamError) for e in events) == 1
