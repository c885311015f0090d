"""Streams that run through transient Redis refusals, and what they must look like afterwards.

:func:`run_through` starts a fake provider that streams a recorded Anthropic transcript
slowly (:data:`SLOW`, about five seconds a stream), two workers (so a lease that lapsed
would be taken over and the stream ended ``worker_lost``), submits ``n`` jobs, waits until
every stream is running, awaits the test's ``inject`` (the refusals), then waits until
every stream ended. :func:`assert_ran_through` then holds each stream to the issue's bar:

* its stored events are the transcript's golden (``<case>.events.jsonl``), seq 1..n,
  ending ``stream.done`` ``completed`` (so no ``stream.error``, no ``worker_lost``);
* meta ``token`` is 1: one claim, never reclaimed;
* the fake provider received its request exactly once (its ``GET /_requests`` list);
* no job is left pending;
* its writes met the refusal: a worker logged ``event=storage_retry`` for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec

from infra.redis_client import RedisClient, RedisOptions, connect
from schema.contract import Event, decode_event
from schema.job import new_stream_id
from schema.keys import Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    pending_count,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    strip_volatile,
    submit,
    wait_for,
)
from tools.upstream import DEFAULT_ROOTS, ServerConfig

CASE = "several_blocks_thinking_text_two_tools"
GOLDEN_PATH: Path = DEFAULT_ROOTS[0] / "anthropic" / f"{CASE}.events.jsonl"
SLOW = ServerConfig(chunk_bytes=64, slow_delay_ms=100)
"""About 50 chunks 100 ms apart: each stream runs about five seconds, 18 events."""
SETTINGS = {"lease_s": 8.0, "append_retry_s": 8.0, "append_retry_max_delay_s": 0.25, "idle_timeout_s": 20.0,
            "progress_timeout_s": 20.0, "total_timeout_s": 60.0}
"""Worker limits: a lease and retry window well past the longest refusal here (about 3.5 s)."""
GUARD_S = 60.0
"""Hang guard of one wait (streams running, streams ended), seconds."""

SubmitJobs = Callable[[], Awaitable[None]]
Inject = Callable[[list[str], Keys, SubmitJobs], Awaitable[None]]
"""The test's faults: given the streams' ids, the key layout and what submits their jobs
(a no-op once they are running), refuse and recover."""


def golden() -> list[Event]:
    """The transcript's expected events (``<case>.events.jsonl``)."""
    events = [decode_event(line) for line in GOLDEN_PATH.read_bytes().splitlines() if line.strip()]
    return [event for event in events if event is not None]


class Outcome(msgspec.Struct, kw_only=True):
    """What the streams stored and what the provider and the workers saw."""

    events: dict[str, list[Event]]
    metas: dict[str, dict[str, str]]
    requests: dict[str, int]
    """Requests the fake provider received per stream id."""
    pending: int
    retried: set[str]
    """Stream ids a worker logged ``event=storage_retry`` for."""


@contextlib.asynccontextmanager
async def _client(url: str, cluster: bool) -> AsyncIterator[RedisClient]:
    client = connect(url, RedisOptions(cluster=cluster))
    try:
        yield client
    finally:
        await client.aclose()


async def _states(client: RedisClient, keys: Keys, sids: list[str]) -> list[dict[str, str]]:
    return [await meta(client, keys, sid) for sid in sids]


async def _submit_jobs(client: RedisClient, keys: Keys, sids: list[str]) -> None:
    """Store each stream's queued meta, as a publisher's submission does, then XADD its job."""
    for sid in sids:
        await client.hset(keys.meta(sid), mapping={"state": "queued", "provider": "anthropic", "model": CASE})
        await submit(client, keys, make_job("anthropic", f"slow-{CASE}", stream_id=sid, request={
            "messages": [{"role": "user", "content": f"job {sid}"}], "max_tokens": 64}))


async def _nothing() -> None:
    return None


async def run_through(url: str, *, cluster: bool, inject: Inject, records: list[logging.LogRecord],
                      n: int = 4, at_claim: bool = False) -> Outcome:
    """Run ``n`` streams through ``inject`` (module docstring); ``records`` is the test's captured log.

    With ``at_claim`` the jobs are not submitted first: ``inject`` submits them (its third
    argument) while Redis refuses, so the refusal meets the claims.
    """
    keys = Keys(prefix=f"refusal-{uuid.uuid4().hex[:8]}")
    sids = [new_stream_id() for _ in range(n)]
    async with _client(url, cluster) as client, fake_upstream(SLOW) as (base, _state):
        settings = settings_for(base, url, keys, redis_cluster=cluster, **SETTINGS)
        async with running_worker(settings, keys, consumer="w1"), running_worker(settings, keys, consumer="w2"):
            if at_claim:
                await inject(sids, keys, lambda: _submit_jobs(client, keys, sids))
            else:
                await _submit_jobs(client, keys, sids)

                async def running() -> bool:
                    return all(int(m.get("last_seq", 0)) >= 3 and m.get("state") == "running"
                               for m in await _states(client, keys, sids))

                await wait_for(running, guard_s=GUARD_S)
                await inject(sids, keys, _nothing)

            async def ended() -> bool:
                with contextlib.suppress(Exception):  # the test's own pool may hold a connection the fault cut
                    return all(m.get("state") == "done" for m in await _states(client, keys, sids))
                return False

            await wait_for(ended, guard_s=GUARD_S, step_s=0.05)
        return await _outcome(client, keys, sids, base, records)


async def _outcome(client: RedisClient, keys: Keys, sids: list[str], base: str,
                   records: list[logging.LogRecord]) -> Outcome:
    requests = dict.fromkeys(sids, 0)
    for request in await recorded(base):
        content = request["body"]["messages"][0]["content"]
        requests[content.removeprefix("job ")] += 1
    retried = {sid for sid in sids for r in records if "event=storage_retry " in r.getMessage()
               and f"stream_id={sid} " in r.getMessage()}
    return Outcome(events={sid: await stored_events(client, keys, sid) for sid in sids},
                   metas={sid: await meta(client, keys, sid) for sid in sids}, requests=requests,
                   pending=await pending_count(client, keys), retried=retried)


def assert_ran_through(outcome: Outcome) -> None:
    """Every stream as the golden says, claimed once, one provider call, acked, and it met the refusal."""
    expected = strip_volatile(golden())
    for sid, events in outcome.events.items():
        assert strip_volatile(events) == expected, f"stream {sid} differs from the golden"
        assert [e.seq for e in events] == list(range(1, len(expected) + 1))
        assert outcome.metas[sid]["token"] == "1", f"stream {sid} was claimed again"
    assert outcome.requests == dict.fromkeys(outcome.events, 1)
    assert outcome.pending == 0
    assert outcome.retried == set(outcome.events), "a stream never met the refusal"


async def hold(begin: Callable[[], None], end: Callable[[], None], hold_s: float,
               meanwhile: SubmitJobs = _nothing) -> None:
    """Run ``begin`` (blocking, on a thread), then ``meanwhile``, wait ``hold_s``, run ``end`` (on a thread)."""
    await asyncio.to_thread(begin)
    await meanwhile()
    await asyncio.sleep(hold_s)
    await asyncio.to_thread(end)
