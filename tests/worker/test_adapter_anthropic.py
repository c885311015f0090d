"""The Anthropic Messages adapter: BUG-CASES B10/B15/B16, the insertion property, each quirk."""

from __future__ import annotations

import json
import re
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
from schema.reducer import ReasoningBlock, TextBlock, ToolCallBlock, reduce
from schema.validate import validate
from tools.replay import replay_reads
from worker.adapters.anthropic import AnthropicAdapter
from worker.adapters.anthropic_parts import ERROR_TYPES, STOP_REASONS
from worker.frames import JSONFrame, SSEFrame
from worker.normalizer import Normalizer

ROOT = Path(__file__).resolve().parents[2]
BODIES = sorted((ROOT / "transcripts" / "anthropic").glob("*.sse")) + sorted(
    (ROOT / "tests" / "cases" / "transcripts" / "anthropic").glob("*.sse")
)

# -- helpers ------------------------------------------------------------------


def _q(value: str | None) -> str:
    return "null" if value is None else f'"{value}"'


def _n(value: int | None) -> str:
    return "null" if value is None else str(value)


def _usage(usage: Usage | None) -> str:
    if usage is None:
        return "null"
    parts = (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)
    return "/".join(_n(p) for p in parts)


def render(event: Event) -> str:
    """One event in BUG-CASES shorthand: ``seq type #index kind payload``."""
    if isinstance(event, StreamStart):
        return f"{event.seq} stream.start"
    if isinstance(event, BlockStart):
        line = f"{event.seq} block.start #{event.block.index} {event.block.kind}"
        if event.tool is not None:
            line += f" tool {{call_id {_q(event.tool.call_id)}, name {_q(event.tool.name)}}}"
        if event.redacted:
            line += " redacted"
        return line
    if isinstance(event, BlockDelta):
        return f"{event.seq} block.delta #{event.block.index} {event.delta.kind} '{event.delta.text}'"
    if isinstance(event, BlockStop):
        return f"{event.seq} block.stop #{event.block.index}"
    if isinstance(event, StreamDone):
        return (
            f"{event.seq} stream.done {event.status}, finish_reason {event.finish_reason}, "
            f"provider_finish_reason {_q(event.provider_finish_reason)}, usage {_usage(event.usage)}, "
            f"response_id {_q(event.response_id)}"
        )
    assert isinstance(event, StreamError)
    err = event.error
    return (
        f"{event.seq} stream.error {event.status}, category {err.category}, "
        f"retryable {str(err.retryable).lower()}, provider_code {_q(err.provider_code)}, "
        f"usage {_usage(event.usage)}, finish_reason {event.finish_reason or 'null'}"
    )


def run(body: bytes | list[bytes]) -> tuple[list[Event], Counter[str]]:
    """Replay a body (one read, or the given reads) and check 1-byte reads agree."""
    reads = [body] if isinstance(body, bytes) else body
    events, ignored = replay_reads(reads, provider="anthropic")
    whole = b"".join(reads)
    one_byte, _ = replay_reads([whole[i : i + 1] for i in range(len(whole))], provider="anthropic")
    assert one_byte == events
    assert validate(events) == []
    return events, ignored


def lines(body: bytes | list[bytes]) -> list[str]:
    return [render(e) for e in run(body)[0]]


def sse(*payloads: dict[str, Any] | str, event_lines: bool = True) -> bytes:
    """An SSE body: one event per payload (a dict is serialized; a str is sent as is)."""
    out = []
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        name = json.loads(data).get("type") if isinstance(payload, dict) else None
        head = f"event: {name}\n" if event_lines and name else ""
        out.append(f"{head}data: {data}\n\n")
    return "".join(out).encode()


def msg_start(msg_id: str = "msg_t1", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "content": [], "model": "claude-x",
        "stop_reason": None, "usage": usage if usage is not None else {"input_tokens": 5, "output_tokens": 1}}}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_start(index: int) -> dict[str, Any]:
    return block_start(index, {"type": "text", "text": ""})


def tool_start(index: int, call_id: str = "toolu_t1", name: str = "f", given: Any = None) -> dict[str, Any]:
    return block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": given or {}})


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def text(index: int, piece: str) -> dict[str, Any]:
    return delta(index, type="text_delta", text=piece)


