"""publisher.wire.agui_snapshot (pure): a ``MESSAGES_SNAPSHOT`` at any seq, then the rest, assembles the stream."""

from __future__ import annotations

from typing import Any

import pytest

from publisher.wire.agui import AGUITranslator
from publisher.wire.agui_snapshot import snapshot_events
from schema.contract import Event
from tests.publisher.agui_support import Applied, expected_view
from tests.publisher.helpers import block_start, delta, start, stop
from tests.publisher.node_support import GOLDENS, golden_events

SID = "st_snapwire"


def snapshot_then_rest(events: list[Event], k: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the snapshot group at seq ``k``, the AG-UI events of every event after it)."""
    translator = AGUITranslator(keep_text=True)
    for event in events[:k - 1]:
        translator.feed(event)
    last = translator.feed(events[k - 1])
    group, at = snapshot_events(translator, last if translator.finished else [])
    assert group[at]["type"] == "MESSAGES_SNAPSHOT"
    return group, [out for event in events[k:] for out in translator.feed(event)]


@pytest.mark.parametrize("path", GOLDENS, ids=lambda path: f"{path.parent.name}/{path.name.split('.')[0]}")
def test_a_snapshot_at_every_seq_of_every_golden_plus_the_rest_assembles_the_reducers_result(path: Any) -> None:
    events = golden_events(path, SID)
    expected = expected_view(events)
    whole = AGUITranslator()
    assert Applied().apply([out for event in events for out in whole.feed(event)]).view() == expected
    for k in range(1, len(events) + 1):
        group, rest = snapshot_then_rest(events, k)
        got = Applied().apply(group + rest).view()
        # a finished stream's snapshot holds its complete calls: none is started, so none ends
        ended = [] if k == len(events) else expected["ended"]
        assert got == {**expected, "ended": ended}, f"snapshot at seq {k} of {len(events)}"
        assert group[0]["type"] == "RUN_STARTED"
        snapshot = next(event for event in group if event["type"] == "MESSAGES_SNAPSHOT")
        if any(message.get("toolCalls") for message in snapshot["messages"]):
            assert group[-1]["type"] == "RUN_FINISHED", "only a completed stream's calls are in a snapshot"


def test_a_call_being_built_is_not_in_the_snapshot_but_started_again_after_it_with_its_arguments_so_far() -> None:
    events = [start(SID), block_start(SID, 2, 0), delta(SID, 3, 0, "Hi"),
              block_start(SID, 4, 1, "tool_call"), delta(SID, 5, 1, '{"a":', "json_text")]
    group, _ = snapshot_then_rest(events, len(events))
    assert [event["type"] for event in group] == [
        "RUN_STARTED", "MESSAGES_SNAPSHOT", "TEXT_MESSAGE_START", "TOOL_CALL_START", "TOOL_CALL_ARGS"]
    assert group[1]["messages"] == [{"id": f"{SID}:0", "role": "assistant", "content": "Hi"}]
    assert group[3]["parentMessageId"] == f"{SID}:0"
    assert group[4]["delta"] == '{"a":'


def test_closed_blocks_are_not_started_again_and_reasoning_is_a_reasoning_message() -> None:
    events = [start(SID), block_start(SID, 2, 0, "reasoning"), delta(SID, 3, 0, "think", "reasoning"),
              stop(SID, 4, 0, "reasoning"), block_start(SID, 5, 1), delta(SID, 6, 1, "answer"), stop(SID, 7, 1)]
    group, _ = snapshot_then_rest(events, len(events))
    assert [event["type"] for event in group] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
    assert group[1]["messages"] == [
        {"id": f"{SID}:0", "role": "reasoning", "content": "think", "metadata": {"fanout": {"visibility": "public"}}},
        {"id": f"{SID}:1", "role": "assistant", "content": "answer"}]


def test_nothing_before_stream_start() -> None:
    assert snapshot_events(AGUITranslator(keep_text=True), []) == ([], -1)


def test_a_snapshot_message_keeps_the_metadata_the_live_start_event_carries() -> None:
    events = [start(SID), block_start(SID, 2, 0, "refusal"), delta(SID, 3, 0, "no", "refusal")]
    group, _ = snapshot_then_rest(events, len(events))
    live = AGUITranslator()
    opening = [out for event in events[:2] for out in live.feed(event)][-1]
    assert group[1]["messages"][0]["metadata"] == opening["metadata"] == {"fanout": {"kind": "refusal"}}
