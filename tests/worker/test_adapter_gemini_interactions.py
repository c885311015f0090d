"""The Gemini Interactions adapter: one test per rule its module docstring states (goldens: test_transcripts)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from schema.contract import BlockDelta, Event, StreamDone, StreamError
from schema.validate import validate
from tools.replay import replay_reads
from worker.adapters.gemini_interactions import GeminiInteractionsAdapter
from worker.adapters.gemini_interactions_parts import interactions_error, usage_of
from worker.pipeline import build_pipeline

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "transcripts" / "gemini_interactions"


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    """An SSE body of (event_type, payload) pairs; every event gets ``event_id`` ``e<n>``."""
    out = [f"event: {name}\ndata: {json.dumps({**body, 'event_type': name, 'event_id': f'e{n}'})}\n\n"
           for n, (name, body) in enumerate(events)]
    return "".join(out).encode()


def run(body: bytes) -> tuple[list[Event], Counter[str]]:
    events, ignored = replay_reads([body], provider="gemini_interactions")
    assert validate(events) == []
    return events, ignored


def test_every_transcript_has_a_golden_and_an_index_row() -> None:
    index = (DIR / "INDEX.md").read_text(encoding="utf-8")
    cases = sorted(DIR.glob("*.sse"))
    assert len(cases) >= 10
    for path in cases:
        assert path.with_suffix(".events.jsonl").exists(), path.name
        assert f"| {path.name} |" in index, path.name


def test_last_event_id_and_interaction_id_follow_the_events_dispatched() -> None:
    pipeline = build_pipeline(provider="gemini_interactions", stream_id="st_x", model="m", clock=lambda: 0)
    adapter = pipeline.adapter
    assert isinstance(adapter, GeminiInteractionsAdapter)
    pipeline.start()
    pipeline.feed(sse(("interaction.created", {"interaction": {"id": "int_1", "model": "g"}}),
                      ("step.start", {"index": 0, "step": {"type": "model_output"}})))
    assert (adapter.interaction_id, adapter.last_event_id) == ("int_1", "e1")
    untagged = {"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": "a"}}
    pipeline.feed(f"data: {json.dumps(untagged)}\n\n".encode())
    assert adapter.last_event_id == "e1", "an event without event_id leaves the cursor where it was"


def test_done_names_the_interaction_and_its_model() -> None:
    events, _ = run(sse(("interaction.created", {"interaction": {"id": "int_9", "model": "gemini-x"}}),
                        ("interaction.completed", {"interaction": {"status": "completed"}})))
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert (done.response_id, done.model, done.status, done.finish_reason) == ("int_9", "gemini-x", "completed", "stop")


def test_a_delta_that_does_not_fit_its_step_fails_protocol() -> None:
    events, _ = run(sse(("step.start", {"index": 0, "step": {"type": "function_call", "id": "c", "name": "f"}}),
                        ("step.delta", {"index": 0, "delta": {"type": "text", "text": "x"}})))
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.category == "protocol"


def test_a_step_started_twice_fails_protocol() -> None:
    events, _ = run(sse(("step.start", {"index": 0, "step": {"type": "thought"}}),
                        ("step.start", {"index": 0, "step": {"type": "thought"}})))
    assert isinstance(events[-1], StreamError)
    assert "twice" in events[-1].error.message


def test_unknown_status_at_completion_fails_protocol() -> None:
    events, _ = run(sse(("interaction.completed", {"interaction": {"status": "in_progress"}})))
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.category == "protocol"


def test_non_block_steps_and_unknown_deltas_are_counted() -> None:
    _, ignored = run((DIR / "builtin_tool_steps_ignored.sse").read_bytes())
    assert ignored["step:google_search_call"] == 1
    assert ignored["step:google_search_result"] == 1
    assert ignored["delta:google_search_call"] == 1
    assert ignored["delta:text_annotation_delta"] == 1
    assert ignored["delta:mystery_delta"] == 1
    assert ignored["future.event"] == 1
    assert ignored["after_terminal"] == 1, "the trailing [DONE] comes after the terminal"


def test_done_sentinel_alone_proves_nothing() -> None:
    events, _ = run(sse(("step.start", {"index": 0, "step": {"type": "model_output"}}),
                        ("step.delta", {"index": 0, "delta": {"type": "text", "text": "x"}}),
                        ("step.stop", {"index": 0})) + b"data: [DONE]\n\n")
    assert isinstance(events[-1], StreamError)
    assert events[-1].status == "interrupted"


def test_signature_on_a_thought_step_start_rides_on_its_block() -> None:
    events, _ = run(sse(("step.start", {"index": 0, "step": {"type": "thought", "signature": "sig"}}),
                        ("step.stop", {"index": 0}),
                        ("interaction.completed", {"interaction": {"status": "completed"}})))
    deltas = [e.delta for e in events if isinstance(e, BlockDelta)]
    assert [(d.kind, d.text) for d in deltas] == [("signature", "sig")]


def test_error_codes_map_by_status_number_or_block_reason() -> None:
    assert interactions_error({"code": "UNAVAILABLE", "message": "m"})[:2] == ("upstream_overloaded", "UNAVAILABLE")
    assert interactions_error({"code": "429", "message": "m"})[0] == "rate_limited"
    assert interactions_error({"code": "SAFETY"})[0] == "content_filter"
    assert interactions_error("plain")[0] == "upstream_error"


def test_usage_adds_thoughts_to_output_and_needs_a_count() -> None:
    usage = usage_of({"total_input_tokens": 5, "total_output_tokens": 2, "total_thought_tokens": 7})
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (5, 9, 7)
    assert usage_of({"grounding_tool_count": []}) is None
