"""The OpenAI Responses adapter: BUG-CASES B09/B17, the insertion property, one test per quirk."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.contract import BlockDelta, BlockStart, BlockStop, Event, StreamDone, StreamError, StreamStart
from schema.reducer import reduce
from schema.validate import validate
from tools.replay import replay_reads
from worker.adapters.openai_responses import OpenAIResponsesAdapter
from worker.frames import JSONFrame, SSEFrame
from worker.normalizer import Normalizer

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "transcripts" / "openai_responses").glob("*.sse")) + sorted(
    (ROOT / "tests" / "cases" / "transcripts" / "openai_responses").glob("*.sse")
)

# -- helpers ----------------------------------------------------------------


def run(body: str | bytes, *, one_byte: bool = True) -> tuple[list[Event], Counter[str]]:
    """Replay a body in one read (and check 1-byte reads give the same events)."""
    data = body.encode() if isinstance(body, str) else body
    events, ignored = replay_reads([data], provider="openai_responses")
    if one_byte:
        single, _ = replay_reads([data[i : i + 1] for i in range(len(data))], provider="openai_responses")
        assert single == events
    assert validate(events) == []
    return events, ignored


def assembled(events: list[Event]) -> list[dict[str, Any]]:
    """The assembled result's blocks as plain dicts."""
    blocks: list[dict[str, Any]] = msgspec.to_builtins(reduce(events).blocks)
    return blocks


def _usage(u: Any) -> str:
    if u is None:
        return "null"
    return "/".join("null" if v is None else str(v) for v in
                    (u.input_tokens, u.output_tokens, u.cached_input_tokens, u.reasoning_tokens))


def render(events: list[Event]) -> list[str]:
    """Events in the BUG-CASES shorthand: ``seq type #index kind payload``."""
    out: list[str] = []
    for e in events:
        if isinstance(e, StreamStart):
            out.append(f"{e.seq} stream.start")
        elif isinstance(e, BlockStart):
            extra = f" tool {e.tool.call_id!r} {e.tool.name!r}" if e.tool else ""
            out.append(f"{e.seq} block.start #{e.block.index} {e.block.kind}{extra}")
        elif isinstance(e, BlockDelta):
            out.append(f"{e.seq} block.delta #{e.block.index} {e.delta.kind} {e.delta.text!r}")
        elif isinstance(e, BlockStop):
            out.append(f"{e.seq} block.stop #{e.block.index}")
        elif isinstance(e, StreamDone):
            out.append(f"{e.seq} stream.done {e.status} {e.finish_reason} {e.provider_finish_reason} "
                       f"usage {_usage(e.usage)} {e.response_id} {e.model}")
        else:
            assert isinstance(e, StreamError)
            out.append(f"{e.seq} stream.error {e.status} {e.error.category} retryable={e.error.retryable} "
                       f"{e.error.provider_code} usage {_usage(e.usage)} finish {e.finish_reason}")
    return out


def sse(*payloads: dict[str, Any] | str, event_lines: bool = True) -> str:
    """An SSE body of the given payloads (``str`` items are inserted verbatim)."""
    parts = []
    for n, p in enumerate(payloads):
        if isinstance(p, str):
            parts.append(p)
            continue
        body = {"type": p["type"], "sequence_number": n, **{k: v for k, v in p.items() if k != "type"}}
        head = f"event: {p['type']}\n" if event_lines else ""
        parts.append(f"{head}data: {json.dumps(body, ensure_ascii=False)}\n\n")
    return "".join(parts)


def response(status: str, *, output: list[Any] | None = None, usage: Any = None, rid: str = "resp_t1",
             model: str | None = "gpt-test", **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"id": rid, "object": "response", "status": status, "output": output or [], "usage": usage}
    if model is not None:
        r["model"] = model
    r.update(extra)
    return r


def created(**kw: Any) -> dict[str, Any]:
    return {"type": "response.created", "response": response("in_progress", **kw)}


def terminal(name: str, status: str, **kw: Any) -> dict[str, Any]:
    return {"type": name, "response": response(status, **kw)}


def completed(**kw: Any) -> dict[str, Any]:
    return terminal("response.completed", "completed", **kw)


def msg_item(mid: str = "msg_1", content: list[Any] | None = None, status: str = "completed") -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content or []}


def out_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def added(item: dict[str, Any], oi: int = 0) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": oi, "item": item}


def item_done(item: dict[str, Any], oi: int = 0) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": oi, "item": item}


def part_added(ptype: str = "output_text", ci: int = 0, oi: int = 0, mid: str = "msg_1") -> dict[str, Any]:
    part = {"type": ptype, "text": ""} if ptype != "refusal" else {"type": "refusal", "refusal": ""}
    return {"type": "response.content_part.added", "item_id": mid, "output_index": oi, "content_index": ci,
            "part": part}


def part_done(part: dict[str, Any], ci: int = 0, oi: int = 0, mid: str = "msg_1") -> dict[str, Any]:
    return {"type": "response.content_part.done", "item_id": mid, "output_index": oi, "content_index": ci, "part": part}


