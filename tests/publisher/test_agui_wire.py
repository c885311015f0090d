"""publisher.wire.agui: contract events → AG-UI events (pure), and the unique tool call ids both projections use."""

from __future__ import annotations

from typing import Any

from publisher.wire.agui import INCOMPLETE_CODE, AGUITranslator, sse_frame, token_usage
from publisher.wire.call_ids import CallIds
from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    ErrorInfo,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    ToolInfo,
    Usage,
)

SID = "st_agui"


def run(events: list[Event]) -> list[dict[str, Any]]:
    """The translation of ``events``, each event's ``timestamp`` checked and left out."""
    return plain(AGUITranslator(), events)


def plain(translator: AGUITranslator, events: list[Event]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        for produced in translator.feed(event):
            assert produced.pop("timestamp") == event.ts
            out.append(produced)
    return out


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def begin(metadata: dict[str, Any] | None = None) -> StreamStart:
    return StreamStart(stream_id=SID, seq=1, ts=5, provider="anthropic", model="m", metadata=metadata or {})


def ref(index: int, kind: str) -> BlockRef:
    return BlockRef(id=f"b{index}", index=index, kind=kind)  # type: ignore[arg-type]


def tool_block(seq: int, index: int, call_id: str, arguments: str, *, close: bool = True) -> list[Event]:
    block = ref(index, "tool_call")
    events: list[Event] = [
        BlockStart(stream_id=SID, seq=seq, ts=0, block=block, tool=ToolInfo(call_id=call_id, name="get_weather")),
        BlockDelta(stream_id=SID, seq=seq + 1, ts=0, block=block, delta=Delta(kind="json_text", text=arguments)),
    ]
    if close:
        events.append(BlockStop(stream_id=SID, seq=seq + 2, ts=0, block=block))
    return events


def text_block(seq: int, index: int, text: str, kind: str = "text") -> list[Event]:
    block = ref(index, kind)
    return [BlockStart(stream_id=SID, seq=seq, ts=0, block=block),
            BlockDelta(stream_id=SID, seq=seq + 1, ts=0, block=block, delta=Delta(kind="text", text=text)),
            BlockStop(stream_id=SID, seq=seq + 2, ts=0, block=block)]


def completed(seq: int, usage: Usage | None = None) -> StreamDone:
    return StreamDone(stream_id=SID, seq=seq, ts=9, status="completed", finish_reason="tool_calls",
                      provider_finish_reason="tool_use", usage=usage, response_id="r1", model="m-2")


def failed(seq: int, status: str = "failed", category: str = "rate_limited") -> StreamError:
    info = ErrorInfo(category=category, retryable=True, message="slow down")  # type: ignore[arg-type]
    return StreamError(stream_id=SID, seq=seq, ts=9, status=status, error=info,  # type: ignore[arg-type]
                       usage=Usage(input_tokens=3), finish_reason=None)


def test_a_text_stream_is_one_run_with_one_text_message_per_block() -> None:
    out = run([begin(), *text_block(2, 0, "Hel"), *text_block(5, 1, "lo"), completed(8)])
    assert types(out) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
                          "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert out[0] == {"type": "RUN_STARTED", "threadId": SID, "runId": SID, "protocolVersion": "1.0",
                      "metadata": {"fanout": {"stream_id": SID, "provider": "anthropic", "model": "m"}}}
    assert out[1] == {"type": "TEXT_MESSAGE_START", "messageId": f"{SID}:0", "role": "assistant"}
    assert out[2] == {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"{SID}:0", "delta": "Hel"}
    assert out[4]["messageId"] == f"{SID}:1"
    assert out[-1]["runId"] == SID
    assert out[-1]["metadata"]["fanout"]["finish_reason"] == "tool_calls"


def test_thread_id_comes_from_the_job_metadata_when_it_is_a_string() -> None:
    assert run([begin({"thread_id": "th_1"})])[0]["threadId"] == "th_1"
    assert run([begin({"thread_id": 7})])[0]["threadId"] == SID


