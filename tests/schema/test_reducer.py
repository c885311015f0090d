"""The reducer: prefixes, finished streams and tool arguments."""

from __future__ import annotations

from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    ErrorInfo,
    StreamDone,
    StreamError,
    StreamStart,
    ToolInfo,
    Usage,
)
from schema.reducer import ReasoningBlock, TextBlock, ToolCallBlock, parse_arguments, reduce, result_to_builtins

T0 = BlockRef(id="b0", index=0, kind="text")
C1 = BlockRef(id="b1", index=1, kind="tool_call")
R2 = BlockRef(id="b2", index=2, kind="reasoning")


def _stream() -> list:  # type: ignore[type-arg]
    return [
        StreamStart(stream_id="s", seq=1, ts=0, provider="p", model="asked"),
        BlockStart(stream_id="s", seq=2, ts=0, block=T0),
        BlockDelta(stream_id="s", seq=3, ts=0, block=T0, delta=Delta(kind="text", text="Hel")),
        BlockDelta(stream_id="s", seq=4, ts=0, block=T0, delta=Delta(kind="text", text="lo")),
        BlockStop(stream_id="s", seq=5, ts=0, block=T0),
        BlockStart(stream_id="s", seq=6, ts=0, block=C1, tool=ToolInfo(call_id="c1", name="f")),
        BlockDelta(stream_id="s", seq=7, ts=0, block=C1, delta=Delta(kind="json_text", text='{"a":')),
        BlockDelta(stream_id="s", seq=8, ts=0, block=C1, delta=Delta(kind="json_text", text="1}")),
    ]


def test_running_prefix_has_open_tool_without_arguments() -> None:
    result = reduce(_stream())
    assert result.status == "running"
    assert result.model == "asked"
    assert result.blocks[0] == TextBlock(index=0, text="Hello")
    tool = result.blocks[1]
    assert isinstance(tool, ToolCallBlock)
    assert (tool.closed, tool.arguments, tool.arguments_text) == (False, None, '{"a":1}')


def test_closed_tool_gets_parsed_arguments_and_done_fields() -> None:
    usage = Usage(input_tokens=3, output_tokens=4)
    events = [*_stream(), BlockStop(stream_id="s", seq=9, ts=0, block=C1),
              StreamDone(stream_id="s", seq=10, ts=0, status="completed", finish_reason="tool_calls",
                         provider_finish_reason="tool_use", usage=usage, response_id="r", model="real")]
    result = reduce(events)
    assert result.status == "completed"
    assert result.blocks[1].arguments == {"a": 1}  # type: ignore[union-attr]
    assert (result.usage, result.model, result.response_id) == (usage, "real", "r")
    assert result.provider_finish_reason == "tool_use"


def test_error_end_keeps_partial_blocks_and_error() -> None:
    err = ErrorInfo(category="transport", retryable=True, message="cut")
    result = reduce([*_stream(), StreamError(stream_id="s", seq=9, ts=0, status="interrupted", error=err,
                                             usage=None, finish_reason="length")])
    assert result.status == "interrupted"
    assert result.error == err
    assert result.finish_reason == "length"
    assert result.blocks[1].arguments is None  # type: ignore[union-attr]


def test_reasoning_signature_concatenated_and_defaults() -> None:
    events = [
        StreamStart(stream_id="s", seq=1, ts=0, provider="p", model="m"),
        BlockStart(stream_id="s", seq=2, ts=0, block=R2, visibility="internal", redacted=False),
        BlockDelta(stream_id="s", seq=3, ts=0, block=R2, delta=Delta(kind="text", text="think")),
        BlockDelta(stream_id="s", seq=4, ts=0, block=R2, delta=Delta(kind="signature", text="ab")),
        BlockDelta(stream_id="s", seq=5, ts=0, block=R2, delta=Delta(kind="signature", text="cd")),
    ]
    (block,) = reduce(events).blocks
    assert block == ReasoningBlock(index=2, text="think", signature="abcd", visibility="internal")


def test_blocks_ordered_by_index_not_arrival() -> None:
    events = [
        StreamStart(stream_id="s", seq=1, ts=0, provider="p", model="m"),
        BlockStart(stream_id="s", seq=2, ts=0, block=C1, tool=ToolInfo(call_id="c", name="f")),
        BlockStart(stream_id="s", seq=3, ts=0, block=T0),
    ]
    assert [b.index for b in reduce(events).blocks] == [0, 1]


def test_empty_arguments_mean_empty_object() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments("[1]") is None
    assert parse_arguments('{"a"') is None


def test_builtins_has_every_top_level_field() -> None:
    data = result_to_builtins(reduce([], stream_id="st_x"))
    assert set(data) == {"stream_id", "status", "finish_reason", "provider_finish_reason", "error", "blocks",
                         "usage", "model", "response_id", "endpoint"}
    assert data["stream_id"] == "st_x"


def test_result_names_the_endpoint_of_the_terminal_event() -> None:
    done = StreamDone(stream_id="s", seq=9, ts=0, status="completed", finish_reason="stop",
                      provider_finish_reason="stop", usage=None, response_id="r", model="dep-1", endpoint="azure-east")
    result = reduce([*_stream()[:5], done])
    assert (result.endpoint, result.model) == ("azure-east", "dep-1")
    error = StreamError(stream_id="s", seq=6, ts=0, status="failed", usage=None, finish_reason=None,
                        error=ErrorInfo(category="rate_limited", retryable=True, message="m"), endpoint="openai")
    assert reduce([*_stream()[:5], error]).endpoint == "openai"


def test_result_endpoint_is_null_while_running_and_without_one() -> None:
    assert reduce(_stream()).endpoint is None
    done = StreamDone(stream_id="s", seq=9, ts=0, status="completed", finish_reason="stop",
                      provider_finish_reason="stop", usage=None, response_id="r", model=None)
    assert result_to_builtins(reduce([*_stream()[:5], done]))["endpoint"] is None
