"""SIGTERM with everything in flight at once: the publisher exits 0 after its window and grace, not at a timeout.

From the shutdown round (``scripts/breaker/shutdown_grace``; docs/faults.md). A real ``fanout
publisher`` holds a replay whose client stopped reading (its write would wait
``FANOUT_WRITE_TIMEOUT_S``), live readers, a submission whose body trickles in (its read would
wait ``FANOUT_BODY_TIMEOUT_S``) and, in one case, a Redis frozen by SIGSTOP. Both timeouts are
300 s here, so a shutdown that waited for either would outlast the test's guard. Before
69da771, ``FANOUT_SHUTDOWN_GRACE_S=0`` waited for those timeouts (aiohttp's 0 means no
limit) and a grace of 3 s took 6 s. The single-case tests of the grace are in
tests/publisher/test_shutdown.py; this one puts every kind of wait in one process.
"""

from __future__ import annotations

import json
import signal
import socket

import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.procs import log_problems
from tests.faults.sse import StallClient
from tests.faults.streams import Writer, live_deltas, text_script
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

BODY = json.dumps({"provider": "openai_chat", "model": "m",
                   "request": {"messages": [{"role": "user", "content": "hi"}]}}).encode()


def trickled_post(port: int) -> socket.socket:
    """A ``POST /v1/streams`` whose headers and first 10 body bytes are sent; the rest never is."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY[:10])
    return sock


@pytest.mark.parametrize("case", [(1, 1, True), (0, 0, False)],
                         ids=["window-1-grace-1-redis-frozen", "window-0-grace-0"])
async def test_sigterm_with_a_stalled_replay_live_readers_a_trickled_body_exits_cleanly(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher,
        case: tuple[int, int, bool]) -> None:
    window_s, grace_s, frozen = case
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_SHUTDOWN_WINDOW_S=window_s,
                                      FANOUT_SHUTDOWN_GRACE_S=grace_s, FANOUT_WRITE_TIMEOUT_S=300,
                                      FANOUT_BODY_TIMEOUT_S=300, FANOUT_REDIS_TIMEOUT_S=1)
    writer = Writer(client, keys)
    big = text_script("st_big", 240, big=230, big_bytes=48_000, terminal=True)  # 11 MB: a stalled write
    live = text_script("st_live", 5)
    for script in (big, live):
        await writer.meta(script.sid)
        await writer.store(script.events)
    stalled = StallClient(publisher.port, big.sid, API_KEY)
    await stalled.connect()
    await stalled.read_some()
    readers = [StallClient(publisher.port, live.sid, API_KEY) for _ in range(3)]
    for reader in readers:
        await reader.connect()
        await reader.read_until_seq(5)
    await writer.append(live_deltas(live.sid, 6, 3))
    for reader in readers:
        await reader.read_until_seq(8)
    posting = trickled_post(publisher.port)
    try:
        if frozen:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
        assert await publisher.stop() == 0  # within the guard, far below the 300 s timeouts
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        posting.close()
        for each in (stalled, *readers):
            each.close()
    log = publisher.log()
    assert f"closing event streams over {float(window_s)}s, then {float(grace_s)}s for what still runs" in log
    assert log.rstrip().splitlines()[-1].endswith("stopped")
    assert log_problems(log) == []
