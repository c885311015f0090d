"""The shared normalizer: seq, block ids, derived finish reasons and the single terminal."""

from __future__ import annotations

import msgspec
import pytest

from schema.contract import BlockDelta, BlockStart, BlockStop, StreamDone, StreamError, StreamStart
from schema.validate import validate
from worker.error_policy import safe_message
from worker.normalizer import Normalizer


def make(**kw: object) -> Normalizer:
    norm = Normalizer(stream_id="st_n", provider="p", model="m", clock=lambda: 42, **kw)  # type: ignore[arg-type]
    norm.start()
    return norm


def test_start_is_seq_one_with_clock_time() -> None:
    (event,) = make().take()
    assert isinstance(event, StreamStart)
    assert (event.seq, event.ts, event.stream_id) == (1, 42, "st_n")


def test_stored_start_is_not_emitted_again_and_seq_continues() -> None:
    norm = make(stored_seq=1)
    assert norm.take() == []
    norm.open_block("k", "tool_call", call_id="c", name="f")
    (event,) = norm.take()
    assert event.seq == 2


def test_blocks_get_indexes_in_order_of_public_start() -> None:
    norm = make()
    norm.open_block("late", "text")
    norm.delta("late", "text", "x")
    norm.open_block(("tool", 9), "tool_call", call_id="c", name="f")
    starts = [e for e in norm.take() if isinstance(e, BlockStart)]
    assert [(s.block.index, s.block.id) for s in starts] == [(0, "b0"), (1, "b1")]
    assert starts[1].tool is not None
    assert starts[1].tool.call_id == "c"


@pytest.mark.parametrize("kind", ["text", "reasoning", "refusal"])
def test_block_without_content_never_starts_and_the_next_takes_its_index(kind: str) -> None:
    norm = make()
    norm.take()
    norm.open_block("empty", kind)  # type: ignore[arg-type]
    norm.delta("empty", "text", "")
    assert norm.is_open("empty")
    assert norm.kind_of("empty") == kind
    norm.close_block("empty")
    assert norm.take() == []
    norm.open_block("next", "text")
    norm.delta("next", "signature", "S")
    norm.close_block("next")
    start, delta, stop = norm.take()
    assert isinstance(start, BlockStart)
    assert isinstance(delta, BlockDelta)
    assert isinstance(stop, BlockStop)
    assert (start.block.index, start.block.id, start.seq) == (0, "b0", 2)
    assert norm.block_count == 1


def test_tool_call_starts_at_once_even_without_arguments() -> None:
    norm = make()
    norm.take()
    norm.open_block("t", "tool_call", call_id="c", name="f")
    (start,) = norm.take()
    assert isinstance(start, BlockStart)
    assert start.block.kind == "tool_call"


def test_held_block_closed_by_close_all_emits_nothing() -> None:
    norm = make()
    norm.take()
    norm.open_block("k", "text")
    norm.close_all()
    norm.done(status="incomplete", finish_reason="length", provider_finish_reason="max_tokens")
    (done,) = norm.take()
    assert isinstance(done, StreamDone)


def test_empty_delta_adds_nothing() -> None:
    norm = make()
    norm.open_block("k", "text")
    norm.take()
    norm.delta("k", "text", "")
    assert norm.take() == []


def test_delta_for_unknown_block_fails_protocol() -> None:
    norm = make()
    norm.delta("nope", "text", "x")
    (event,) = norm.take()[-1:]
    assert isinstance(event, StreamError)
    assert (event.status, event.error.category, event.error.retryable) == ("failed", "protocol", False)


def test_done_with_open_block_fails_protocol_without_block_stop() -> None:
    norm = make()
    norm.open_block("k", "text")
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop")
    events = norm.take()
    assert not any(isinstance(e, BlockStop) for e in events)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.category == "protocol"


def test_completed_with_unparseable_tool_arguments_fails_protocol() -> None:
    norm = make()
    norm.open_block("t", "tool_call", call_id="c", name="f")
    norm.delta("t", "json_text", '{"a":')
    norm.close_block("t")
    norm.done(status="completed", finish_reason="tool_calls", provider_finish_reason="tool_calls")
    last = norm.take()[-1]
    assert isinstance(last, StreamError)
    assert last.error.category == "protocol"