def text_delta(d: str, ci: int = 0, oi: int = 0, mid: str = "msg_1", kind: str = "output_text") -> dict[str, Any]:
    return {"type": f"response.{kind}.delta", "item_id": mid, "output_index": oi, "content_index": ci, "delta": d}


def text_done(t: str, ci: int = 0, oi: int = 0, mid: str = "msg_1") -> dict[str, Any]:
    return {"type": "response.output_text.done", "item_id": mid, "output_index": oi, "content_index": ci, "text": t}


def fc_item(args: str = "", *, fid: str = "fc_1", call: str | None = "call_1", name: str | None = "f",
            status: str = "completed") -> dict[str, Any]:
    item: dict[str, Any] = {"id": fid, "type": "function_call", "status": status, "arguments": args}
    if call is not None:
        item["call_id"] = call
    if name is not None:
        item["name"] = name
    return item


def args_delta(d: str, oi: int = 0, fid: str = "fc_1") -> dict[str, Any]:
    return {"type": "response.function_call_arguments.delta", "item_id": fid, "output_index": oi, "delta": d}


def args_done(a: str, oi: int = 0, fid: str = "fc_1", **extra: Any) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.done", "item_id": fid, "output_index": oi, "arguments": a,
            **extra}


def rs_item(summary: list[str] | None = None, enc: str | None = None, rid: str = "rs_1",
            content: list[str] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": rid, "type": "reasoning",
                            "summary": [{"type": "summary_text", "text": t} for t in summary or []]}
    if enc is not None:
        item["encrypted_content"] = enc
    if content is not None:
        item["content"] = [{"type": "reasoning_text", "text": t} for t in content]
    return item


def summary_delta(d: str, si: int = 0, oi: int = 0, rid: str = "rs_1") -> dict[str, Any]:
    return {"type": "response.reasoning_summary_text.delta", "item_id": rid, "output_index": oi,
            "summary_index": si, "delta": d}


def raw_delta(d: str, ci: int = 0, oi: int = 0, rid: str = "rs_1") -> dict[str, Any]:
    return {"type": "response.reasoning_text.delta", "item_id": rid, "output_index": oi, "content_index": ci,
            "delta": d}


def one_text(text_pieces: list[str], final: str | None = None) -> list[dict[str, Any]]:
    """A message with one output_text part, streamed and finished normally."""
    full = final if final is not None else "".join(text_pieces)
    return [added(msg_item(status="in_progress")), part_added(), *(text_delta(p) for p in text_pieces),
            text_done(full), part_done(out_text(full)), item_done(msg_item(content=[out_text(full)]))]


# -- BUG-CASES --------------------------------------------------------------

B09 = """event: response.created
data: {"type":"response.created","response":{"id":"resp_g52","status":"in_progress","usage":null},"sequence_number":0}

event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_g52","call_id":"call_g52","name":"run_query","arguments":"","status":"in_progress"},"sequence_number":1}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","item_id":"fc_g52","output_index":0,"delta":"{\\"sql\\":","sequence_number":2}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","item_id":"fc_g52","output_index":0,"delta":"\\"select 1\\"}","sequence_number":3}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","item_id":"fc_g52","output_index":0,"arguments":"{\\"sql\\":\\"select 1\\"}","sequence_number":4}

event: response.output_item.done
data: {"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_g52","call_id":"call_g52","name":"run_query","arguments":"{\\"sql\\":\\"select 1\\"}","status":"completed"},"sequence_number":5}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_g52","status":"completed","usage":{"input_tokens":37,"output_tokens":11,"total_tokens":48}},"sequence_number":6}

"""  # noqa: E501 - verbatim from BUG-CASES.md


def test_b09_call_opened_under_call_id_arguments_addressed_by_item_id() -> None:
    events, _ = run(B09)
    assert render(events) == [
        "1 stream.start",
        "2 block.start #0 tool_call tool 'call_g52' 'run_query'",
        "3 block.delta #0 json_text '{\"sql\":'",
        "4 block.delta #0 json_text '\"select 1\"}'",
        "5 block.stop #0",
        "6 stream.done completed tool_calls completed usage 37/11/null/null resp_g52 None",
    ]
    blocks = assembled(events)
    assert len(blocks) == 1
    assert {k: blocks[0][k] for k in ("kind", "call_id", "name", "arguments")} == {
        "kind": "tool_call", "call_id": "call_g52", "name": "run_query", "arguments": {"sql": "select 1"}}


B17_HEAD = """event: response.created
data: {"type":"response.created","response":{"id":"resp_r5k","status":"in_progress","usage":null},"sequence_number":0}

event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_r5k","role":"assistant","status":"in_progress","content":[]},"sequence_number":1}

event: response.content_part.added
data: {"type":"response.content_part.added","item_id":"msg_r5k","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]},"sequence_number":2}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_r5k","output_index":0,"content_index":0,"delta":"In short, the answer is","sequence_number":3}

"""  # noqa: E501 - verbatim from BUG-CASES.md
B17_A = """event: response.incomplete
data: {"type":"response.incomplete","response":{"id":"resp_r5k","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":48,"output_tokens":64,"total_tokens":112}},"sequence_number":4}

"""  # noqa: E501 - verbatim from BUG-CASES.md
B17_B = """event: response.failed
data: {"type":"response.failed","response":{"id":"resp_r5k","status":"failed","error":{"code":"server_error","message":"The model failed to finish."},"usage":null},"sequence_number":4}

"""  # noqa: E501 - verbatim from BUG-CASES.md
B17_C = """event: error
data: {"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached.","param":null,"sequence_number":4}

"""
B17_C_NESTED = """event: error
data: {"type":"error","sequence_number":4,"error":{"type":"tokens","code":"rate_limit_exceeded","message":"Rate limit reached.","param":null}}

"""  # noqa: E501 - verbatim from BUG-CASES.md
B17_COMMON = ["1 stream.start", "2 block.start #0 text", "3 block.delta #0 text 'In short, the answer is'"]


