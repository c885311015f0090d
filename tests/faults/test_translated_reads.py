"""/agui and /durable read by hostile and slow clients and across Redis faults (docs/faults.md, "Translated reads").

A real ``fanout publisher`` on a private Redis, clients on raw sockets or aiohttp:

* a client that reads steadily but slowly gets a history page four times
  ``FANOUT_READER_BUDGET_BYTES`` through ``/agui``, ``/durable?live=sse`` and ``/events``
  in one response; one that stops reading is dropped over its budget and resumes, also
  from a catch-up or long-poll answer (it was held, unsent, outside every budget);
* a Durable Streams offset is ASCII digits only (Unicode digits were read as a seq), ``live``
  is given once, a catch-up read from seq 0 is ``no-store`` as one from ``-1`` is, and
  ``If-None-Match`` is a list compared weakly (a proxy's ``W/`` tag was never a ``304``);
* live reads of one token share its limit (the fourth long-poll is a ``429``), catch-up
  reads hold none; a long-poll open when Redis dies ends by its wait, and every read of a
  dead Redis is a ``503`` with ``Retry-After`` (it had none);
* a ``public`` token resumed at every position, inside internal reasoning blocks too, never
  gets internal reasoning from ``/agui`` or any ``/durable`` mode;
* two tool calls with one provider id and one without get three ids on ``/agui`` and ``/ui``,
  the same after a resume at every position;
* a stream written again mid-read ends a durable SSE read with nothing of the new
  generation and an ``/agui`` read with ``RUN_ERROR history_reset``; the resume is a ``410``,
  and so is a read of trimmed history.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from urllib.parse import quote

import aiohttp
import pytest
import redis.asyncio as aioredis

from publisher.live.notification import encode_notification
from schema.contract import BlockDelta, BlockRef, BlockStart, BlockStop, Delta, Event, ToolInfo, encode_event
from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.polling import until
from tests.faults.procs import PublisherProcess, log_problems
from tests.faults.sse import GUARD_S, StallClient
from tests.faults.streams import Writer, live_deltas, reasoning_script, text_script
from tests.publisher.helpers import done, start, token_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

SID = "st_translated"
TOP, BIG_DELTAS, BIG_BYTES = 48, 40, 100_000
"""The stream: seqs 1..48, ending ``stream.done``; 40 deltas of 100 KB (4 MB) in its first page."""
SLOW = {"FANOUT_READER_BUDGET_BYTES": 1 << 20, "FANOUT_READER_STALL_MS": 2000, "FANOUT_READ_PAGE": 64}
"""A 1 MB reader budget and a 500 ms stall: the paced client below takes seconds over the 4 MB page."""
PACE_S = 0.01
"""The paced client reads what its 4 KB socket buffer holds every 10 ms: steady, a few hundred KB/s."""
PATHS = {"agui": f"/v1/streams/{SID}/agui", "durable-sse": f"/v1/streams/{SID}/durable?offset=-1&live=sse",
         "events": f"/v1/streams/{SID}/events"}
LAST = {"agui": '"RUN_FINISHED"', "durable-sse": '"streamClosed":true', "events": '"stream.done"'}
"""What the last message of a complete read holds, per path."""


class PathClient(StallClient):
    """A :class:`StallClient` of any read path of its stream (``/agui``, ``/durable?...``)."""

    def __init__(self, port: int, path: str, credential: str) -> None:
        super().__init__(port, SID, credential)
        self.path = path

    async def connect(self) -> None:
        """Open the socket (4 KB receive buffer) and send ``GET <path>`` with the credential."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock, limit=4096)
        request = f"GET {self.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.credential}\r\n\r\n"
        self._writer.write(request.encode())
        await self._writer.drain()

    async def read_paced(self) -> None:
        """Read the response to its end (or the connection's) at a steady pace: never a pause over :data:`PACE_S`."""
        async with asyncio.timeout(GUARD_S * 4):
            while await self.read_some():  # noqa: ASYNC110  # the pause is the point: a slow client
                await asyncio.sleep(PACE_S)

    def complete(self, last: str) -> bool:
        """True when the response ended cleanly (chunked end) after a message holding ``last``."""
        data = [frame.data for frame in self.frames if frame.data is not None]
        return self.status == 200 and self.ended and bool(data) and last in data[-1]


