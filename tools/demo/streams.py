"""The demo's streams: one job per demo case on a started stack, followed live and checked against its golden.

:func:`run_streams` submits each of :data:`DEMO_CASES` over ``POST /v1/streams``, follows
every stream over SSE with a live progress view (:mod:`tools.demo.view`), drops the
reader of :data:`DROPPED_CASE` after :data:`DROP_AFTER_EVENTS` events and resumes it with
``Last-Event-ID``, then compares what each stream assembled (:func:`schema.reducer.reduce`)
with what its transcript's golden events assemble to (:func:`tools.replay.replay_file`).
The stack itself is started and stopped by :mod:`tools.demo.run`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec

from fanout_client import FanoutClient
from schema.contract import BlockDelta, Event, StreamError, is_terminal
from schema.job import Provider
from schema.reducer import reduce
from tools.demo.cases import demo_request
from tools.demo.stack import LocalStack
from tools.demo.view import CaseRun, ProgressView, summary_table
from tools.replay import replay_file

ROOT: Final = Path(__file__).resolve().parents[2]
TRANSCRIPTS: Final = ROOT / "transcripts"

DEMO_CASES: Final[tuple[tuple[Provider, str, str], ...]] = (
    ("openai_chat", "openai_chat", "simple_text_greek_usage_chunk"),
    ("openai_chat", "openai_chat", "ollama_parallel_calls_index_zero"),
    ("openai_chat", "openai_chat", "reasoning_text_tool_call_blocks"),
    ("openai_responses", "openai_responses", "several_blocks_reasoning_text_and_call"),
    ("openai_responses", "openai_responses", "failed_after_partial_text"),
    ("anthropic", "anthropic", "thinking_with_signature"),
    ("anthropic", "anthropic", "error_after_partial_text"),
    ("gemini", "gemini_sse", "thought_text_call_blocks"),
    ("gemini", "gemini_sse", "interrupted_mid_event_without_finish_reason"),
)
"""(provider, transcript directory, case): text, reasoning, parallel tool calls, an
error mid-stream and an interruption, across all four providers."""
DROPPED_CASE: Final = "thinking_with_signature"
"""The case whose reader is dropped mid-stream and resumed with ``Last-Event-ID``."""
DROP_AFTER_EVENTS: Final = 4
"""Events the dropped reader takes before its connection is cut."""

async def run_streams(stack: LocalStack) -> int:
    """Submit every demo case, follow each stream live, print the summary; return 0 when all match their goldens."""
    view = ProgressView(sys.stdout)
    async with aiohttp.ClientSession() as session:
        client = FanoutClient(stack.base_url, api_key=stack.api_key, session=session)
        runs = [CaseRun(provider=p, directory=d, case=c) for p, d, c in DEMO_CASES]
        for run_ in runs:
            sub = await client.submit(provider=run_.provider, model=run_.case, request=demo_request(run_.provider),
                                      metadata={"demo_case": f"{run_.directory}/{run_.case}"})
            run_.stream_id = sub.stream_id
        view.start(runs)
        await asyncio.gather(*(_follow(client, run_, view=view) for run_ in runs))
        view.finish()
    for run_ in runs:
        run_.differences = _compare(run_)
    sys.stdout.write(summary_table(runs) + "\n")
    bad = [r for r in runs if r.differences]
    for run_ in bad:
        sys.stdout.write(f"MISMATCH {run_.directory}/{run_.case} ({run_.stream_id}): {'; '.join(run_.differences)}\n")
    sys.stdout.write(f"{len(runs) - len(bad)}/{len(runs)} streams match their golden results\n")
    return 1 if bad else 0


async def _follow(client: FanoutClient, run_: CaseRun, *, view: ProgressView) -> None:
    started = time.monotonic()
    drop = run_.case == DROPPED_CASE
    async for event in client.events(run_.stream_id):
        _take(run_, event, view)
        if drop and len(run_.events) == DROP_AFTER_EVENTS:
            break
    if drop and not (run_.events and is_terminal(run_.events[-1])):
        run_.resumed_at = run_.events[-1].seq
        view.note(run_, f"dropped at seq {run_.resumed_at}, resuming with Last-Event-ID")
        async for event in client.events(run_.stream_id, last_event_id=run_.resumed_at):
            _take(run_, event, view)
    run_.wall_s = time.monotonic() - started


def _take(run_: CaseRun, event: Event, view: ProgressView) -> None:
    run_.events.append(event)
    if isinstance(event, BlockDelta) and run_.first_delta_ts is None:
        run_.first_delta_ts = event.ts
    view.update(run_)


def _compare(run_: CaseRun) -> list[str]:
    golden_events, _ = replay_file(TRANSCRIPTS / run_.directory / f"{run_.case}.sse")
    want, got = _comparable(golden_events), _comparable(run_.events)
    seqs = [e.seq for e in run_.events]
    problems = [] if seqs == list(range(1, len(seqs) + 1)) else [f"seqs not 1..n: {seqs}"]
    for key in want:
        if want[key] != got.get(key):
            problems.append(f"{key}: expected {want[key]!r}, got {got.get(key)!r}")
    return problems


def _comparable(events: list[Event]) -> dict[str, Any]:
    result = msgspec.to_builtins(reduce(events))
    err = result["error"]
    return {
        "status": result["status"],
        "finish_reason": result["finish_reason"],
        "error": (err["category"], err["retryable"]) if err else None,
        "blocks": result["blocks"],
        "usage": result["usage"],
        "events": len(events),
        "last_is_error": isinstance(events[-1], StreamError) if events else None,
    }
