"""Memory budgets of SSE readers whose clients stopped reading: the edges, the drop, the lossless resume.

The edges are checked on :class:`publisher.live.reader_budget.ReaderBudget` itself, where the
bytes are exact. The drops are checked on a real publisher over real sockets: a client
that sends its request on a socket with a 4 KB receive buffer and then reads nothing (so
the publisher's write of a page waits), and afterwards reads what it was sent and
resumes with ``Last-Event-ID`` as EventSource does, until the terminal event: every
event arrives exactly once, in order, however many times it was dropped.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from publisher.live.reader_budget import ReaderBudget
from publisher.state import BUDGET
from publisher.telemetry import Telemetry
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    eventually,
    make_settings,
    start,
    stop,
)

DELTAS = 3000
"""4 KB deltas: 12 MB, far more than the kernel takes for a stalled socket (about 4 MB on loopback)."""
PAGES = {"read_first_page": 16, "read_page": 64, "read_ahead_hold_ms": 0.0, "write_timeout_s": 120.0}
"""Pages of 64 entries (about 530 KB held while one is written), no read-ahead: what a
stalled reader holds is one page and its socket's unsent buffer."""


def flag() -> tuple[list[int], Any]:
    dropped: list[int] = []
    return dropped, lambda: dropped.append(1)


async def test_one_reader_exactly_at_its_budget_stays_and_one_byte_more_is_dropped_after_the_stall():
    budget = ReaderBudget(reader_bytes=1000, total_bytes=10_000, stall_s=0.05, telemetry=Telemetry())
    at, drop_at = flag()
    waiting = budget.begin(drop_at, object(), 600, 400)
    assert waiting.timer is None  # nothing will drop it: at its budget
    over, drop_over = flag()
    budget.begin(drop_over, object(), 600, 401)
    await eventually(lambda: over == [1])
    assert at == []
    assert budget.dropped == {"reader": 1, "total": 0}
    budget.end(waiting)
    assert (budget.total, budget.waiting()) == (0, 0)


async def test_the_total_counts_a_shared_page_once_and_drops_the_longest_waiting_one_byte_past_it():
    budget = ReaderBudget(reader_bytes=10_000, total_bytes=1000, stall_s=60, telemetry=Telemetry())
    page, other, third = object(), object(), object()
    a, drop_a = flag()
    b, drop_b = flag()
    c, drop_c = flag()
    d, drop_d = flag()
    first = budget.begin(drop_a, page, 300, 200)
    second = budget.begin(drop_b, page, 300, 200)
    assert budget.total == 700  # the page once, each reader's own bytes
    budget.begin(drop_c, other, 300, 0)
    assert (budget.total, a, b, c) == (1000, [], [], [])  # exactly at the budget
    budget.begin(drop_d, third, 1, 0)  # one byte past it: the longest waiting goes
    assert (a, b, c, d) == ([1], [], [], [])
    assert budget.total == 801  # the page stays: the second reader still holds it
    budget.end(first)  # a dropped reader's own end changes nothing more
    assert budget.total == 801
    budget.end(second)
    assert budget.total == 301
    assert budget.dropped == {"reader": 0, "total": 1}


async def store_big_stream(ctx: Any) -> int:
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0)]
    events += [delta(ctx.sid, 3 + i, 0, f"{i:05d}" + "x" * 4000) for i in range(DELTAS)]
    events += [stop(ctx.sid, 3 + DELTAS, 0), done(ctx.sid, 4 + DELTAS)]
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(last_seq=events[-1].seq, state="done")
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    return events[-1].seq


def stalled_reader(base_url: str, path: str, position: int = 0) -> socket.socket:
    """Send an HTTP/1.0 SSE request (no chunked coding) on a socket with a 4 KB receive buffer; read nothing."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    resume = f"Last-Event-ID: {position}\r\n" if position else ""
    sock.sendall(f"GET {path} HTTP/1.0\r\nAuthorization: Bearer {API_KEY}\r\n{resume}\r\n".encode())
    return sock


async def received_ids(sock: socket.socket) -> list[int]:
    """Read what the publisher sent before it dropped the connection; return the ids of the whole messages."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    data = b""
    try:
        async with asyncio.timeout(GUARD_S):
            while chunk := await loop.sock_recv(sock, 65536):
                data += chunk
    except ConnectionResetError:
        pass  # dropped: what came before the reset is all there is
    finally:
        sock.close()
    body = data.partition(b"\r\n\r\n")[2]
    messages = body.split(b"\n\n")[:-1]  # the last piece is cut short (or empty)
    return [int(line[4:]) for m in messages for line in m.split(b"\n") if line.startswith(b"id: ")]


