"""A publisher's memory stays flat across cycles of readers that stall mid-replay, let go, resume or leave.

From the read-ahead round (``scripts/breaker/ra_memory``: 75.3 -> 75.6 MB over 30 cycles of
3 readers; docs/faults.md). Each cycle, two readers of a 9.6 MB page stop reading inside it
until the publisher has let their read-aheads go, then one leaves mid-stall (every other
cycle) and the others read to the top and disconnect. What a cycle holds must be given
back: the resident set after the last cycle stays within :data:`GROWTH_KB` of the one after
the warm-up cycle, measured in the same run. The allocator's footprint moves in steps (a
one-off rise of one or two pages when two pages happen to be live together), so what is
checked is what a leak does and a step does not: grow at every cycle. The median growth
per cycle stays far below a page, and the whole growth below half a page per cycle.
"""

from __future__ import annotations

import itertools
import statistics

import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.procs import PublisherProcess, log_problems
from tests.faults.sse import StallClient
from tests.faults.streams import Writer, text_script
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

TOP = 700
PAGE_KB = 240 * 40_000 // 1024
"""The stalled page: 240 deltas of 40 KB (9.6 MB); a leak of what a cycle holds costs at least one per cycle."""
WARM_UP, CYCLES = 1, 6
READER_BUDGETS = {"FANOUT_READER_BUDGET_BYTES": 64 << 20, "FANOUT_READERS_BUDGET_BYTES": 512 << 20}
"""Budgets above what the stalled readers hold: this test is about the read-ahead they let go,
not the budgets that drop a stalled reader (tests/publisher/test_reader_budget.py)."""


async def cycle(publisher: PublisherProcess, sid: str, number: int, readers_n: int = 2) -> None:
    """``readers_n`` readers stall until their read-aheads are let go; one may leave; the rest read everything once."""
    dropped = await publisher.metric("fanout_sse_read_ahead_dropped_total")
    readers = [StallClient(publisher.port, sid, API_KEY) for _ in range(readers_n)]
    try:
        for reader in readers:
            await reader.connect()
            await reader.read_some()
        await publisher.until_metric("fanout_sse_read_ahead_dropped_total", dropped + readers_n)
        if number % 2:
            readers.pop().close()
        for reader in readers:
            await reader.read_until_seq(TOP)
            reader.close()
            assert reader.seqs == list(range(1, TOP + 1))
    finally:  # a failed cycle leaves no socket for the next test's warnings
        for reader in readers:
            reader.close()
    await publisher.until_metric("fanout_sse_readers", 0)


async def test_rss_stays_flat_across_stall_and_resume_cycles(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, metrics=True, FANOUT_READ_FIRST_PAGE=2,
                                      FANOUT_READ_PAGE=256, FANOUT_READ_AHEAD_HOLD_MS=200, FANOUT_WRITE_TIMEOUT_S=60,
                                      **READER_BUDGETS)
    script = text_script("st_memory", TOP, big=240, big_bytes=40_000)
    writer = Writer(client, keys)
    await writer.meta(script.sid)
    await writer.store(script.events)
    for number in range(WARM_UP):  # twice the readers: the allocator reaches what a cycle can need
        await cycle(publisher, script.sid, number, readers_n=4)
    rss = [publisher.rss_kb()]
    for number in range(CYCLES):
        await cycle(publisher, script.sid, number)
        rss.append(publisher.rss_kb())
    growth = [after - before for before, after in itertools.pairwise(rss)]
    assert statistics.median(growth) < PAGE_KB / 8, rss
    assert rss[-1] - rss[0] < PAGE_KB * CYCLES / 2, rss
    await publisher.until_metric("fanout_sse_read_ahead_pages", 0)
    assert log_problems(publisher.log()) == []