def test_tool_call_end_is_held_back_until_the_stream_completed() -> None:
    events = [begin(), *text_block(2, 0, "Let me look."), *tool_block(5, 1, "call_1", '{"city":"Oslo"}')]
    translator = AGUITranslator()
    before_end = plain(translator, events)
    assert "TOOL_CALL_END" not in types(before_end)
    assert before_end[-2] == {"type": "TOOL_CALL_START", "toolCallId": "call_1", "toolCallName": "get_weather",
                              "parentMessageId": f"{SID}:0"}
    assert before_end[-1] == {"type": "TOOL_CALL_ARGS", "toolCallId": "call_1", "delta": '{"city":"Oslo"}'}
    end = translator.feed(completed(8))
    assert types(end) == ["TOOL_CALL_END", "RUN_FINISHED"]
    assert {event["timestamp"] for event in end} == {9}
    assert translator.finished


def test_every_non_completed_end_is_run_error_with_the_category_and_no_tool_call_end() -> None:
    for status, category in (("failed", "rate_limited"), ("interrupted", "transport"), ("cancelled", "cancelled")):
        out = run([begin(), *tool_block(2, 0, "call_1", '{"a":1}'), failed(5, status, category)])
        assert types(out) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "RUN_ERROR"]
        assert out[-1]["code"] == category
        assert out[-1]["message"] == f"{status}: slow down"
        assert out[-1]["usage"] == [{"provider": "anthropic", "model": "m", "inputTokens": 3}]


def test_an_incomplete_stream_is_run_error_incomplete() -> None:
    end = StreamDone(stream_id=SID, seq=5, ts=9, status="incomplete", finish_reason="length",
                     provider_finish_reason="max_tokens", usage=None, response_id=None, model=None)
    out = run([begin(), *tool_block(2, 0, "call_1", '{"a":'), end])
    assert types(out)[-1] == "RUN_ERROR"
    assert "TOOL_CALL_END" not in types(out)
    assert out[-1]["code"] == INCOMPLETE_CODE
    assert out[-1]["metadata"]["fanout"]["finish_reason"] == "length"


def test_a_completed_stream_whose_call_arguments_do_not_parse_is_a_run_error() -> None:
    out = run([begin(), *tool_block(2, 0, "call_1", "[1]"), completed(5)])
    assert types(out)[-1] == "RUN_ERROR"
    assert out[-1]["code"] == "protocol"


def test_parallel_calls_sharing_an_id_get_unique_ids_and_keep_the_providers() -> None:
    out = run([begin(), *tool_block(2, 0, "dup", "{}"), *tool_block(5, 1, "dup", "{}"), *tool_block(8, 2, "", "{}"),
               completed(11)])
    starts = [event for event in out if event["type"] == "TOOL_CALL_START"]
    assert [event["toolCallId"] for event in starts] == ["dup", "dup~1", "call~2"]
    assert "metadata" not in starts[0]
    assert starts[1]["metadata"] == {"fanout": {"call_id": "dup"}}
    assert starts[2]["metadata"] == {"fanout": {"call_id": ""}}
    assert {event["parentMessageId"] for event in starts} == {f"{SID}:0"}  # one assistant message holds them
    assert [event["toolCallId"] for event in out if event["type"] == "TOOL_CALL_END"] == ["dup", "dup~1", "call~2"]


def test_call_ids_are_stable_and_never_collide_with_a_later_provider_id() -> None:
    ids = CallIds()
    assert [ids.assign(0, "a"), ids.assign(1, "a"), ids.assign(2, "a~1"), ids.assign(1, "ignored")] == [
        "a", "a~1", "a~1~2", "a~1"]
    other = CallIds()
    assert [other.assign(0, "x"), other.assign(5, "x~1"), other.assign(1, "x")] == ["x", "x~1", "x~1~"]


