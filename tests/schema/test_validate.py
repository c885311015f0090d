"""The five invariants, each broken once and named by its rule."""

from __future__ import annotations

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
)
from schema.validate import validate

B0 = BlockRef(id="b0", index=0, kind="text")


def start(seq: int = 1) -> StreamStart:
    return StreamStart(stream_id="s", seq=seq, ts=0, provider="p", model="m")


def bstart(seq: int) -> BlockStart:
    return BlockStart(stream_id="s", seq=seq, ts=0, block=B0)


def delta(seq: int) -> BlockDelta:
    return BlockDelta(stream_id="s", seq=seq, ts=0, block=B0, delta=Delta(kind="text", text="x"))


def stop(seq: int) -> BlockStop:
    return BlockStop(stream_id="s", seq=seq, ts=0, block=B0)


def done(seq: int) -> StreamDone:
    return StreamDone(stream_id="s", seq=seq, ts=0, status="completed", finish_reason="stop",
                      provider_finish_reason="stop", usage=None, response_id=None, model=None)


def error(seq: int) -> StreamError:
    return StreamError(stream_id="s", seq=seq, ts=0, status="interrupted", usage=None, finish_reason=None,
                       error=ErrorInfo(category="transport", retryable=True, message="cut"))


def rules(events: list[Event]) -> list[str]:
    return [v.rule for v in validate(events)]


def test_sound_stream_has_no_violation() -> None:
    assert rules([start(), bstart(2), delta(3), stop(4), done(5)]) == []


def test_prefix_of_a_running_stream_is_sound() -> None:
    assert rules([start(), bstart(2), delta(3)]) == []


def test_error_with_block_open_is_sound() -> None:
    assert rules([start(), bstart(2), delta(3), error(4)]) == []


def test_rule1_first_event_must_be_stream_start() -> None:
    assert rules([bstart(1)]) == ["first_is_start"]
    assert rules([start(seq=2)]) == ["first_is_start"]


def test_rule2_delta_for_unopened_block() -> None:
    assert rules([start(), delta(2)]) == ["block_is_open"]


def test_rule2_delta_after_block_stop() -> None:
    assert rules([start(), bstart(2), stop(3), delta(4)]) == ["block_is_open"]


def test_rule3_seq_gap_and_repeat() -> None:
    assert rules([start(), bstart(3)]) == ["seq_contiguous"]
    assert rules([start(), bstart(2), delta(2)]) == ["seq_contiguous"]


def test_rule3_gaps_allowed_for_public_projection() -> None:
    assert validate([start(), bstart(3), delta(7)], allow_seq_gaps=True) == []


def test_rule4_nothing_after_terminal() -> None:
    assert rules([start(), done(2), bstart(3)]) == ["nothing_after_terminal"]
    assert rules([start(), error(2), error(3)]) == ["nothing_after_terminal"]


def test_rule5_done_with_open_block() -> None:
    assert rules([start(), bstart(2), done(3)]) == ["done_with_blocks_closed"]


def test_block_started_twice_is_named() -> None:
    assert rules([start(), bstart(2), bstart(3)]) == ["block_unique"]


def test_violation_names_the_offending_seq() -> None:
    (violation,) = validate([start(), bstart(2), done(3)])
    assert violation.seq == 3
    assert "0" in violation.message