def test_b17_a_incomplete_max_output_tokens_closes_block_and_ends_length() -> None:
    events, _ = run(B17_HEAD + B17_A)
    assert render(events) == [
        *B17_COMMON,
        "4 block.stop #0",
        "5 stream.done incomplete length max_output_tokens usage 48/64/null/null resp_r5k None",
    ]
    assert reduce(events).status == "incomplete"


def test_b17_b_response_failed_server_error_without_block_stop() -> None:
    events, _ = run(B17_HEAD + B17_B)
    assert render(events) == [
        *B17_COMMON,
        "4 stream.error failed upstream_error retryable=True server_error usage null finish None",
    ]
    assert reduce(events).status == "failed"
    assert assembled(events) == [{"index": 0, "kind": "text", "signature": None, "text": "In short, the answer is"}]


@pytest.mark.parametrize("last", [B17_C, B17_C_NESTED], ids=["flat", "nested"])
def test_b17_c_error_event_rate_limited(last: str) -> None:
    events, _ = run(B17_HEAD + last)
    assert render(events) == [
        *B17_COMMON,
        "4 stream.error failed rate_limited retryable=True rate_limit_exceeded usage null finish None",
    ]
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.message == "Rate limit reached."


# -- insertion property -----------------------------------------------------

INSERTS: list[tuple[bytes, bool]] = [
    (b": keep-alive\n\n", False),
    (b"event: keepalive\ndata: {\"type\":\"keepalive\",\"sequence_number\":9001}\n\n", True),
    (b"event: response.future_feature\ndata: {\"type\":\"response.future_feature\","
     b"\"sequence_number\":9002}\n\n", True),
    (b"data: {\"type\":\"response.brand_new\",\"x\":[1,{\"y\":\"\\u00e9\"}]}\n\n", True),
    (b"event: response.web_search_call.searching\ndata: {\"type\":\"response.web_search_call.searching\","
     b"\"output_index\":7,\"item_id\":\"ws_x\",\"sequence_number\":9003}\n\n", True),
    (b"event: response.output_text.annotation.added\ndata: {\"type\":\"response.output_text.annotation.added\","
     b"\"item_id\":\"msg_x\",\"output_index\":0,\"content_index\":0,\"annotation\":{\"type\":\"url_citation\"}}\n\n",
     True),
]


def boundaries(body: bytes) -> list[int]:
    """Offsets where an SSE event ends (after a blank line), plus the start of the body."""
    out, pos, prev_blank = [0], 0, False
    for match in re.finditer(rb"[^\r\n]*(\r\n|\n|\r)", body):
        pos = match.end()
        blank = match.group(0) in (b"\n", b"\r\n", b"\r")
        if blank and not prev_blank:
            out.append(pos)
        prev_blank = blank
    return out


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_inserted_keepalives_comments_and_unknown_events_change_only_ignored(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(TRANSCRIPTS))
    body = path.read_bytes()
    spots = boundaries(body)
    picks = data.draw(st.lists(st.tuples(st.sampled_from(spots), st.sampled_from(INSERTS)), max_size=6))
    mutated = body
    for at, (chunk, _) in sorted(picks, key=lambda p: p[0], reverse=True):
        mutated = mutated[:at] + chunk + mutated[at:]
    base, base_ignored = replay_reads([body], provider="openai_responses")
    got, got_ignored = replay_reads([mutated], provider="openai_responses")
    assert got == base
    assert sum(got_ignored.values()) - sum(base_ignored.values()) == sum(1 for _, (_, counted) in picks if counted)
    assert got_ignored["keepalive"] + got_ignored["after_terminal"] >= base_ignored["keepalive"]


# -- routing ----------------------------------------------------------------


def test_routes_on_payload_type_not_event_line() -> None:
    body = sse(created(), *one_text(["Hi"]), completed()).replace(
        "event: response.output_text.delta", "event: response.completed")
    events, _ = run(body)
    assert render(events)[-1].startswith("5 stream.done completed stop")
    assert assembled(events)[0]["text"] == "Hi"


def test_data_only_body_without_event_lines() -> None:
    events, _ = run(sse(created(), *one_text(["Ol", "á"]), completed(), event_lines=False))
    assert render(events) == [
        "1 stream.start", "2 block.start #0 text", "3 block.delta #0 text 'Ol'", "4 block.delta #0 text 'á'",
        "5 block.stop #0", "6 stream.done completed stop completed usage null resp_t1 gpt-test",
    ]


