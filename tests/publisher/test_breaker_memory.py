"""Adversarial review: a public reader resuming inside a reasoning block holds one page of history, not all of it."""

from __future__ import annotations

import tracemalloc

from schema.contract import encode_event
from tests.publisher.helpers import SSEClient, StreamWriter, bearer, block_start, delta, done, ids, start, token_for

HISTORY = 40_000
"""Deltas before the reader's position: about 12 MB of entries if held at once."""
PEAK_BYTES = 16 * 1024 * 1024
"""The request may allocate at most this much at its peak: a few 4096-entry pages (about 9 MB measured, with
the raw XRANGE reply and the read-ahead), not the whole history (about 28 MB before the fix)."""


async def test_a_public_resume_inside_a_reasoning_block_does_not_hold_the_whole_history(ctx):
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid)
    await writer.meta()
    events = [start(sid), block_start(sid, 2, 0, "reasoning", "internal")]
    events += [delta(sid, 3 + i, 0, "r" * 100, "reasoning") for i in range(HISTORY)]
    top = 3 + HISTORY
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    await writer.append(delta(sid, top, 0, "r", "reasoning"), done(sid, top + 1))
    tracemalloc.start()
    try:
        headers = bearer(token_for(sid)) | {"Last-Event-ID": str(top - 1)}  # inside the internal block
        async with ctx.http.get(ctx.server.url(f"/v1/streams/{sid}/events"), headers=headers) as resp:
            got = ids(await SSEClient(resp).events())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [top + 1]  # the internal reasoning stays hidden
    assert peak < PEAK_BYTES, f"peak {peak / 1e6:.1f} MB"  # before the fix: 27.6 MB (every entry kept)
