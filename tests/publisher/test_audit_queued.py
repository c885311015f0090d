"""The live audit never ends a reader whose queue still holds what it was offered.

A live reader whose client reads slowly has its entries queued (its socket's buffer is
full), its cursor already at the last one queued. When the stream's terminal event is
among them and the client takes longer than half a heartbeat to catch up, the audit
finds the topic quiet, meta ``done`` and the stored top equal to ``fetched``: what a
stream ended without a terminal event (storage refused it) looks like. It must not close
that reader: its response would drop the queued entries, the terminal event among them,
and end without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from publisher.state import HUB
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    block_start,
    delta,
    done,
    drain_socket,
    eventually,
    make_settings,
    start,
    stop,
)

TEXT = "z" * 4000
"""Each delta's text: 4,000 bytes."""


@contextlib.asynccontextmanager
async def slow_reader(ctx: Any) -> AsyncIterator[tuple[StreamWriter, socket.socket, Any, int]]:
    """A live reader whose client stops reading: (writer, the client's socket, the hub's reader, last seq).

    The client's socket has a 4 KB receive buffer; deltas of 4,000 bytes are stored until
    the reader has entries queued (its socket is full). Audits run every 0.2 s.
    """
    server = await ctx.start_app(make_settings(heartbeat_s=0.4, client_queue=100_000))
    hub = server.app[HUB]
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), full=True)
    host, port = server.base_url.removeprefix("http://").split(":")
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    request = (f"GET /v1/streams/{ctx.sid}/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               f"Authorization: Bearer {API_KEY}\r\n\r\n")
    slow.sendall(request.encode())
    try:
        await eventually(lambda: any(r.sink is not None for r in hub.readers()))
        (reader,) = hub.readers()
        seq = 2
        while reader.queued() == 0 and seq < 6000:  # bounded: its socket fills well before
            seq += 1
            await writer.append(delta(ctx.sid, seq, 0, TEXT), full=True)
        assert reader.queued() > 0, "the client's socket never filled"
        yield writer, slow, reader, seq
    finally:
        slow.close()


async def test_a_slow_reader_with_the_terminal_queued_gets_it_after_quiet_audits(ctx):
    async with slow_reader(ctx) as (writer, slow, reader, seq):
        await writer.append(stop(ctx.sid, seq + 1, 0), done(ctx.sid, seq + 2), full=True)
        await eventually(lambda: reader.cursor == seq + 2)  # the terminal is queued
        await asyncio.sleep(1.0)  # five audits of a quiet topic, the client still not reading
        assert reader.closed is None, f"closed ({reader.closed}) with {reader.queued()} entries queued"
        data = await asyncio.to_thread(drain_socket, slow)
        assert b"stream.done" in data
        assert f"id: {seq + 2}\n".encode() in data


async def test_a_reader_writing_the_terminal_it_took_from_its_queue_is_not_ended_as_unterminated(ctx, caplog):
    """The response's task takes the whole queue, then blocks writing it to a client that does not read.

    The queue is then empty and the cursor at the terminal event's seq: what the audit took
    for a reader holding the top of a stream ended without a terminal event. The stored top
    *is* a terminal event: the reader ends by writing it, and nobody ended the stream
    without one (no such warning).
    """
    async with slow_reader(ctx) as (writer, slow, reader, filled):
        seq = filled + 300  # about 1.2 MB more queued: far more than the socket buffers take
        for more in range(filled + 1, seq + 1):
            await writer.append(delta(ctx.sid, more, 0, TEXT), full=True)
        await writer.append(stop(ctx.sid, seq + 1, 0), done(ctx.sid, seq + 2), full=True)
        await eventually(lambda: reader.cursor == seq + 2)  # the terminal is queued
        slow.settimeout(1.0)
        while reader.queued() and reader.closed is None:  # read a little, until the task took the queue
            await asyncio.to_thread(slow.recv, 16384)
            await asyncio.sleep(0.01)
        slow.settimeout(None)
        assert reader.queued() == 0
        await asyncio.sleep(1.0)  # five audits of a quiet topic, the task still writing what it took
        assert reader.closed is None, f"closed ({reader.closed}) while writing what it took"
        assert "without a terminal event" not in caplog.text
        data = await asyncio.to_thread(drain_socket, slow)
        assert f"id: {seq + 2}\n".encode() in data
