"""The Bedrock ConverseStream adapter: blocks by contentBlockIndex, stop reasons, usage, the insertion property."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.contract import Event, StreamDone, StreamError, Usage
from schema.reducer import ReasoningBlock, TextBlock, ToolCallBlock, reduce
from schema.validate import validate
from tests.eventstream_build import message_of
from tools.replay import replay_reads
from worker.adapters.bedrock_converse import BedrockConverseAdapter
from worker.adapters.bedrock_converse_parts import STOP_REASONS, usage_of
from worker.frames import JSONFrame, SSEFrame
from worker.normalizer import Normalizer

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "transcripts" / "bedrock_converse").glob("*.frames.jsonl"))
Line = dict[str, Any]


def ev(name: str, **payload: Any) -> Line:
    return {"event": name, "payload": payload}


def text(index: int, piece: str) -> Line:
    return ev("contentBlockDelta", contentBlockIndex=index, delta={"text": piece})


def stop(index: int) -> Line:
    return ev("contentBlockStop", contentBlockIndex=index)


def end(reason: str = "end_turn") -> list[Line]:
    return [ev("messageStop", stopReason=reason), ev("metadata", usage={"inputTokens": 3, "outputTokens": 2})]


def run(*lines: Line) -> tuple[list[Event], Counter[str]]:
    body = b"".join(message_of(line) for line in lines)
    events, ignored = replay_reads([body], provider="bedrock_converse", framing="eventstream")
    single, _ = replay_reads([body[i : i + 1] for i in range(len(body))], provider="bedrock_converse",
                             framing="eventstream")
    assert single == events
    assert validate(events) == []
    return events, ignored


def last(*lines: Line) -> StreamDone | StreamError:
    final = run(*lines)[0][-1]
    assert isinstance(final, StreamDone | StreamError)
    return final


def test_text_block_opens_at_its_first_delta_and_usage_comes_from_metadata() -> None:
    events, ignored = run(ev("messageStart", role="assistant"), text(0, "Hi"), stop(0), *end())
    assert reduce(events).blocks == [TextBlock(index=0, text="Hi")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.status, done.finish_reason, done.provider_finish_reason) == ("completed", "stop", "end_turn")
    assert done.usage == Usage(input_tokens=3, output_tokens=2)
    assert ignored == Counter({"messageStart": 1})


def test_reasoning_signature_and_tool_input_assemble_by_block_index() -> None:
    events, _ = run(
        ev("contentBlockDelta", contentBlockIndex=0, delta={"reasoningContent": {"text": "think"}}),
        ev("contentBlockDelta", contentBlockIndex=0, delta={"reasoningContent": {"signature": "U0lH"}}),
        stop(0),
        ev("contentBlockStart", contentBlockIndex=1, start={"toolUse": {"toolUseId": "tu_1", "name": "f"}}),
        ev("contentBlockDelta", contentBlockIndex=1, delta={"toolUse": {"input": '{"a":'}}),
        ev("contentBlockDelta", contentBlockIndex=1, delta={"toolUse": {"input": "1}"}}),
        stop(1), *end("tool_use"))
    assert reduce(events).blocks == [
        ReasoningBlock(index=0, text="think", signature="U0lH"),
        ToolCallBlock(index=1, call_id="tu_1", name="f", arguments={"a": 1}, arguments_text='{"a":1}', closed=True),
    ]


@pytest.mark.parametrize(("reason", "status", "finish"), [
    ("end_turn", "completed", "stop"), ("stop_sequence", "completed", "stop"), ("tool_use", "completed", "tool_calls"),
    ("max_tokens", "incomplete", "length"), ("model_context_window_exceeded", "incomplete", "length"),
    ("guardrail_intervened", "incomplete", "content_filter"), ("content_filtered", "incomplete", "content_filter"),
    ("malformed_model_output", "incomplete", "other"), ("malformed_tool_use", "incomplete", "other"),
    ("brand_new_reason", "incomplete", "other")])
def test_stop_reason_maps_to_status_and_finish_reason(reason: str, status: str, finish: str) -> None:
    done = last(text(0, "x"), stop(0), *end(reason))
    assert isinstance(done, StreamDone)
    assert (done.status, done.finish_reason, done.provider_finish_reason) == (status, finish, reason)


def test_stop_reason_table_covers_the_service_model_enum() -> None:
    enum = {"end_turn", "tool_use", "max_tokens", "stop_sequence", "guardrail_intervened", "content_filtered",
            "malformed_model_output", "malformed_tool_use", "model_context_window_exceeded"}
    assert set(STOP_REASONS) == enum


def test_usage_folds_cache_counts_into_input() -> None:
    report = {"inputTokens": 10, "outputTokens": 4, "cacheReadInputTokens": 100, "cacheWriteInputTokens": 7}
    assert usage_of(report) == Usage(input_tokens=117, output_tokens=4, cached_input_tokens=100)
    assert usage_of({"outputTokens": 4}) == Usage(output_tokens=4)
    assert usage_of(None) is None


def test_body_ending_before_message_stop_is_interrupted() -> None:
    done = last(text(0, "x"), stop(0))
    assert isinstance(done, StreamError)
    assert (done.status, done.error.category) == ("interrupted", "transport")


def test_message_stop_without_stop_reason_fails_protocol() -> None:
    done = last(text(0, "x"), stop(0), ev("messageStop"))
    assert isinstance(done, StreamError)
    assert done.error.message == "upstream sent messageStop without a stopReason"


@pytest.mark.parametrize(("lines", "message"), [
    ([ev("contentBlockDelta", contentBlockIndex=2, delta={"toolUse": {"input": "{}"}})],
     "upstream sent toolUse input for block 2 it never started"),
    ([text(0, "a"), ev("contentBlockDelta", contentBlockIndex=0, delta={"reasoningContent": {"text": "b"}})],
     "upstream sent reasoning content for a text block"),
    ([text(0, "a"), stop(0), text(0, "b")], "upstream sent a delta for a closed block"),
    ([ev("contentBlockDelta", delta={"text": "a"})],
     "upstream sent contentBlockDelta without a valid contentBlockIndex"),
    ([ev("contentBlockStart", contentBlockIndex=0, start={"toolUse": {"toolUseId": "t", "name": "f"}}),
      ev("contentBlockStart", contentBlockIndex=0, start={"toolUse": {"toolUseId": "u", "name": "g"}})],
     "upstream reused contentBlockIndex 0"),
])
def test_impossible_sequences_fail_protocol(lines: list[Line], message: str) -> None:
    done = last(*lines, *end())
    assert isinstance(done, StreamError)
    assert (done.status, done.error.category, done.error.message) == ("failed", "protocol", message)


def test_non_contract_starts_deltas_and_stops_are_counted_under_their_kind() -> None:
    _, ignored = run(ev("contentBlockStart", contentBlockIndex=0, start={"image": {"format": "png"}}),
                     ev("contentBlockDelta", contentBlockIndex=0, delta={"image": {"source": {}}}), stop(0),
                     text(1, "a"), ev("contentBlockDelta", contentBlockIndex=1, delta={"citation": {}}), stop(1),
                     stop(7), ev("somethingNew", x=1), *end())
    assert ignored == Counter({"start.image": 1, "start.image.delta": 1, "start.image.stop": 1, "delta.citation": 1,
                               "contentBlockStop.unknown_index": 1, "somethingNew": 1})


def test_wrapped_json_frame_form_is_routed_on_its_key() -> None:
    adapter = BedrockConverseAdapter(Normalizer(stream_id="st_t", provider="bedrock_converse", model="m",
                                                clock=lambda: 0))
    adapter.start()
    adapter.feed(JSONFrame(text=json.dumps({"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "w"}}})))
    adapter.feed(SSEFrame(data=json.dumps({"contentBlockStop": {"contentBlockIndex": 0}})))
    adapter.feed(JSONFrame(text=json.dumps({"messageStop": {"stopReason": "end_turn"}})))
    events = adapter.finish()
    assert isinstance(events[-1], StreamDone)


_INSERTS: list[Line] = [ev("somethingNew", x=1), ev("messageStart", role="assistant"), ev("ping")]


@settings(max_examples=60)
@given(data=st.data())
def test_inserted_unknown_events_change_only_the_ignored_counter(data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(SOURCES), label="transcript")
    lines = [json.loads(x) for x in source.read_text(encoding="utf-8").splitlines()]
    if any("cut" in line or "corrupt" in line for line in lines):
        return
    picks = data.draw(st.lists(st.tuples(st.integers(0, len(lines)), st.sampled_from(range(len(_INSERTS)))),
                               min_size=1, max_size=4), label="inserts")
    mutated = list(lines)
    for at, which in sorted(picks, reverse=True):
        mutated[at:at] = [_INSERTS[which]]
    base = replay_reads([b"".join(map(message_of, lines))], provider="bedrock_converse", framing="eventstream")
    noisy = replay_reads([b"".join(map(message_of, mutated))], provider="bedrock_converse", framing="eventstream")
    assert noisy[0] == base[0]
    assert all(noisy[1][name] >= count for name, count in base[1].items())