async def resume_to_the_end(ctx: Any, server: Any, got: list[int], last: int) -> list[int]:
    """Resume after ``got[-1]`` as EventSource does, reconnecting after every drop, until ``last``."""
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    while not got or got[-1] < last:
        headers = {**bearer(API_KEY), "Last-Event-ID": str(got[-1] if got else 0)}
        async with ctx.http.get(url, headers=headers) as resp:
            assert resp.status == 200
            client = SSEClient(resp)
            try:
                while (message := await client.next_event()) is not None:
                    got.append(int(message["id"]))
            except (aiohttp.ClientError, ConnectionError):  # dropped again (a slow machine): resume again
                continue
    return got


async def test_a_reader_past_its_budget_is_dropped_and_its_client_resumes_losslessly(ctx):
    server = await ctx.start_app(make_settings(**PAGES, reader_budget_bytes=256 * 1024, reader_stall_ms=200.0))
    last = await store_big_stream(ctx)
    sock = stalled_reader(server.base_url, f"/v1/streams/{ctx.sid}/events")
    budget = server.app[BUDGET]
    await eventually(lambda: budget.dropped["reader"] >= 1)
    got = await received_ids(sock)
    assert got == list(range(1, len(got) + 1))
    assert await resume_to_the_end(ctx, server, got, last) == list(range(1, last + 1))  # each once, in order
    await eventually(lambda: budget.waiting() == 0)
    assert budget.total == 0


async def test_past_the_total_the_reader_waiting_longest_is_dropped_and_resumes_losslessly(ctx):
    server = await ctx.start_app(make_settings(**PAGES, readers_budget_bytes=900 * 1024))
    last = await store_big_stream(ctx)
    budget = server.app[BUDGET]
    first = stalled_reader(server.base_url, f"/v1/streams/{ctx.sid}/events")
    await eventually(lambda: budget.waiting() == 1 and budget.total > 0)  # its page write waits
    second = stalled_reader(server.base_url, f"/v1/streams/{ctx.sid}/events", position=1500)  # no shared page
    await eventually(lambda: budget.dropped["total"] == 1)
    got = await received_ids(first)
    assert got == list(range(1, len(got) + 1))
    await eventually(lambda: budget.waiting() == 1)  # the second one still waits, within the total
    assert 0 < budget.total <= 900 * 1024
    assert await resume_to_the_end(ctx, server, got, last) == list(range(1, last + 1))
    second.close()
    await eventually(lambda: budget.total == 0)


@pytest.mark.parametrize("route", ["events", "ui"])
async def test_a_reader_within_its_budget_is_kept_while_its_client_waits(ctx, route):
    server = await ctx.start_app(make_settings(**PAGES, reader_stall_ms=50.0))  # default budgets: 8 MiB, 64 MiB
    await store_big_stream(ctx)
    sock = stalled_reader(server.base_url, f"/v1/streams/{ctx.sid}/{route}")
    budget = server.app[BUDGET]
    await eventually(lambda: budget.waiting() == 1 and budget.total > 0)
    waiting = next(iter(budget._waiting))
    assert waiting.held <= budget.reader_bytes
    assert waiting.timer is None  # nothing will drop it
    sock.close()
    await eventually(lambda: budget.waiting() == 0)
    assert budget.dropped == {"reader": 0, "total": 0}


async def test_a_ui_reader_past_its_budget_is_dropped(ctx):
    server = await ctx.start_app(make_settings(**PAGES, reader_budget_bytes=256 * 1024, reader_stall_ms=100.0))
    await store_big_stream(ctx)
    sock = stalled_reader(server.base_url, f"/v1/streams/{ctx.sid}/ui")
    await eventually(lambda: server.app[BUDGET].dropped["reader"] == 1)
    await received_ids(sock)  # reads to the reset
    await eventually(lambda: server.app[BUDGET].waiting() == 0)