def test_event_line_used_when_payload_has_no_type() -> None:
    body = sse(created(), *one_text(["x"])) + 'event: response.completed\ndata: {"response":{"id":"resp_t1"}}\n\n'
    events, _ = run(body)
    assert isinstance(events[-1], StreamDone)
    assert events[-1].status == "completed"


def test_unknown_event_counted_by_name() -> None:
    events, ignored = run(sse(created(), {"type": "response.shiny_new"}, *one_text(["x"]), completed()))
    assert ignored["response.shiny_new"] == 1
    assert isinstance(events[-1], StreamDone)


def test_sequence_number_is_diagnostic_only() -> None:
    body = sse(created(), *one_text(["a"]), completed()).replace('"sequence_number": ', '"sequence_number": 50')
    events, _ = run(body)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_malformed_json_fails_protocol() -> None:
    body = sse(created(), added(msg_item()), part_added(), text_delta("ok")) + 'data: {"type":"response.out\n\n'
    events, _ = run(body + sse(completed()))
    assert render(events)[-1] == "4 stream.error failed protocol retryable=False None usage null finish None"


# -- keepalive, [DONE], interruption ----------------------------------------


def test_keepalive_counted_as_keepalive_not_unknown() -> None:
    events, ignored = run(sse({"type": "keepalive"}, created(), added(msg_item()), part_added(), text_delta("a"),
                              {"type": "keepalive"}, text_delta("b"), text_done("ab"), part_done(out_text("ab")),
                              item_done(msg_item(content=[out_text("ab")])), completed()))
    assert ignored == Counter({"keepalive": 2})
    assert assembled(events)[0]["text"] == "ab"


def test_done_marker_after_terminal_ignored() -> None:
    events, ignored = run(sse(created(), *one_text(["x"]), completed()) + "data: [DONE]\n\n")
    assert isinstance(events[-1], StreamDone)
    assert ignored["after_terminal"] == 1


def test_done_marker_without_terminal_is_interrupted() -> None:
    events, ignored = run(sse(created(), *one_text(["x"])) + "data: [DONE]\n\n")
    assert render(events)[-1] == "5 stream.error interrupted transport retryable=True None usage null finish None"
    assert ignored["[DONE]"] == 1


def test_body_ending_without_terminal_is_interrupted_and_keeps_text() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("Hal")))
    assert render(events)[-1] == "4 stream.error interrupted transport retryable=True None usage null finish None"
    assert assembled(events)[0]["text"] == "Hal"


# -- message parts ----------------------------------------------------------


def test_text_done_appends_missing_tail() -> None:
    events, _ = run(sse(created(), *one_text(["Das ", "ist"], final="Das ist gut."), completed()))
    assert render(events)[2:6] == [
        "3 block.delta #0 text 'Das '", "4 block.delta #0 text 'ist'", "5 block.delta #0 text ' gut.'",
        "6 block.stop #0"]


def test_text_done_conflict_fails_protocol() -> None:
    events, _ = run(sse(created(), *one_text(["Paris"], final="Lyon"), completed()))
    assert render(events)[-1] == "4 stream.error failed protocol retryable=False None usage null finish None"


def test_content_part_done_closes_block_before_item_done() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("a"), part_done(out_text("a"))))
    assert render(events)[3] == "4 block.stop #0"


def test_empty_text_part_makes_no_block() -> None:
    events, _ = run(sse(created(), *one_text([""]), completed()))
    assert render(events) == ["1 stream.start", "2 stream.done completed stop completed usage null resp_t1 gpt-test"]


def test_delta_after_content_part_done_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("a"), part_done(out_text("a")),
                        text_delta("b")))
    assert render(events)[-1].startswith("5 stream.error failed protocol")


def test_two_parts_of_one_message_are_two_blocks() -> None:
    items = [added(msg_item()), part_added(), text_delta("eins"), part_done(out_text("eins")),
             part_added("refusal", ci=1), text_delta("nein", ci=1, kind="refusal"),
             part_done({"type": "refusal", "refusal": "nein"}, ci=1)]
    events, _ = run(sse(created(), *items, completed()))
    assert [(b["index"], b["kind"]) for b in assembled(events)] == [(0, "text"), (1, "refusal")]


def test_only_refusal_finishes_refusal() -> None:
    refusal = {"type": "refusal", "refusal": "Non posso."}
    events, _ = run(sse(created(), added(msg_item()), part_added("refusal"),
                        text_delta("Non posso.", kind="refusal"),
                        {"type": "response.refusal.done", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                         "refusal": "Non posso."},
                        part_done(refusal), item_done(msg_item(content=[refusal])), completed()))
    assert render(events)[1] == "2 block.start #0 refusal"
    assert render(events)[-1].startswith("5 stream.done completed refusal completed")


def test_reasoning_then_refusal_finishes_refusal() -> None:
    refusal = {"type": "refusal", "refusal": "No."}
    events, _ = run(sse(created(), added(rs_item()), summary_delta("think"), item_done(rs_item(["think"])),
                        added(msg_item(), oi=1), part_added("refusal", oi=1),
                        text_delta("No.", oi=1, kind="refusal"), part_done(refusal, oi=1),
                        item_done(msg_item(content=[refusal]), oi=1), completed()))
    assert isinstance(events[-1], StreamDone)
    assert events[-1].finish_reason == "refusal"