def test_incomplete_with_unparseable_tool_arguments_is_done() -> None:
    norm = make()
    norm.open_block("t", "tool_call", call_id="c", name="f")
    norm.delta("t", "json_text", '{"a":')
    norm.close_all()
    norm.done(status="incomplete", finish_reason="length", provider_finish_reason="length")
    assert isinstance(norm.take()[-1], StreamDone)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [(["text"], "stop"), (["text", "tool_call"], "tool_calls"), (["refusal"], "refusal"),
     (["text", "refusal"], "stop"), (["reasoning", "refusal"], "refusal"), ([], "stop")],
)
def test_stop_is_derived_from_the_blocks(kinds: list[str], expected: str) -> None:
    norm = make()
    for i, kind in enumerate(kinds):
        norm.open_block(i, kind, call_id="c", name="f")  # type: ignore[arg-type]
        norm.delta(i, "json_text" if kind == "tool_call" else "text", "{}")
        norm.close_block(i)
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop")
    last = norm.take()[-1]
    assert isinstance(last, StreamDone)
    assert last.finish_reason == expected


def test_everything_after_terminal_is_ignored_and_counted() -> None:
    norm = make()
    norm.fail(category="transport", message="cut")
    norm.take()
    norm.open_block("k", "text")
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop")
    assert norm.take() == []
    assert norm.ignored["after_terminal"] == 2


def test_error_status_follows_category() -> None:
    for category, status in [("transport", "interrupted"), ("timeout", "interrupted"),
                             ("cancelled", "cancelled"), ("rate_limited", "failed")]:
        norm = make()
        norm.fail(category=category, message="x")  # type: ignore[arg-type]
        last = norm.take()[-1]
        assert isinstance(last, StreamError)
        assert last.status == status


def test_settle_appends_missing_tail() -> None:
    norm = make()
    norm.open_block("k", "text")
    norm.delta("k", "text", "Hel")
    assert norm.settle("k", "text", "Hello")
    deltas = [e.delta.text for e in norm.take() if isinstance(e, BlockDelta)]
    assert deltas == ["Hel", "lo"]


def test_settle_conflict_fails_protocol() -> None:
    norm = make()
    norm.open_block("k", "text")
    norm.delta("k", "text", "Hel")
    assert not norm.settle("k", "text", "Hey there")
    last = norm.take()[-1]
    assert isinstance(last, StreamError)
    assert last.error.category == "protocol"


def test_usage_rides_on_the_terminal() -> None:
    from schema.contract import Usage

    norm = make()
    norm.usage = Usage(input_tokens=1, output_tokens=2)
    norm.fail(category="upstream_overloaded", message="busy", provider_code="overloaded_error")
    last = norm.take()[-1]
    assert isinstance(last, StreamError)
    assert last.usage == Usage(input_tokens=1, output_tokens=2)
    assert last.error.provider_code == "overloaded_error"
    assert last.error.retryable is True


def test_opening_a_key_twice_fails_protocol() -> None:
    norm = make()
    norm.open_block("k", "text")
    norm.open_block("k", "text")
    last = norm.take()[-1]
    assert isinstance(last, StreamError)
    assert last.error.category == "protocol"


def test_emitted_streams_pass_the_validator() -> None:
    norm = make()
    norm.open_block("a", "reasoning")
    norm.delta("a", "text", "hmm")
    norm.delta("a", "signature", "sig")
    norm.close_all()
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="end_turn")
    events = norm.take()
    assert validate(events) == []
    assert isinstance(events[1], BlockStart)
    assert events[1].visibility == "public"


def test_safe_message_masks_keys_and_cuts_length() -> None:
    assert "sk-abcdefghijkl" not in safe_message("bad key sk-abcdefghijklmnop given")
    assert "hunter2" not in safe_message("https://x/y?key=hunter2&alt=sse")
    assert "abcdefgh12345678" not in safe_message("sent Authorization: Bearer abcdefgh12345678 upstream")
    assert "abcdefgh12345678" not in safe_message("token bearer abcdefgh12345678")
    assert len(safe_message("x" * 5000)) == 500


def test_terminals_name_the_endpoint_and_done_falls_back_to_the_upstream_model() -> None:
    norm = make(endpoint="azure-east", upstream_model="gpt4o-prod")
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop", model=None)
    done = norm.take()[-1]
    assert isinstance(done, StreamDone)
    assert (done.endpoint, done.model) == ("azure-east", "gpt4o-prod")
    norm = make(endpoint="azure-east", upstream_model="gpt4o-prod")
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop", model="gpt-4o-2024-08-06")
    assert norm.take()[-1].model == "gpt-4o-2024-08-06"  # type: ignore[union-attr]
    norm = make(endpoint="openai")
    norm.fail(category="rate_limited", message="slow down")
    error = norm.take()[-1]
    assert isinstance(error, StreamError)
    assert error.endpoint == "openai"


def test_terminals_leave_endpoint_out_without_one() -> None:
    norm = make()
    norm.done(status="completed", finish_reason="stop", provider_finish_reason="stop")
    done = norm.take()[-1]
    assert isinstance(done, StreamDone)
    assert done.model is None
    assert "endpoint" not in msgspec.to_builtins(done)