def json_piece(index: int, piece: str) -> dict[str, Any]:
    return delta(index, type="input_json_delta", partial_json=piece)


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def msg_delta(reason: str | None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": usage if usage is not None else {"output_tokens": 9}}


MSG_STOP: dict[str, Any] = {"type": "message_stop"}
PING = '{"type": "ping"}'


def error(kind: str, message: str = "boom") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def simple(*middle: dict[str, Any] | str, reason: str = "end_turn") -> bytes:
    """message_start, text block 0 'hi', the given events, message_delta, message_stop."""
    return sse(msg_start(), text_start(0), text(0, "hi"), *middle, block_stop(0), msg_delta(reason), MSG_STOP)


def terminal(body: bytes) -> StreamDone | StreamError:
    events, _ = run(body)
    last = events[-1]
    assert isinstance(last, StreamDone | StreamError)
    return last


# -- (a) BUG-CASES ------------------------------------------------------------

B10 = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_j3v","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":18,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_j3v","name":"list_sessions","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}

event: message_stop
data: {"type":"message_stop"}

"""  # noqa: E501 - BUG-CASES input kept byte-exact

B10_VARIANT = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_j3v","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":18,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_j3v","name":"list_sessions","input":{"limit":5}}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}

event: message_stop
data: {"type":"message_stop"}

"""  # noqa: E501 - BUG-CASES input kept byte-exact

B15 = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_p8d","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":22,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Rivers flow toward"}}

event: error
data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}

"""  # noqa: E501 - BUG-CASES input kept byte-exact

B16 = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_c9t","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":31,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_c9t","name":"read_file","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"path\\": \\"/var/lo"}}

"""  # noqa: E501 - BUG-CASES input kept byte-exact

B16_VARIANT = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_c9u","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":31,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"All done."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":4}}