def test_refusal_delta_for_text_part_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("x", kind="refusal")))
    assert render(events)[-1].startswith("2 stream.error failed protocol")


def test_part_text_given_on_content_part_added_is_kept() -> None:
    added_part = part_added()
    added_part["part"]["text"] = "Vor"
    events, _ = run(sse(created(), added(msg_item()), added_part, text_delta("ab"), completed(
        output=[msg_item(content=[out_text("Vorab")])])))
    assert assembled(events)[0]["text"] == "Vorab"


# -- function calls ---------------------------------------------------------


def test_function_call_block_uses_call_id_and_finishes_tool_calls() -> None:
    events, _ = run(sse(created(), added(fc_item(status="in_progress")), args_delta('{"a"'), args_delta(":1}"),
                        args_done('{"a":1}'), item_done(fc_item('{"a":1}')), completed()))
    assert render(events)[1] == "2 block.start #0 tool_call tool 'call_1' 'f'"
    assert render(events)[-1].startswith("6 stream.done completed tool_calls completed")


def test_arguments_done_appends_missing_tail() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta('{"a":'), args_done('{"a":2}'),
                        item_done(fc_item('{"a":2}')), completed()))
    assert render(events)[2:5] == ["3 block.delta #0 json_text '{\"a\":'", "4 block.delta #0 json_text '2}'",
                                   "5 block.stop #0"]


def test_arguments_done_conflict_fails_protocol() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta('{"a":1'), args_done('{"b":2}')))
    assert render(events)[-1].startswith("4 stream.error failed protocol")


def test_output_item_done_arguments_win_without_arguments_done() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta('{"q":"'), item_done(fc_item('{"q":"x"}')),
                        completed()))
    assert assembled(events)[0]["arguments"] == {"q": "x"}


def test_function_call_without_name_waits_for_name() -> None:
    events, _ = run(sse(created(), added(fc_item(name=None)), args_delta("{}"),
                        args_done("{}", name="late_name"), item_done(fc_item("{}", name="late_name")), completed()))
    assert render(events)[1:4] == ["2 block.start #0 tool_call tool 'call_1' 'late_name'",
                                   "3 block.delta #0 json_text '{}'", "4 block.stop #0"]


def test_function_call_never_named_fails_protocol() -> None:
    events, _ = run(sse(created(), added(fc_item(name=None)), args_delta("{}"), item_done(fc_item("{}", name=None))))
    assert render(events) == ["1 stream.start",
                              "2 stream.error failed protocol retryable=False None usage null finish None"]


def test_function_call_without_call_id_gets_stable_id() -> None:
    events, _ = run(sse(created(), added(fc_item(call=None), oi=3), args_delta("{}", oi=3),
                        item_done(fc_item("{}", call=None), oi=3), completed()))
    assert render(events)[1] == "2 block.start #0 tool_call tool 'call_fanout_3' 'f'"


def test_arguments_addressed_by_output_index_when_item_id_missing() -> None:
    delta = args_delta('{"k":0}')
    del delta["item_id"]
    events, _ = run(sse(created(), added(fc_item()), delta, item_done(fc_item('{"k":0}')), completed()))
    assert assembled(events)[0]["arguments"] == {"k": 0}


def test_duplicate_output_item_added_ignored() -> None:
    events, ignored = run(sse(created(), added(fc_item()), added(fc_item()), args_delta("{}"),
                              item_done(fc_item("{}")), completed()))
    assert ignored["response.output_item.added.duplicate"] == 1
    assert len(assembled(events)) == 1


def test_completed_with_unparseable_arguments_fails_protocol() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta('{"a":'), item_done(fc_item('{"a":')), completed()))
    assert render(events)[-1].startswith("5 stream.error failed protocol")


# -- addressing -------------------------------------------------------------


def test_delta_for_unannounced_item_fails_protocol() -> None:
    events, _ = run(sse(created(), text_delta("x", mid="msg_zz", oi=4), completed()))
    assert render(events) == ["1 stream.start",
                              "2 stream.error failed protocol retryable=False None usage null finish None"]


def test_delta_after_item_done_fails_protocol() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta("{}"), item_done(fc_item("{}")), args_delta("x")))
    assert render(events)[-1].startswith("5 stream.error failed protocol")


def test_delta_kind_mismatch_fails_protocol() -> None:
    events, _ = run(sse(created(), added(fc_item()), text_delta("x", mid="fc_1")))
    assert render(events)[-1].startswith("3 stream.error failed protocol")


# -- reasoning --------------------------------------------------------------


def test_encrypted_content_taken_from_item_done_not_added() -> None:
    events, _ = run(sse(created(), added(rs_item(enc="gAAA")), summary_delta("S"),
                        item_done(rs_item(["S"], enc="gAAAfull==")), completed()))
    assert render(events)[1:5] == ["2 block.start #0 reasoning", "3 block.delta #0 text 'S'",
                                   "4 block.delta #0 signature 'gAAAfull=='", "5 block.stop #0"]


