"""The process's router: a job parked for a slot wakes when one is given back, stops, or meets its deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from schema.errors import UpstreamTimeoutError
from worker.control import Stopped, Stopper
from worker.router import Router
from worker.routing import CooldownPolicy

GUARD_S = 10.0
"""Hang guard only."""


async def test_take_returns_the_planned_endpoint_and_none_once_all_were_tried() -> None:
    router = Router(limits={"a": 1})
    assert await router.take(["a", "b"], [], "fallback", Stopper(), time.monotonic() + GUARD_S) == "a"
    assert await router.take(["a", "b"], [], "fallback", Stopper(), time.monotonic() + GUARD_S) == "b"
    assert await router.take(["a", "b"], ["a", "b"], "fallback", Stopper(), time.monotonic() + GUARD_S) is None


async def test_a_waiting_job_gets_the_slot_given_back() -> None:
    router = Router(limits={"a": 1})
    stopper = Stopper()
    assert await router.take(["a"], [], "wait", stopper, time.monotonic() + GUARD_S) == "a"
    waiting = asyncio.create_task(router.take(["a"], [], "wait", stopper, time.monotonic() + GUARD_S))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    router.give("a")
    assert await asyncio.wait_for(waiting, GUARD_S) == "a"
    assert router.slots.in_use("a") == 1


async def test_a_wait_past_the_total_deadline_is_a_total_timeout() -> None:
    router = Router(limits={"a": 1})
    router.slots.take("a")
    with pytest.raises(UpstreamTimeoutError) as raised:
        await router.take(["a"], [], "wait", Stopper(), time.monotonic() + 0.02)
    assert raised.value.kind == "total"


async def test_a_stopped_job_stops_waiting() -> None:
    router = Router(limits={"a": 1})
    router.slots.take("a")
    stopper = Stopper()
    waiting = asyncio.create_task(router.take(["a"], [], "wait", stopper, time.monotonic() + GUARD_S))
    await asyncio.sleep(0.01)
    stopper.stop("cancel")
    with pytest.raises(Stopped):
        await asyncio.wait_for(waiting, GUARD_S)


async def test_failures_and_successes_reach_the_cooldown_table_with_the_router_clock() -> None:
    now = [100.0]
    router = Router(CooldownPolicy(after_failures=0), clock=lambda: now[0])
    assert router.failed("a", "rate_limited", 5.0) == 105.0
    assert [step.endpoint for step in router.plan(["a", "b"])] == ["b", "a"]
    now[0] = 105.0
    assert [step.endpoint for step in router.plan(["a", "b"])] == ["a", "b"]
    router.failed("a", "rate_limited", 5.0)
    router.succeeded("a")
    assert [step.endpoint for step in router.plan(["a", "b"])] == ["a", "b"]