"""  # noqa: E501 - BUG-CASES input kept byte-exact


def test_b10_tool_use_with_only_an_empty_piece_has_no_delta_and_arguments_empty_object() -> None:
    events, _ = run(B10)
    assert [render(e) for e in events] == [
        "1 stream.start",
        '2 block.start #0 tool_call tool {call_id "toolu_j3v", name "list_sessions"}',
        "3 block.stop #0",
        '4 stream.done completed, finish_reason tool_calls, provider_finish_reason "tool_use", '
        'usage 18/12/null/null, response_id "msg_j3v"',
    ]
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert (block.arguments, block.arguments_text, block.closed) == ({}, "", True)


def test_b10_variant_input_whole_on_block_start_is_one_json_text_delta_before_stop() -> None:
    events, _ = run(B10_VARIANT)
    shown = [render(e) for e in events]
    assert shown[:2] == ["1 stream.start",
                         '2 block.start #0 tool_call tool {call_id "toolu_j3v", name "list_sessions"}']
    assert shown[3:] == [
        "4 block.stop #0",
        '5 stream.done completed, finish_reason tool_calls, provider_finish_reason "tool_use", '
        'usage 18/12/null/null, response_id "msg_j3v"',
    ]
    only = events[2]
    assert isinstance(only, BlockDelta)
    assert (only.block.index, only.delta.kind) == (0, "json_text")
    assert json.loads(only.delta.text) == {"limit": 5}
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert block.arguments == {"limit": 5}


def test_b15_error_event_mid_text_fails_overloaded_without_block_stop() -> None:
    events, _ = run(B15)
    assert [render(e) for e in events] == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'Rivers flow toward'",
        '4 stream.error failed, category upstream_overloaded, retryable true, '
        'provider_code "overloaded_error", usage 22/1/null/null, finish_reason null',
    ]
    result = reduce(events)
    assert result.status == "failed"
    assert result.blocks == [TextBlock(index=0, text="Rivers flow toward")]
    assert result.usage == Usage(input_tokens=22, output_tokens=1)


def test_b16_clean_eof_inside_tool_input_is_interrupted_and_tool_call_not_closed() -> None:
    events, _ = run(B16)
    assert [render(e) for e in events] == [
        "1 stream.start",
        '2 block.start #0 tool_call tool {call_id "toolu_c9t", name "read_file"}',
        "3 block.delta #0 json_text '{\"path\": \"/var/lo'",
        "4 stream.error interrupted, category transport, retryable true, provider_code null, "
        "usage 31/1/null/null, finish_reason null",
    ]
    result = reduce(events)
    block = result.blocks[0]
    assert result.status == "interrupted"
    assert isinstance(block, ToolCallBlock)
    assert (block.closed, block.arguments, block.arguments_text) == (False, None, '{"path": "/var/lo')


def test_b16_variant_cut_after_message_delta_is_interrupted_not_completed() -> None:
    events, _ = run(B16_VARIANT)
    assert [render(e) for e in events] == [
        "1 stream.start",
        "2 block.start #0 text",
        "3 block.delta #0 text 'All done.'",
        "4 block.stop #0",
        "5 stream.error interrupted, category transport, retryable true, provider_code null, "
        "usage 31/4/null/null, finish_reason stop",
    ]
    assert reduce(events).status == "interrupted"


# -- (b) insertion property ---------------------------------------------------

_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")
INSERTS: dict[bytes, str | None] = {
    b'event: ping\ndata: {"type": "ping"}\n\n': "ping",
    b'data: {"type": "ping"}\r\n\r\n': "ping",
    b": keep-alive\n\n": None,
    b'event: message_heartbeat\ndata: {"type":"message_heartbeat","at":1}\n\n': "message_heartbeat",
    b'data: {"type":"usage_hint","tokens":3}\n\n': "usage_hint",
}


def frame_boundaries(body: bytes) -> list[int]:
    """Offsets where a new SSE event may start: 0 and after every blank line."""
    cuts, pos = [0], 0
    for match in _LINE.finditer(body):
        pos = match.end()
        if match.group().strip(b"\r\n") == b"":
            cuts.append(pos)
    return cuts


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_inserted_pings_comments_and_unknown_events_change_only_the_ignored_counter(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(BODIES), label="transcript")
    body = path.read_bytes()
    cuts = frame_boundaries(body)
    picks = data.draw(st.lists(st.tuples(st.sampled_from(cuts), st.sampled_from(sorted(INSERTS))),
                               min_size=1, max_size=6), label="inserts")
    mutated = bytearray(body)
    for at, insert in sorted(picks, key=lambda p: p[0], reverse=True):
        mutated[at:at] = insert
    base_events, base_ignored = replay_reads([body], provider="anthropic")
    events, ignored = replay_reads([bytes(mutated)], provider="anthropic")
    assert events == base_events
    assert all(ignored[name] >= count for name, count in base_ignored.items())
    allowed = {n for n in INSERTS.values() if n} | {"after_terminal"}
    assert set((ignored - base_ignored).keys()) <= allowed


def test_frame_boundaries_find_every_event_start() -> None:
    body = b"event: a\ndata: 1\n\nevent: b\r\ndata: 2\r\n\r\ndata: 3\n\n"
    assert frame_boundaries(body) == [0, body.index(b"event: b"), body.index(b"data: 3"), len(body)]


# -- (c) routing and keep-alives ----------------------------------------------


def test_routes_on_payload_type_without_event_lines() -> None:
    body = sse(msg_start(), text_start(0), text(0, "hé 🙂"), block_stop(0), msg_delta("end_turn"), MSG_STOP,
               event_lines=False)
    assert lines(body)[1:4] == ["2 block.start #0 text", "3 block.delta #0 text 'hé 🙂'", "4 block.stop #0"]


def test_routes_on_payload_type_when_event_line_disagrees() -> None:
    body = simple().replace(b"event: content_block_delta", b"event: message_stop")
    assert lines(body)[2] == "3 block.delta #0 text 'hi'"
    assert isinstance(terminal(body), StreamDone)


def test_event_line_is_used_when_payload_has_no_type() -> None:
    body = simple().replace(b'data: {"type": "message_stop"}', b"data: {}")
    assert isinstance(terminal(body), StreamDone)


def test_ping_inside_open_block_is_ignored_and_counted_as_ping() -> None:
    events, ignored = run(simple(PING, PING))
    assert [render(e) for e in events][1:4] == ["2 block.start #0 text", "3 block.delta #0 text 'hi'",
                                                "4 block.stop #0"]
    assert ignored == Counter({"ping": 2})


def test_unknown_event_type_is_ignored_and_counted_under_its_name() -> None:
    events, ignored = run(simple({"type": "message_progress", "n": 1}))
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"message_progress": 1})


def test_json_padding_before_closing_brace_is_fine() -> None:
    body = simple().replace(b'"text": "hi"}}', b'"text": "hi"}     }')
    assert lines(body)[2] == "3 block.delta #0 text 'hi'"


def test_json_frame_is_routed_like_sse_data() -> None:
    adapter = AnthropicAdapter(Normalizer(stream_id="st_t", provider="anthropic", model="m", clock=lambda: 0))
    adapter.start()
    adapter.feed(SSEFrame(data=json.dumps(msg_start())))
    events = adapter.feed(JSONFrame(text=json.dumps(error("api_error"))))
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.provider_code == "api_error"


def test_malformed_json_payload_fails_protocol() -> None:
    body = sse(msg_start(), text_start(0), '{"type":"content_block_delta","index":0,')
    last = terminal(body)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("failed", "protocol")


def test_events_after_message_stop_are_ignored_as_after_terminal() -> None:
    events, ignored = run(simple() + sse(text_start(1), PING))
    assert isinstance(events[-1], StreamDone)
    assert ignored["after_terminal"] == 2


# -- (c) blocks ---------------------------------------------------------------


def test_thinking_block_gives_reasoning_text_and_signature_delta() -> None:
    body = sse(msg_start(), block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
               delta(0, type="thinking_delta", thinking="Let me think"),
               delta(0, type="signature_delta", signature="c2lnMQ=="), block_stop(0),
               msg_delta("end_turn"), MSG_STOP)
    events, _ = run(body)
    assert [render(e) for e in events][1:5] == [
        "2 block.start #0 reasoning", "3 block.delta #0 text 'Let me think'",
        "4 block.delta #0 signature 'c2lnMQ=='", "5 block.stop #0",
    ]
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="Let me think", signature="c2lnMQ==")]


def test_empty_thinking_block_never_exists_publicly() -> None:
    # PROVIDERS.md 7.4: a block that never receives content never exists publicly.
    body = sse(msg_start(), block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
               delta(0, type="thinking_delta", thinking=""), block_stop(0), msg_delta("end_turn"), MSG_STOP)
    assert lines(body)[1:] == ['2 stream.done completed, finish_reason stop, provider_finish_reason "end_turn", '
                               'usage 5/9/null/null, response_id "msg_t1"']


def test_empty_text_block_before_thinking_makes_no_block_and_indexes_close_ranks() -> None:
    # An Anthropic-compatible proxy opens and closes an empty text block before the thinking block.
    body = sse(msg_start(), block_start(0, {"type": "text", "text": ""}), block_stop(0),
               block_start(1, {"type": "thinking", "thinking": "", "signature": ""}),
               delta(1, type="thinking_delta", thinking="hm"), delta(1, type="signature_delta", signature="U0k="),
               block_stop(1), block_start(2, {"type": "text", "text": ""}), delta(2, type="text_delta", text="Hi"),
               block_stop(2), msg_delta("end_turn"), MSG_STOP)
    events, _ = run(body)
    assert [render(e) for e in events][1:8] == [
        "2 block.start #0 reasoning", "3 block.delta #0 text 'hm'", "4 block.delta #0 signature 'U0k='",
        "5 block.stop #0", "6 block.start #1 text", "7 block.delta #1 text 'Hi'", "8 block.stop #1",
    ]
    assert reduce(events).blocks == [ReasoningBlock(index=0, text="hm", signature="U0k="),
                                     TextBlock(index=1, text="Hi")]


def test_delta_after_the_stop_of_a_never_filled_block_still_fails() -> None:
    body = sse(msg_start(), block_start(0, {"type": "text", "text": ""}), block_stop(0),
               delta(0, type="text_delta", text="late"), msg_delta("end_turn"), MSG_STOP)
    events, _ = run(body)
    end = events[-1]
    assert len(events) == 2
    assert isinstance(end, StreamError)
    assert (end.status, end.error.category) == ("failed", "protocol")
    assert end.error.message == "upstream sent text_delta for a closed block index 0"


def test_never_filled_block_left_open_at_end_turn_still_fails() -> None:
    body = sse(msg_start(), block_start(0, {"type": "text", "text": ""}), msg_delta("end_turn"), MSG_STOP)
    assert lines(body)[1:][0].startswith("2 stream.error failed, category protocol")


def test_thinking_start_signature_is_sent_before_stop_when_no_signature_delta_comes() -> None:
    body = sse(msg_start(), block_start(0, {"type": "thinking", "thinking": "", "signature": "U1RBUlQ="}),
               delta(0, type="thinking_delta", thinking="x"), block_stop(0), msg_delta("end_turn"), MSG_STOP)
    assert lines(body)[2:5] == ["3 block.delta #0 text 'x'", "4 block.delta #0 signature 'U1RBUlQ='",
                                "5 block.stop #0"]


def test_signature_delta_replaces_a_start_signature() -> None:
    body = sse(msg_start(), block_start(0, {"type": "thinking", "thinking": "", "signature": "U1RBUlQ="}),
               delta(0, type="signature_delta", signature="REVMVEE="), block_stop(0),
               msg_delta("end_turn"), MSG_STOP)
    assert lines(body)[2:4] == ["3 block.delta #0 signature 'REVMVEE='", "4 block.stop #0"]


def test_redacted_thinking_is_redacted_reasoning_with_data_as_one_signature() -> None:
    body = sse(msg_start(), block_start(0, {"type": "redacted_thinking", "data": "RW1vcGFxdWU="}), block_stop(0),
               text_start(1), text(1, "ok"), block_stop(1), msg_delta("end_turn"), MSG_STOP)
    events, _ = run(body)
    assert [render(e) for e in events][1:4] == [
        "2 block.start #0 reasoning redacted", "3 block.delta #0 signature 'RW1vcGFxdWU='", "4 block.stop #0",
    ]
    assert reduce(events).blocks[0] == ReasoningBlock(index=0, text="", signature="RW1vcGFxdWU=", redacted=True)


def test_text_given_on_block_start_is_the_first_delta() -> None:
    body = sse(msg_start(), block_start(0, {"type": "text", "text": "Hola"}), text(0, "!"), block_stop(0),
               msg_delta("end_turn"), MSG_STOP)
    assert lines(body)[2:4] == ["3 block.delta #0 text 'Hola'", "4 block.delta #0 text '!'"]


def test_tool_use_block_takes_call_id_and_name_and_pieces_as_json_text() -> None:
    body = sse(msg_start(), tool_start(0, "toolu_a1", "get_time"), json_piece(0, ""), json_piece(0, '{"tz": "Europe/'),
               json_piece(0, 'Oslo"}'), block_stop(0), msg_delta("tool_use"), MSG_STOP)
    events, _ = run(body)
    assert [render(e) for e in events][1:5] == [
        '2 block.start #0 tool_call tool {call_id "toolu_a1", name "get_time"}',
        "3 block.delta #0 json_text '{\"tz\": \"Europe/'", "4 block.delta #0 json_text 'Oslo\"}'",
        "5 block.stop #0",
    ]
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert block.arguments == {"tz": "Europe/Oslo"}


def test_tool_use_without_id_gets_a_stable_generated_call_id() -> None:
    body = sse(msg_start(), block_start(2, {"type": "tool_use", "name": "f", "input": {}}), block_stop(2),
               msg_delta("tool_use"), MSG_STOP)
    assert lines(body)[1] == '2 block.start #0 tool_call tool {call_id "toolu_fanout_2", name "f"}'


def test_streamed_pieces_win_over_a_non_empty_start_input() -> None:
    body = sse(msg_start(), tool_start(0, given={"a": 1}), json_piece(0, '{"a": 2}'), block_stop(0),
               msg_delta("tool_use"), MSG_STOP)
    assert lines(body)[2:4] == ["3 block.delta #0 json_text '{\"a\": 2}'", "4 block.stop #0"]


def test_whole_start_input_is_serialized_once_with_non_ascii_kept() -> None:
    body = sse(msg_start(), tool_start(0, given={"q": "東京 ☕", "n": [1, 2]}), block_stop(0),
               msg_delta("tool_use"), MSG_STOP)
    events, _ = run(body)
    only = events[2]
    assert isinstance(only, BlockDelta)
    assert json.loads(only.delta.text) == {"q": "東京 ☕", "n": [1, 2]}
    assert "東京" in only.delta.text


def test_server_tool_blocks_and_their_deltas_and_stops_are_ignored_and_counted() -> None:
    body = sse(msg_start(), text_start(0), text(0, "a"), block_stop(0),
               block_start(1, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
               json_piece(1, '{"query": "x"}'), block_stop(1),
               block_start(2, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
               block_stop(2), block_start(3, {"type": "code_execution_tool_result", "tool_use_id": "x", "content": {}}),
               block_stop(3), text_start(4), text(4, "b"), block_stop(4), msg_delta("end_turn"), MSG_STOP)
    events, ignored = run(body)
    assert [render(e) for e in events][4:7] == ["5 block.start #1 text", "6 block.delta #1 text 'b'",
                                                "7 block.stop #1"]
    assert ignored == Counter({"server_tool_use": 1, "server_tool_use.delta": 1, "server_tool_use.stop": 1,
                               "web_search_tool_result": 1, "web_search_tool_result.stop": 1,
                               "code_execution_tool_result": 1, "code_execution_tool_result.stop": 1})


def test_citations_delta_is_ignored_and_counted() -> None:
    cite = delta(0, type="citations_delta", citation={"type": "web_search_result_location", "cited_text": "c"})
    events, ignored = run(simple(cite))
    assert sum(isinstance(e, BlockDelta) for e in events) == 1
    assert ignored == Counter({"citations_delta": 1})


def test_unknown_block_type_is_ignored_with_its_deltas_and_stop() -> None:
    body = sse(msg_start(), block_start(0, {"type": "diagram"}), delta(0, type="text_delta", text="x"),
               block_stop(0), msg_delta("end_turn"), MSG_STOP)
    events, ignored = run(body)
    assert [render(e) for e in events][1:] == [
        '2 stream.done completed, finish_reason stop, provider_finish_reason "end_turn", '
        'usage 5/9/null/null, response_id "msg_t1"',
    ]
    assert ignored == Counter({"diagram": 1, "diagram.delta": 1, "diagram.stop": 1})


def test_unknown_delta_type_is_ignored_and_counted() -> None:
    events, ignored = run(simple(delta(0, type="sparkle_delta", sparkle="✨")))
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"sparkle_delta": 1})


# -- (c) protocol violations --------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (sse(msg_start(), text_start(0), text(1, "x")), "unknown block"),
        (sse(msg_start(), json_piece(4, "")), "for an unknown block index 4"),
        (sse(msg_start(), text_start(0), block_stop(0), text(0, "x")), "closed block"),
        (sse(msg_start(), block_stop(3)), "not open"),
        (sse(msg_start(), text_start(0), block_stop(0), text_start(0)), "reused content block index 0"),
        (sse(msg_start(), block_start(0, {"type": "diagram"}), text_start(0)), "reused content block index 0"),
        (sse(msg_start(), tool_start(0), text(0, "x")), "text_delta for a tool_call block"),
        (sse(msg_start(), text_start(0), json_piece(0, "{}")), "input_json_delta for a text block"),
        (sse(msg_start(), {"type": "content_block_start", "content_block": {"type": "text"}}), "valid index"),
        (sse(msg_start(), text_start(0), delta(0, type="text_delta")), "without a text string"),
        (sse(msg_start(), {"type": "content_block_start", "index": 0}), "content_block object"),
        (sse({"type": "message_start"}), "message object"),
    ],
    ids=["delta_unknown_index", "empty_delta_unknown_index", "delta_after_stop", "stop_unknown_index", "reused_index",
         "reused_skipped_index", "text_delta_on_tool", "json_on_text", "missing_index",
         "delta_without_text", "start_without_block", "start_without_message"],
)
def test_impossible_block_sequence_fails_protocol(body: bytes, message: str) -> None:
    last = terminal(body)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "protocol", False)
    assert message in last.error.message


def test_second_message_start_with_different_id_fails_protocol() -> None:
    body = sse(msg_start("msg_a"), text_start(0), text(0, "first"), msg_start("msg_b"), text_start(0))
    events, ignored = run(body)
    assert [render(e) for e in events][-1].startswith("4 stream.error failed, category protocol")
    assert ignored == Counter({"after_terminal": 1})


def test_duplicate_message_start_with_same_id_is_ignored() -> None:
    body = sse(msg_start("msg_a"), msg_start("msg_a"), text_start(0), text(0, "x"), block_stop(0),
               msg_delta("end_turn"), MSG_STOP)
    events, ignored = run(body)
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response_id == "msg_a"
    assert ignored == Counter({"message_start.duplicate": 1})


def test_message_stop_with_open_block_fails_protocol_and_keeps_finish_reason() -> None:
    body = sse(msg_start(), text_start(0), text(0, "x"), msg_delta("end_turn"), MSG_STOP)
    events, _ = run(body)
    assert render(events[-1]) == ("4 stream.error failed, category protocol, retryable false, provider_code null, "
                                  "usage 5/9/null/null, finish_reason stop")
    assert not any(isinstance(e, BlockStop) for e in events)


def test_message_stop_without_stop_reason_fails_protocol() -> None:
    for body in (simple().replace(b'"stop_reason": "end_turn"', b'"stop_reason": null'),
                 sse(msg_start(), text_start(0), block_stop(0), MSG_STOP)):
        last = terminal(body)
        assert isinstance(last, StreamError)
        assert (last.error.category, last.finish_reason) == ("protocol", None)
        assert "stop_reason" in last.error.message


def test_unknown_stop_reason_with_open_block_fails_protocol() -> None:
    body = sse(msg_start(), text_start(0), msg_delta("brand_new_reason"), MSG_STOP)
    last = terminal(body)
    assert isinstance(last, StreamError)
    assert (last.error.category, last.finish_reason) == ("protocol", "other")


# -- (c) terminal signals -----------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "status", "finish"),
    [("end_turn", "completed", "stop"), ("stop_sequence", "completed", "stop"),
     ("tool_use", "completed", "tool_calls"), ("pause_turn", "completed", "pause"),
     ("compaction", "completed", "pause"), ("refusal", "completed", "refusal"), ("max_tokens", "incomplete", "length"),
     ("model_context_window_exceeded", "incomplete", "length"), ("brand_new_reason", "incomplete", "other")],
)
def test_stop_reason_maps_to_status_and_finish_reason(reason: str, status: str, finish: str) -> None:
    last = terminal(simple(reason=reason))
    assert isinstance(last, StreamDone)
    assert (last.status, last.finish_reason, last.provider_finish_reason) == (status, finish, reason)
    assert (last.response_id, last.model) == ("msg_t1", "claude-x")


def test_stop_reason_table_covers_every_documented_value() -> None:
    documented = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
                  "model_context_window_exceeded", "compaction"}
    assert set(STOP_REASONS) == documented


def test_end_turn_with_a_tool_call_derives_tool_calls() -> None:
    body = sse(msg_start(), tool_start(0), json_piece(0, "{}"), block_stop(0), msg_delta("end_turn"), MSG_STOP)
    last = terminal(body)
    assert isinstance(last, StreamDone)
    assert (last.finish_reason, last.provider_finish_reason) == ("tool_calls", "end_turn")


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
def test_token_limit_closes_every_open_block_in_index_order(reason: str) -> None:
    body = sse(msg_start(), text_start(0), text(0, "cut"), tool_start(1, given={"k": "v"}), json_piece(1, ""),
               msg_delta(reason), MSG_STOP)
    events, _ = run(body)
    assert [render(e) for e in events][3:] == [
        '4 block.start #1 tool_call tool {call_id "toolu_t1", name "f"}',
        "5 block.stop #0",
        "6 block.delta #1 json_text '{\"k\":\"v\"}'",
        "7 block.stop #1",
        f'8 stream.done incomplete, finish_reason length, provider_finish_reason "{reason}", '
        'usage 5/9/null/null, response_id "msg_t1"',
    ]


def test_max_tokens_with_open_partial_tool_input_leaves_arguments_null() -> None:
    body = sse(msg_start(), tool_start(0), json_piece(0, '{"a": "b'), msg_delta("max_tokens"), MSG_STOP)
    events, _ = run(body)
    block = reduce(events).blocks[0]
    assert isinstance(block, ToolCallBlock)
    assert (block.closed, block.arguments, block.arguments_text) == (True, None, '{"a": "b')
    assert reduce(events).status == "incomplete"


def test_eof_before_message_stop_is_interrupted_without_block_stop() -> None:
    events, _ = run(sse(msg_start(), text_start(0), text(0, "x")))
    assert render(events[-1]) == ("4 stream.error interrupted, category transport, retryable true, "
                                  "provider_code null, usage 5/1/null/null, finish_reason null")


def test_body_cut_inside_a_frame_is_interrupted() -> None:
    body = sse(msg_start(), text_start(0), text(0, "x"), MSG_STOP)[:-3]
    last = terminal(body)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("interrupted", "transport")


# -- (c) errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "category", "retryable"),
    [("overloaded_error", "upstream_overloaded", True), ("rate_limit_error", "rate_limited", True),
     ("api_error", "upstream_error", True), ("timeout_error", "upstream_error", True),
     ("invalid_request_error", "invalid_request", False), ("authentication_error", "authentication", False),
     ("permission_error", "permission", False), ("not_found_error", "not_found", False),
     ("billing_error", "permission", False), ("mystery_error", "upstream_error", True)],
)
def test_error_type_maps_to_category_and_retryable(kind: str, category: str, retryable: bool) -> None:
    last = terminal(sse(msg_start(), error(kind, "Something went wrong")))
    assert isinstance(last, StreamError)
    info = last.error
    assert (last.status, info.category, info.retryable, info.provider_code) == ("failed", category, retryable, kind)
    assert info.message == "Something went wrong"


def test_error_type_table_covers_every_documented_type() -> None:
    documented = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                  "rate_limit_error", "timeout_error", "overloaded_error", "api_error", "billing_error"}
    assert set(ERROR_TYPES) == documented


@pytest.mark.parametrize("message", [
    "prompt is too long: 215000 tokens > 200000 maximum",
    "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000",
    "The request exceeds the model's maximum context length",
])
def test_invalid_request_about_prompt_length_is_context_length_exceeded(message: str) -> None:
    last = terminal(sse(msg_start(), error("invalid_request_error", message)))
    assert isinstance(last, StreamError)
    assert (last.error.category, last.error.retryable) == ("context_length_exceeded", False)


def test_other_invalid_request_stays_invalid_request() -> None:
    last = terminal(sse(error("invalid_request_error", "messages: text content blocks must be non-empty")))
    assert isinstance(last, StreamError)
    assert last.error.category == "invalid_request"


def test_error_without_error_object_is_upstream_error_with_null_code() -> None:
    last = terminal(sse({"type": "error"}))
    assert isinstance(last, StreamError)
    assert (last.error.category, last.error.provider_code, last.usage) == ("upstream_error", None, None)
    assert last.error.message


def test_error_message_credentials_are_masked() -> None:
    last = terminal(sse(error("authentication_error", "invalid x-api-key: sk-ant-api03-abcdefghijklmnop")))
    assert isinstance(last, StreamError)
    assert "abcdefghijklmnop" not in last.error.message


def test_message_stop_after_error_changes_nothing() -> None:
    events, ignored = run(sse(msg_start(), text_start(0), text(0, "x"), error("overloaded_error"),
                              msg_delta("end_turn"), MSG_STOP))
    assert render(events[-1]).startswith("4 stream.error failed, category upstream_overloaded")
    assert ignored == Counter({"after_terminal": 2})


def test_error_after_message_delta_carries_its_finish_reason() -> None:
    last = terminal(sse(msg_start(), text_start(0), block_stop(0), msg_delta("max_tokens"), error("api_error")))
    assert isinstance(last, StreamError)
    assert last.finish_reason == "length"


# -- (c) usage ----------------------------------------------------------------


def test_message_start_records_provisional_usage_for_an_early_error() -> None:
    last = terminal(sse(msg_start(usage={"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 1}),
                        error("api_error")))
    assert last.usage == Usage(input_tokens=10, output_tokens=1, cached_input_tokens=3)


def test_message_delta_usage_supersedes_start_field_by_field() -> None:
    start = {"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1}
    end = {"input_tokens": 200, "cache_read_input_tokens": 50, "output_tokens": 30}
    body = sse(msg_start(usage=start), text_start(0), block_stop(0), msg_delta("end_turn", end), MSG_STOP)
    assert terminal(body).usage == Usage(input_tokens=255, output_tokens=30, cached_input_tokens=50)


def test_output_tokens_only_delta_keeps_start_input() -> None:
    body = sse(msg_start(usage={"input_tokens": 18, "output_tokens": 1}), text_start(0), block_stop(0),
               msg_delta("end_turn", {"output_tokens": 12}), MSG_STOP)
    assert terminal(body).usage == Usage(input_tokens=18, output_tokens=12)


def test_thinking_tokens_become_reasoning_tokens() -> None:
    details = b'{"output_tokens": 9, "output_tokens_details": {"thinking_tokens": 4}}'
    body = simple().replace(b'{"output_tokens": 9}', details)
    assert terminal(body).usage == Usage(input_tokens=5, output_tokens=9, reasoning_tokens=4)


def test_input_is_null_when_input_tokens_never_sent() -> None:
    body = sse(msg_start(usage={"cache_read_input_tokens": 8, "output_tokens": 1}), text_start(0), block_stop(0),
               msg_delta("end_turn", {"output_tokens": 2}), MSG_STOP)
    assert terminal(body).usage == Usage(input_tokens=None, output_tokens=2, cached_input_tokens=8)


def test_null_and_non_integer_counters_leave_held_values() -> None:
    body = sse(msg_start(usage={"input_tokens": 4, "output_tokens": 1}), text_start(0), block_stop(0),
               msg_delta("end_turn", {"input_tokens": None, "output_tokens": "7", "cache_read_input_tokens": True}),
               MSG_STOP)
    assert terminal(body).usage == Usage(input_tokens=4, output_tokens=1)


def test_usage_is_null_when_no_report_came() -> None:
    start = msg_start()
    del start["message"]["usage"]
    body = sse(start, text_start(0), block_stop(0), {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
               MSG_STOP)
    assert terminal(body).usage is None


def test_reads_split_anywhere_give_the_same_events() -> None:
    body = simple(PING)
    whole, _ = replay_reads([body], provider="anthropic")
    for size in (2, 3, 7, 64):
        reads = [body[i : i + size] for i in range(0, len(body), size)]
        assert replay_reads(reads, provider="anthropic")[0] == whole


def test_empty_data_events_are_counted_as_empty_data_and_never_parsed() -> None:
    body = b"data:\n\n" + simple().replace(b"event: message_stop", b"event: ping\ndata: \n\nevent: message_stop")
    events, ignored = run(body)
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"empty_data": 2})