def test_empty_summary_still_yields_reasoning_block_with_signature() -> None:
    events, _ = run(sse(created(), added(rs_item(enc="gA")), item_done(rs_item(enc="gAAAsig")), completed()))
    block = assembled(events)[0]
    assert (block["kind"], block["text"], block["signature"], block["redacted"]) == ("reasoning", "", "gAAAsig", False)


def test_reasoning_without_text_or_signature_makes_no_block() -> None:
    events, _ = run(sse(created(), added(rs_item()), item_done(rs_item()), completed()))
    assert render(events)[1:] == ["2 stream.done completed stop completed usage null resp_t1 gpt-test"]


def test_multiple_summary_parts_joined_with_blank_line() -> None:
    events, _ = run(sse(created(), added(rs_item()), summary_delta("**A**"), summary_delta("**B**", si=1),
                        summary_delta(" b", si=1), item_done(rs_item(["**A**", "**B** b"])), completed()))
    assert assembled(events)[0]["text"] == "**A**\n\n**B** b"
    assert render(events)[3] == "4 block.delta #0 text '\\n\\n**B**'"


def test_empty_summary_part_adds_no_separator() -> None:
    events, _ = run(sse(created(), added(rs_item()), summary_delta("A"), summary_delta("", si=1),
                        summary_delta("C", si=2), item_done(rs_item(["A", "", "C"])), completed()))
    assert assembled(events)[0]["text"] == "A\n\nC"


def test_summary_done_appends_tail() -> None:
    events, _ = run(sse(created(), added(rs_item()), summary_delta("Plan"),
                        {"type": "response.reasoning_summary_text.done", "item_id": "rs_1", "output_index": 0,
                         "summary_index": 0, "text": "Plan: go"},
                        item_done(rs_item(["Plan: go"])), completed()))
    assert render(events)[3] == "4 block.delta #0 text ': go'"


def test_summary_done_conflict_fails_protocol() -> None:
    events, _ = run(sse(created(), added(rs_item()), summary_delta("Plan A"), item_done(rs_item(["Plan B"]))))
    assert render(events)[-1].startswith("4 stream.error failed protocol")


def test_raw_reasoning_text_read_when_no_summary() -> None:
    events, _ = run(sse(created(), added(rs_item(content=[])), part_added("reasoning_text", mid="rs_1"),
                        raw_delta("denke"), part_done({"type": "reasoning_text", "text": "denke nach"}, mid="rs_1"),
                        item_done(rs_item(content=["denke nach"])), completed()))
    assert assembled(events)[0]["text"] == "denke nach"


def test_second_reasoning_source_ignored_and_counted() -> None:
    events, ignored = run(sse(created(), added(rs_item()), raw_delta("raw"), summary_delta("sum"),
                              item_done(rs_item(["sum"], content=["raw"])), completed()))
    assert assembled(events)[0]["text"] == "raw"
    assert ignored["response.reasoning_summary_text.delta"] == 1


def test_reasoning_text_for_earlier_part_fails_protocol() -> None:
    events, _ = run(sse(created(), added(rs_item()), summary_delta("A"), summary_delta("B", si=1),
                        summary_delta("late", si=0)))
    assert render(events)[-1].startswith("5 stream.error failed protocol")


# -- final output settlement ------------------------------------------------


def test_skipped_done_events_settled_by_final_output() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("Hel"), added(fc_item(), oi=1),
                        args_delta('{"a"', oi=1),
                        completed(output=[msg_item(content=[out_text("Hello")]), fc_item('{"a":1}')])))
    assert render(events)[5:] == [
        "6 block.delta #0 text 'lo'", "7 block.stop #0", "8 block.delta #1 json_text ':1}'", "9 block.stop #1",
        "10 stream.done completed tool_calls completed usage null resp_t1 gpt-test"]


def test_final_output_conflict_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("Yes"),
                        completed(output=[msg_item(content=[out_text("No")])])))
    assert render(events)[-1] == "4 stream.error failed protocol retryable=False None usage null finish None"


def test_open_block_not_in_final_output_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("Yes"),
                        completed(usage={"input_tokens": 3, "output_tokens": 1})))
    assert render(events)[-1] == "4 stream.error failed protocol retryable=False None usage 3/1/null/null finish stop"


def test_final_output_item_never_announced_is_emitted() -> None:
    events, _ = run(sse(created(), completed(output=[msg_item("msg_9", [out_text("whole")])])))
    assert render(events)[1:4] == ["2 block.start #0 text", "3 block.delta #0 text 'whole'", "4 block.stop #0"]


def test_final_output_reasoning_signature_when_item_done_skipped() -> None:
    events, _ = run(sse(created(), added(rs_item(enc="g")), summary_delta("x"),
                        completed(output=[rs_item(["x"], enc="gFULL")])))
    assert assembled(events)[0]["signature"] == "gFULL"


# -- terminals --------------------------------------------------------------


def test_incomplete_content_filter_is_content_filter() -> None:
    events, _ = run(sse(created(), *one_text(["a"]), terminal("response.incomplete", "incomplete",
                                                             incomplete_details={"reason": "content_filter"})))
    assert render(events)[-1] == "5 stream.done incomplete content_filter content_filter usage null resp_t1 gpt-test"