async def stored_stream(client: aioredis.Redis, keys: Keys) -> None:
    """Store the stream (a 4 MB first page), ended."""
    script = text_script(SID, TOP, big=BIG_DELTAS, big_bytes=BIG_BYTES, terminal=True)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(script.events)


@pytest.mark.parametrize("route", list(PATHS))
async def test_a_slow_steady_client_gets_a_page_over_its_budget_in_one_response(
        route: str, server: RedisServer, client: aioredis.Redis, keys: Keys,
        start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, **SLOW)
    await stored_stream(client, keys)
    reader = PathClient(publisher.port, PATHS[route], token_for(SID))
    await reader.connect()
    try:
        await reader.read_paced()
    finally:
        reader.close()
    assert reader.complete(LAST[route]), (route, reader.status, reader.frames[-1:] if reader.frames else None)
    assert log_problems(publisher.log()) == []


@pytest.mark.parametrize("route", ["agui", "durable-sse"])
async def test_a_client_that_stops_reading_is_still_dropped_over_its_budget(
        route: str, server: RedisServer, client: aioredis.Redis, keys: Keys,
        start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, **SLOW, metrics=True)
    await stored_stream(client, keys)
    stalled = PathClient(publisher.port, PATHS[route], token_for(SID))
    await stalled.connect()
    await until(stalled.read_some, "the first bytes")  # then it reads nothing more
    try:
        await until(lambda: _drops(publisher), "the stalled reader dropped over its budget")
    finally:
        stalled.close()
    again = PathClient(publisher.port, PATHS[route], token_for(SID))
    await again.connect()
    try:
        await again.read_paced()
    finally:
        again.close()
    assert again.complete(LAST[route])


async def _drops(publisher: PublisherProcess) -> bool:
    return await publisher.metric("fanout_sse_budget_drops_total") >= 1


HOSTILE_OFFSETS = {"": 400, "NOW": 400, "-2": 400, "%00": 400, "0" * 15: 400, "0" * 17: 400, "+000000000000005": 400,
                   "0000000000000005.": 400, "0000000000000005.ZZ": 400, "0000000000000005.e1.e1": 400,
                   "0000000000000005 ": 400, "1" * 16: 410, "0000000000000005.other": 410}
"""Offsets no server mints, and what each gets (``410``: well-formed, but past the top or of another generation)."""
UNICODE_OFFSETS = ["000000000000000\u0663", "\u0660" * 15 + "\u0665", "\uff10" * 15 + "5", "\u0663" * 16 + ".e1"]
"""Seq digits a regex's ``\\d`` and ``int()`` take but no server mints: Arabic-Indic and fullwidth."""