def test_reasoning_is_a_span_with_one_message_and_its_signature_so_far_an_encrypted_value() -> None:
    block = ref(0, "reasoning")
    events: list[Event] = [
        begin(),
        BlockStart(stream_id=SID, seq=2, ts=0, block=block, visibility="public", redacted=False),
        BlockDelta(stream_id=SID, seq=3, ts=0, block=block, delta=Delta(kind="text", text="hmm")),
        BlockDelta(stream_id=SID, seq=4, ts=0, block=block, delta=Delta(kind="signature", text="sig-")),
        BlockDelta(stream_id=SID, seq=5, ts=0, block=block, delta=Delta(kind="signature", text="nature")),
        BlockStop(stream_id=SID, seq=6, ts=0, block=block),
    ]
    out = run(events)
    assert types(out) == ["RUN_STARTED", "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
                          "REASONING_ENCRYPTED_VALUE", "REASONING_ENCRYPTED_VALUE", "REASONING_MESSAGE_END",
                          "REASONING_END"]
    assert out[2]["role"] == "reasoning"
    assert out[1]["messageId"] == out[-1]["messageId"] == f"{SID}:0:span"
    assert out[4]["encryptedValue"] == "sig-"
    assert out[5] == {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": f"{SID}:0",
                      "encryptedValue": "sig-nature"}


def test_a_signature_on_a_tool_call_is_an_encrypted_value_of_the_call() -> None:
    block = ref(0, "tool_call")
    events = [begin(), *tool_block(2, 0, "c1", "{}", close=False),
              BlockDelta(stream_id=SID, seq=4, ts=0, block=block, delta=Delta(kind="signature", text="ts")),
              BlockStop(stream_id=SID, seq=5, ts=0, block=block)]
    out = run(events)
    assert out[-1] == {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call", "entityId": "c1",
                       "encryptedValue": "ts"}
    assert run(events[:-1])[-1] == out[-1]  # sent with the delta, not held until block.stop


def test_a_refusal_is_a_text_message_marked_as_a_refusal() -> None:
    out = run([begin(), *text_block(2, 0, "I can't.", kind="refusal")])
    assert out[1]["metadata"] == {"fanout": {"kind": "refusal"}}


def test_usage_keeps_absent_counts_absent_and_sums_the_total_only_when_both_are_known() -> None:
    full = Usage(input_tokens=10, output_tokens=4, cached_input_tokens=2, reasoning_tokens=None)
    assert token_usage(full, "anthropic", "m") == [{"provider": "anthropic", "model": "m", "inputTokens": 10,
                                                    "outputTokens": 4, "cachedInputTokens": 2, "totalTokens": 14}]
    assert token_usage(Usage(), "anthropic", "m") is None
    assert token_usage(None, "anthropic", "m") is None
    out = run([begin(), completed(2, usage=full)])
    assert out[-1]["usage"][0]["totalTokens"] == 14
    assert out[-1]["usage"][0]["model"] == "m-2"  # the model that answered, from stream.done


def test_reattach_restarts_the_run_and_reopens_what_is_still_open() -> None:
    translator = AGUITranslator()
    for event in [begin(), *text_block(2, 0, "done"), *tool_block(5, 1, "c1", "{}"),
                  BlockStart(stream_id=SID, seq=8, ts=0, block=ref(2, "text")),
                  BlockStart(stream_id=SID, seq=9, ts=0, block=ref(3, "reasoning"), visibility="public",
                             redacted=False)]:
        translator.feed(event)
    again = translator.reattach()
    assert types(again) == ["RUN_STARTED", "TOOL_CALL_START", "TEXT_MESSAGE_START", "REASONING_START",
                            "REASONING_MESSAGE_START"]
    assert again[0]["runId"] == SID
    assert again[1]["toolCallId"] == "c1"
    assert again[1]["parentMessageId"] == f"{SID}:0"
    assert again[2]["messageId"] == f"{SID}:2"
    assert again[4]["messageId"] == f"{SID}:3"


def test_nothing_follows_the_terminal_and_unknown_input_maps_to_nothing() -> None:
    translator = AGUITranslator()
    translator.feed(begin())
    assert translator.feed(failed(2))[0]["type"] == "RUN_ERROR"
    assert translator.feed(completed(3)) == []
    assert translator.reattach() == []
    assert AGUITranslator().feed(BlockStop(stream_id=SID, seq=2, ts=0, block=ref(4, "text"))) == []


def test_frames_are_the_encoders_data_lines_with_an_optional_id() -> None:
    event = {"type": "RUN_ERROR", "message": "é"}
    assert sse_frame(event) == b'data: {"type":"RUN_ERROR","message":"\xc3\xa9"}\n\n'
    assert sse_frame(event, b"7.ab") == b'id: 7.ab\ndata: {"type":"RUN_ERROR","message":"\xc3\xa9"}\n\n'