def test_incomplete_content_filter_with_open_block_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item()), part_added(), text_delta("a"),
                        terminal("response.incomplete", "incomplete", incomplete_details={"reason": "content_filter"})))
    assert render(events)[-1].startswith("4 stream.error failed protocol")
    assert isinstance(events[-1], StreamError)
    assert events[-1].finish_reason == "content_filter"


def test_incomplete_unknown_reason_is_other() -> None:
    events, _ = run(sse(created(), terminal("response.incomplete", "incomplete",
                                            incomplete_details={"reason": "something_new"})))
    assert render(events)[-1] == "2 stream.done incomplete other something_new usage null resp_t1 gpt-test"


def test_incomplete_max_output_tokens_closes_open_tool_call() -> None:
    events, _ = run(sse(created(), added(fc_item()), args_delta('{"a":'),
                        terminal("response.incomplete", "incomplete",
                                 incomplete_details={"reason": "max_output_tokens"})))
    assert render(events)[-2:] == ["4 block.stop #0",
                                   "5 stream.done incomplete length max_output_tokens usage null resp_t1 gpt-test"]
    assert assembled(events)[0]["arguments"] is None


@pytest.mark.parametrize(
    ("code", "category", "retryable"),
    [("server_error", "upstream_error", True), ("rate_limit_exceeded", "rate_limited", True),
     ("invalid_prompt", "invalid_request", False), ("vector_store_timeout", "upstream_error", True),
     ("context_length_exceeded", "context_length_exceeded", False), ("image_too_large", "invalid_request", False),
     ("insufficient_quota", "rate_limited", False), ("brand_new_code", "upstream_error", True)],
)
def test_response_failed_code_maps_to_category(code: str, category: str, retryable: bool) -> None:
    events, _ = run(sse(created(), terminal("response.failed", "failed", error={"code": code, "message": "m"})),
                    one_byte=False)
    assert isinstance(events[-1], StreamError)
    assert (events[-1].error.category, events[-1].error.retryable, events[-1].error.provider_code) == (
        category, retryable, code)


def test_response_failed_without_error_object() -> None:
    events, _ = run(sse(created(), terminal("response.failed", "failed")))
    assert render(events)[-1] == "2 stream.error failed upstream_error retryable=True None usage null finish None"


def test_error_event_then_response_failed_keeps_first() -> None:
    events, ignored = run(sse(created(), {"type": "error", "error": {"code": "rate_limit_exceeded", "message": "slow"}},
                              terminal("response.failed", "failed", error={"code": "server_error", "message": "x"})))
    assert render(events)[-1].startswith("2 stream.error failed rate_limited")
    assert ignored["after_terminal"] == 1


def test_nested_error_type_used_when_code_missing() -> None:
    events, _ = run(sse(created(), {"type": "error", "error": {"type": "invalid_request_error", "code": None,
                                                               "message": "bad", "param": "input"}}))
    assert render(events)[-1] == (
        "2 stream.error failed invalid_request retryable=False invalid_request_error usage null finish None")


def test_error_message_is_masked() -> None:
    events, _ = run(sse(created(), {"type": "error", "code": "server_error", "message": "bad key sk-abcdefghijklmnop"}))
    assert isinstance(events[-1], StreamError)
    assert "sk-abcdefghijklmnop" not in events[-1].error.message


@pytest.mark.parametrize(
    ("status", "expected"),
    [("completed", "stream.done completed stop completed"), ("incomplete", "stream.done incomplete other incomplete"),
     ("failed", "stream.error failed upstream_error"), ("cancelled", "stream.error cancelled cancelled")],
)
def test_response_done_acts_per_status(status: str, expected: str) -> None:
    events, _ = run(sse(created(), terminal("response.done", status)))
    assert render(events)[-1].startswith(f"2 {expected}")


def test_terminal_with_unknown_status_fails_protocol() -> None:
    events, _ = run(sse(created(), terminal("response.done", "in_progress")))
    assert render(events)[-1].startswith("2 stream.error failed protocol")


def test_usage_only_from_terminal_response() -> None:
    early = created(usage={"input_tokens": 999, "output_tokens": 999})
    events, _ = run(sse(early, *one_text(["a"]), completed(usage={
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 12})))
    assert render(events)[-1] == "5 stream.done completed stop completed usage 5/7/2/3 resp_t1 gpt-test"


def test_usage_null_when_interrupted() -> None:
    events, _ = run(sse(created(usage={"input_tokens": 9, "output_tokens": 0}), *one_text(["a"])))
    assert isinstance(events[-1], StreamError)
    assert events[-1].usage is None


def test_response_id_and_model_from_created_when_terminal_lacks_them() -> None:
    events, _ = run(sse(created(rid="resp_A", model="m-1"), *one_text(["a"]),
                        {"type": "response.completed", "response": {"status": "completed"}}))
    assert isinstance(events[-1], StreamDone)
    assert (events[-1].response_id, events[-1].model) == ("resp_A", "m-1")


def test_queued_and_in_progress_record_response() -> None:
    events, _ = run(sse({"type": "response.queued", "response": response("queued", rid="resp_Q", model="m-q")},
                        {"type": "response.in_progress", "response": response("in_progress", rid="resp_Q", model=None)},
                        {"type": "response.completed", "response": {"status": "completed"}}))
    assert render(events)[-1] == "2 stream.done completed stop completed usage null resp_Q m-q"