async def test_durable_parameters_are_ascii_and_given_once(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(text_script(SID, 8, terminal=True).events)
    auth, base = {"Authorization": f"Bearer {token_for(SID)}"}, f"{publisher.base}/v1/streams/{SID}/durable"
    answers = []
    async with aiohttp.ClientSession() as http:
        for offset in UNICODE_OFFSETS:
            for live in ("", "&live=long-poll", "&live=sse"):
                async with http.get(f"{base}?offset={quote(offset)}{live}", headers=auth) as resp:
                    slug = (await resp.json())["type"].rsplit("/", 1)[-1]
                    answers.append((offset, live, resp.status, slug, (400, "invalid-position")))
        for offset, status in HOSTILE_OFFSETS.items():
            for live in ("", "&live=long-poll", "&live=sse"):
                async with http.get(f"{base}?offset={quote(offset, safe='%')}{live}", headers=auth) as resp:
                    answers.append((offset, live, resp.status, resp.content_type, status))
        for method in ("OPTIONS", "TRACE", "PROPFIND", "POST", "PUT", "DELETE", "PATCH"):
            for path in (base, base.replace("/durable", "/agui")):
                async with http.request(method, path, headers=auth) as resp:
                    served = (method, path) == ("OPTIONS", base)  # 204 with Allow (no body: no content type)
                    answers.append((method, path, resp.status, resp.content_type,
                                    (204, "application/octet-stream") if served else 405))
        async with http.get(base, headers={"Authorization": f"Bearer {token_for('st_other')}"}) as resp:
            answers.append(("other token", "", resp.status, resp.content_type, 403))
        async with http.get(f"{base}?offset=-1&live=sse&live=long-poll", headers=auth) as resp:
            twice = resp.status, (await resp.json())["type"].rsplit("/", 1)[-1], resp.headers["X-Content-Type-Options"]
        async with http.get(f"{base}?offset=0000000000000000", headers=auth) as resp:
            start_cache = resp.status, resp.headers["Cache-Control"]
        async with http.get(f"{base}?offset=0000000000000002.e1", headers=auth) as resp:
            chunk_cache, tag = (resp.status, resp.headers["Cache-Control"]), resp.headers["ETag"]
        revalidated = []
        for none_match in (f"W/{tag}", f'"other", {tag}', "*", '"other"', tag[:-2] + '"'):
            async with http.get(f"{base}?offset=0000000000000002.e1",
                                headers={**auth, "If-None-Match": none_match}) as resp:
                revalidated.append(resp.status)
    wrong = [answer for answer in answers if answer[2:4] != answer[4] and
             (answer[2], answer[3]) != (answer[4], "application/problem+json")]
    assert wrong == []
    assert twice == (400, "invalid-field", "nosniff")
    assert start_cache == (200, "no-store")  # the stream's start, as from -1: it can be written again
    assert chunk_cache[1].startswith("private, max-age=")
    assert revalidated == [304, 304, 304, 200, 200]  # RFC 9110 13.1.2: a list, weak comparison, *
    assert log_problems(publisher.log()) == []


async def test_live_reads_share_the_token_limit_and_a_dead_redis_is_a_503_with_retry_after(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_MAX_CONNECTIONS_PER_TOKEN=3,
                                      FANOUT_DURABLE_LONG_POLL_S=5, FANOUT_BUSY_RETRY_AFTER_S=7)
    writer = Writer(client, keys)
    await writer.meta(SID, epoch="e1")
    await writer.store(text_script(SID, 5).events)
    auth, base = {"Authorization": f"Bearer {token_for(SID)}"}, f"{publisher.base}/v1/streams/{SID}"
    poll = f"{base}/durable?offset=0000000000000005.e1&live=long-poll"

    async def answer(http: aiohttp.ClientSession, method: str, url: str) -> tuple[int, str | None]:
        async with http.request(method, url, headers=auth) as resp:
            await resp.read()
            return resp.status, resp.headers.get("Retry-After")

    async with aiohttp.ClientSession() as http:
        polls = await asyncio.gather(*(answer(http, "GET", poll) for _ in range(4)))  # each waits 5 s: all overlap
        caught_up = await answer(http, "GET", f"{base}/durable?offset=-1")  # a catch-up read holds no connection
        through_kill = asyncio.create_task(http.get(poll, headers=auth))
        await asyncio.sleep(0.3)  # not an outcome: the long-poll is more likely waiting when its channel is cut
        await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        sixth = live_deltas(SID, 6, 1)
        await until(lambda: _published(client, keys, sixth), "the sixth event heard by a resubscribed hub")
        async with await through_kill as resp:
            killed_channel = resp.status, [event["seq"] for event in await resp.json()]
        poll = f"{base}/durable?offset=0000000000000006.e1&live=long-poll"
        held = asyncio.create_task(answer(http, "GET", poll))
        await asyncio.sleep(0.3)  # not an outcome: the long-poll is more likely waiting when Redis dies
        server.kill()
        dead_poll = await held  # ends by its wait at the latest; never hangs on the dead server
        dead = [await answer(http, method, url) for method, url in
                [("GET", poll), ("GET", f"{base}/durable?offset=-1"), ("HEAD", f"{base}/durable"),
                 ("GET", f"{base}/agui")]]
    assert sorted(polls) == [(204, None)] * 3 + [(429, "30")]  # the fourth: past the token's share
    assert caught_up[0] == 200
    assert killed_channel == (200, [6])
    assert dead_poll[0] in (204, 503)
    assert dead == [(503, "7")] * 4


async def test_a_public_token_resumed_anywhere_never_gets_internal_reasoning(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    script = reasoning_script(SID, random.Random(26), blocks=6, max_deltas=3)
    assert script.hidden, "the script holds an internal reasoning block"
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_READ_PAGE=4)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(script.events)
    public, base = {"Authorization": f"Bearer {token_for(SID, 'public')}"}, f"{publisher.base}/v1/streams/{SID}"
    leaks: list[tuple[str, int]] = []
    async with aiohttp.ClientSession() as http:
        for seq in range(script.top):  # every position, those inside internal blocks too (an internal token's ids)
            last_id = {"Last-Event-ID": f"{seq}.e1"} if seq else {}
            offset = f"{seq:016d}.e1" if seq else "-1"
            for path, headers in ((f"{base}/agui", last_id), (f"{base}/durable?offset={offset}", {}),
                                  (f"{base}/durable?offset={offset}&live=long-poll", {}),
                                  (f"{base}/durable?offset={offset}&live=sse", {})):
                async with http.get(path, headers={**public, **headers}) as resp:
                    body = await resp.read()
                    assert resp.status == 200, (path, seq, resp.status, body[:200])
                if b"SECRET" in body or b'"internal"' in body:
                    leaks.append((path, seq))
    assert leaks == []
    assert log_problems(publisher.log()) == []


async def test_history_written_again_or_trimmed_mid_read_ends_the_read_and_the_resume_is_a_410(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_HEARTBEAT_S=1)
    writer = Writer(client, keys)
    await writer.meta(SID, epoch="e1")
    await writer.store(text_script(SID, 5).events)
    auth, base = {"Authorization": f"Bearer {token_for(SID)}"}, f"{publisher.base}/v1/streams/{SID}"

    async with aiohttp.ClientSession() as http:
        async def read(url: str, headers: dict[str, str]) -> bytes:
            async with http.get(url, headers={**auth, **headers}) as resp:
                assert resp.status == 200
                return await resp.read()

        sse = asyncio.create_task(read(f"{base}/durable?offset=0000000000000005.e1&live=sse", {}))
        agui = asyncio.create_task(read(f"{base}/agui", {"Last-Event-ID": "5.e1"}))
        await asyncio.sleep(0.3)  # not an outcome: both are more likely live when the stream is written again
        await client.delete(keys.events(SID))
        again = text_script(SID, 8).events
        await writer.meta(SID, epoch="e2")
        await writer.store(again)
        await client.publish(keys.live(SID), encode_notification(1, [encode_event(e) for e in again], 1 << 16, b"e2"))
        async with asyncio.timeout(GUARD_S):
            sse_body, agui_body = await sse, await agui
        async with http.get(f"{base}/durable?offset=0000000000000005.e1&live=sse", headers=auth) as resp:
            resumed = resp.status, (await resp.json())["type"].rsplit("/", 1)[-1]
        await client.xtrim(keys.events(SID), minid="0-4", approximate=False)
        async with http.get(f"{base}/durable?offset=0000000000000001.e2", headers=auth) as resp:
            trimmed = resp.status, (await resp.json())["type"].rsplit("/", 1)[-1]
        async with http.get(f"{base}/agui", headers=auth) as resp:
            agui_trimmed = resp.status
    assert b'"seq":6' not in sse_body  # nothing of the new generation as the old one
    assert b"e2" not in sse_body
    assert agui_body.rstrip().endswith(b'"code":"history_reset","message":"the stream was written again as another '
                                       b'generation; read it again from the start (no Last-Event-ID)"}')
    assert b"id: 6" not in agui_body
    assert resumed == (410, "history-reset")
    assert trimmed == (410, "history-trimmed")
    assert agui_trimmed == 410  # /agui replays from seq 1: trimmed history cannot be translated


@pytest.mark.parametrize("mode", ["", "&live=long-poll"])
async def test_a_client_that_stops_reading_a_durable_answer_is_dropped_not_left_holding_it(
        mode: str, server: RedisServer, client: aioredis.Redis, keys: Keys,
        start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, **{**SLOW, "FANOUT_READ_PAGE": 256},
                                      FANOUT_WRITE_TIMEOUT_S=1)
    script = text_script(SID, 250, big=240, big_bytes=BIG_BYTES, terminal=True)  # a 24 MB page: more than
    await Writer(client, keys).meta(SID, epoch="e1")                              # the sockets' buffers hold
    await Writer(client, keys).store(script.events)
    stalled = PathClient(publisher.port, f"/v1/streams/{SID}/durable?offset=0000000000000001.e1{mode}", token_for(SID))
    await stalled.connect()
    try:
        await until(stalled.read_some, "the first bytes")  # then it reads nothing more
        await until(lambda: "GET /v1/streams/st_translated/durable" in publisher.log(), "the answer ended")
        await stalled.read_to_end()
    finally:
        stalled.close()
    assert stalled.status == 200
    assert len(stalled.body) < 20_000_000  # dropped mid-page: it was not sent to a client that took nothing


async def _published(client: aioredis.Redis, keys: Keys, events: list[Event]) -> bool:
    """Store ``events`` once, then publish their notification until a subscriber (the hub, back) hears it."""
    if not await client.exists(keys.events(SID)) or await client.xlen(keys.events(SID)) < events[-1].seq:
        await Writer(client, keys).store(events)
    payload = encode_notification(events[0].seq, [encode_event(e) for e in events], 1 << 16, b"e1")
    return int(await client.publish(keys.live(SID), payload)) > 0


def _calls_script() -> list[Event]:
    """Three parallel tool calls, two with the provider's id ``dup`` and one with none, completed."""
    events: list[Event] = [start(SID)]
    for index, call_id in enumerate(["dup", "dup", ""]):
        block = BlockRef(id=f"b{index}", index=index, kind="tool_call")
        seq = len(events) + 1
        events += [BlockStart(stream_id=SID, seq=seq, ts=1, block=block, tool=ToolInfo(call_id=call_id, name="f")),
                   BlockDelta(stream_id=SID, seq=seq + 1, ts=1, block=block, delta=Delta(kind="json_text", text="{}")),
                   BlockStop(stream_id=SID, seq=seq + 2, ts=1, block=block)]
    return [*events, done(SID, len(events) + 1)]


async def test_tool_call_ids_are_unique_and_the_same_after_a_resume_at_every_position(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    events = _calls_script()
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_READ_PAGE=2)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(events)
    auth, base = {"Authorization": f"Bearer {token_for(SID)}"}, f"{publisher.base}/v1/streams/{SID}"
    resumed: list[set[str]] = []
    async with aiohttp.ClientSession() as http:
        async def call_ids(path: str, headers: dict[str, str]) -> set[str]:
            async with http.get(f"{base}/{path}", headers={**auth, **headers}) as resp:
                assert resp.status == 200
                lines = (await resp.read()).split(b"\n")
            data = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
            return {event["toolCallId"] for event in data if "toolCallId" in event}

        whole = {path: await call_ids(path, {}) for path in ("agui", "ui")}
        for seq in range(1, events[-1].seq - 1):
            resumed.append(await call_ids("agui", {"Last-Event-ID": f"{seq}.e1"}))
    assert whole["agui"] == whole["ui"] == {"dup", "dup~1", "call~2"}
    assert all(ids <= whole["agui"] for ids in resumed)  # a resume names the same calls, never new ids
    assert resumed[-1] == whole["agui"]  # the calls' ends, all held back to the stream's end