# -- ignored items and events -----------------------------------------------


def test_builtin_tool_items_and_events_ignored_and_counted() -> None:
    ws = {"id": "ws_1", "type": "web_search_call", "status": "in_progress"}
    events, ignored = run(sse(created(), added(ws), {"type": "response.web_search_call.searching", "output_index": 0,
                                                     "item_id": "ws_1"},
                              item_done({**ws, "status": "completed"}), *[dict(p, output_index=1) for p in one_text(
                                  ["found"])], completed(output=[ws, msg_item(content=[out_text("found")])])))
    assert render(events)[1] == "2 block.start #0 text"
    assert ignored == Counter({"web_search_call": 1, "response.web_search_call.searching": 1,
                               "web_search_call.done": 1})


def test_custom_tool_and_mcp_items_are_not_blocks() -> None:
    items = [{"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_c", "name": "grammar", "input": ""},
             {"id": "mcp_1", "type": "mcp_call", "name": "x", "server_label": "s"}]
    events, ignored = run(sse(created(), added(items[0]),
                              {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1",
                               "output_index": 0, "delta": "abc"},
                              added(items[1], oi=1), {"type": "response.mcp_call.in_progress", "item_id": "mcp_1",
                                                      "output_index": 1},
                              completed(output=items)))
    assert render(events) == ["1 stream.start", "2 stream.done completed stop completed usage null resp_t1 gpt-test"]
    assert ignored["custom_tool_call"] == 1
    assert ignored["response.custom_tool_call_input.delta"] == 1


def test_annotation_ignored_and_counted() -> None:
    ann = {"type": "response.output_text.annotation.added", "item_id": "msg_1", "output_index": 0,
           "content_index": 0, "annotation_index": 0, "annotation": {"type": "url_citation", "url": "https://x.test"}}
    events, ignored = run(sse(created(), added(msg_item()), part_added(), text_delta("a"), ann, text_done("a"),
                              part_done(out_text("a")), item_done(msg_item(content=[out_text("a")])), completed()))
    assert ignored["response.output_text.annotation.added"] == 1
    assert isinstance(events[-1], StreamDone)


# -- frames outside SSE data ------------------------------------------------


def _adapter() -> OpenAIResponsesAdapter:
    norm = Normalizer(stream_id="st_t", provider="openai_responses", model="m", clock=lambda: 0)
    adapter = OpenAIResponsesAdapter(norm)
    adapter.start()
    return adapter


def test_unframed_error_object_fails_with_its_code() -> None:
    adapter = _adapter()
    out = adapter.feed(JSONFrame(text='{"error":{"message":"boom","type":"server_error","code":null}}'))
    assert render(out) == ["2 stream.error failed upstream_error retryable=True server_error usage null finish None"]


def test_frames_after_terminal_are_counted() -> None:
    adapter = _adapter()
    adapter.feed(SSEFrame(data=json.dumps({"type": "error", "code": "server_error", "message": "x"})))
    assert adapter.feed(SSEFrame(data=json.dumps(completed()))) == []
    assert adapter.ignored["after_terminal"] == 1


# -- amended rows: output_index keying, content_index offsets, empty data ------


def test_rotated_item_ids_address_the_item_at_their_output_index() -> None:
    events, _ = run(sse(created(), added(msg_item("msg_a", status="in_progress")),
                        text_delta("Hi", mid="msg_b"), text_delta("!", mid="msg_c"),
                        item_done(msg_item("msg_d", [out_text("Hi!")])), completed()))
    assert render(events)[1:5] == ["2 block.start #0 text", "3 block.delta #0 text 'Hi'",
                                   "4 block.delta #0 text '!'", "5 block.stop #0"]


def test_item_id_addresses_an_event_that_has_no_output_index() -> None:
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "content_index": 0, "delta": "x"}
    events, _ = run(sse(created(), added(msg_item(status="in_progress")), delta,
                        item_done(msg_item(content=[out_text("x")])), completed()))
    assert assembled(events) == [{"index": 0, "kind": "text", "text": "x", "signature": None}]


def test_a_second_item_of_another_type_at_a_known_output_index_fails_protocol() -> None:
    events, _ = run(sse(created(), added(msg_item(status="in_progress")), added(fc_item(fid="fc_9"))))
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.error.category, last.error.message) == (
        "protocol", "upstream announced a second item at output_index 0")


def test_message_parts_streamed_past_content_index_zero_are_settled_not_duplicated() -> None:
    events, _ = run(sse(created(), added(msg_item(status="in_progress")), part_added(ci=2),
                        text_delta("Hello", ci=2), item_done(msg_item(content=[out_text("Hello there")])),
                        completed()))
    assert assembled(events) == [{"index": 0, "kind": "text", "text": "Hello there", "signature": None}]


def test_empty_data_events_are_counted_and_skipped() -> None:
    events, ignored = run(sse("data:\n\n", created(), "event: keepalive\ndata: \n\n",
                              completed(output=[])))
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"empty_data": 2})
