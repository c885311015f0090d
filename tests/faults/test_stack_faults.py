"""The whole stack under Redis faults, read by clients that drop and resume anywhere: each stream whole or explicit.

From the stack rounds (``scripts/breaker5/stack_faults``, ``scripts/breaker7/many_readers``;
docs/faults.md). Real processes: the fake upstream streaming recorded transcripts slowly, two
workers and two publishers (``FANOUT_CLIENT_QUEUE=4``), all on one private Redis. Every
stream has readers that leave after 1 to 5 events (or never) and come back with
``Last-Event-ID`` as a header or as ``?last_event_id=``, at either publisher. Meanwhile Redis
has its connections killed, is frozen (SIGSTOP) for a second, then is killed (-9) and
restarted with its append-only file (every write fsynced).

What held: every reader got seqs 1..n once, in order, each event byte-equal to the stored
one, ending with the terminal event. No process logged a traceback or an ERROR (a jobs-stream
read failed by a killed connection is a WARNING: a retry cures it). A restart that loses the data
(the round's ``restart-lose``: a prefix then an explicit ``stream.gap``, 404 or 410) is
tests/faults/test_live_faults.py's restart test on the reading side and
tests/worker/test_redis_restart.py's on the workers' side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import signal
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from schema.stored_entries import entry_jsons
from tests.faults.procs import PublisherProcess, log_problems
from tests.faults.sse import GUARD_S, TERMINALS, Parser
from tests.publisher.helpers import API_KEY, SECRET
from tests.redis_servers import RedisServer, redis_node
from tools.demo.stack import LocalStack

pytestmark = pytest.mark.faults

CASES = [("anthropic", "several_blocks_thinking_text_two_tools"), ("openai_chat", "reasoning_and_text_runs_alternate"),
         ("openai_responses", "function_call_fragmented_json"), ("gemini", "thought_text_call_blocks")]
STREAMS, READERS = 6, 4
ENV = {"FANOUT_HEARTBEAT_S": "1", "FANOUT_REDIS_TIMEOUT_S": "1", "FANOUT_LEASE_S": "5", "FANOUT_CLIENT_QUEUE": "4",
       "FANOUT_API_KEYS": API_KEY, "FANOUT_TOKEN_SECRET": SECRET}


def request_for(provider: str) -> dict[str, object]:
    if provider == "openai_responses":
        return {"input": "hi"}
    if provider == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    return {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


@dataclasses.dataclass
class Hopper:
    """One reader of one stream: drops after a few events, resumes by header or query at either publisher."""

    sid: str
    token: str
    rng: random.Random
    got: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    terminal: str | None = None
    last_id: str | None = None

    async def run(self, http: aiohttp.ClientSession, bases: list[str]) -> None:
        async with asyncio.timeout(GUARD_S * 2):
            while self.terminal is None and not self.gone:
                await self._one(http, self.rng.choice(bases), self.rng.choice([1, 1, 2, 3, 5, 1_000]))

    @property
    def gone(self) -> bool:
        """The stream was said to be gone: a gap frame, a 404 or a 410 (the run stops; the test fails it)."""
        return any(note.startswith(("gap", "404", "410")) for note in self.notes)

    async def _one(self, http: aiohttp.ClientSession, base: str, drop_after: int) -> None:
        url, headers = f"{base}/v1/streams/{self.sid}/events", {"Authorization": f"Bearer {self.token}"}
        if self.last_id is not None and self.rng.random() < 0.5:
            headers["Last-Event-ID"] = self.last_id
        elif self.last_id is not None:
            url += f"?last_event_id={self.last_id}"
        try:
            async with http.get(url, headers=headers) as resp:
                if resp.status != 200:
                    self.notes.append(f"{resp.status} {(await resp.text())[:100]}")
                    await asyncio.sleep(0.2)
                    return
                await self._read(resp, drop_after)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            self.notes.append(type(exc).__name__)
            await asyncio.sleep(0.2)

    async def _read(self, resp: aiohttp.ClientResponse, drop_after: int) -> None:
        parser, taken = Parser(), 0
        async for chunk in resp.content.iter_any():
            for frame in parser.feed(chunk):
                if frame.event == "stream.gap":
                    self.notes.append(f"gap {frame.data}")
                    return
                if frame.id is None:
                    continue
                self.got.append((frame.seq, frame.data or ""))
                self.last_id, taken = frame.id, taken + 1
                if frame.event in TERMINALS:
                    self.terminal = frame.event
                    return
                if taken >= drop_after:
                    return  # leaves mid-stream: the connection is closed
            assert not parser.bad, parser.bad


class Stack:
    """LocalStack (upstream, two workers, a publisher) plus a second publisher, on one private Redis."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.local = LocalStack(server.url, workers=2, chunk_bytes=192, slow_delay_ms=150, slow_pacing="chunk", env=ENV)
        self.local.api_key = API_KEY
        settings = {k: v for k, v in ENV.items() if not k.startswith(("FANOUT_API", "FANOUT_TOKEN"))}
        self.second = PublisherProcess(server.url, self.local.prefix, **settings)

    @property
    def bases(self) -> list[str]:
        return [self.local.base_url, self.second.base]

    def logs(self) -> dict[str, str]:
        out = {name: self.local.logs(name) for name in ("publisher", "worker-1", "worker-2")}
        return {**out, "publisher-2": self.second.log()}


@pytest.fixture
def stack_server() -> Iterator[RedisServer]:
    """A private Redis that keeps every acknowledged write across a kill -9 (AOF, fsync always)."""
    with redis_node(extra=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        yield server


async def submit_all(http: aiohttp.ClientSession, base: str) -> list[tuple[str, str]]:
    out = []
    for i in range(STREAMS):
        provider, case = CASES[i % len(CASES)]
        async with http.post(f"{base}/v1/streams", headers={"Authorization": f"Bearer {API_KEY}"},
                             json={"provider": provider, "model": f"slow-{case}",
                                   "request": request_for(provider)}) as resp:
            assert resp.status == 201, await resp.text()
            body = await resp.json()
            out.append((body["stream_id"], body["token"]))
    return out


async def inflict(server: RedisServer) -> None:
    """While the streams run: kill every connection, freeze Redis for a second, then kill -9 and restart it."""
    assert server.proc is not None
    await asyncio.sleep(0.5)
    with server.client() as admin:
        admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    server.proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(1.0)
    server.proc.send_signal(signal.SIGCONT)
    await asyncio.sleep(0.3)
    server.kill()  # -9, then a restart that reloads the append-only file
    await asyncio.sleep(0.5)
    await asyncio.to_thread(server.start)


def stored(server: RedisServer, prefix: str, sid: str) -> dict[int, str]:
    with server.client() as client:
        return {seq: data.decode() for eid, fields in client.xrange(f"{prefix}:{{{sid}}}:events")
                for seq, data in entry_jsons(sid, eid, fields)}


async def test_every_reader_of_every_stream_gets_it_whole_through_kills_a_freeze_and_a_restart(
        stack_server: RedisServer) -> None:
    stack = Stack(stack_server)
    started = await asyncio.gather(asyncio.to_thread(stack.local.__enter__), stack.second.start(),
                                   return_exceptions=True)
    try:
        assert not [error for error in started if isinstance(error, BaseException)], started
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            streams = await submit_all(http, stack.local.base_url)
            rng = random.Random(7)
            readers = [Hopper(sid, token, random.Random(rng.random())) for sid, token in streams
                       for _ in range(READERS)]
            await asyncio.gather(inflict(stack_server), *(r.run(http, stack.bases) for r in readers))
        assert await stack.second.stop() == 0
        assert await asyncio.to_thread(stack.local.stop) == []
        logs = stack.logs()
    finally:
        stack.second.remove()
        stack.local.keep_logs = sys.exc_info()[0] is not None  # a failure keeps the process logs (path on stderr)
        await asyncio.to_thread(stack.local.__exit__, None, None, None)
    for reader in readers:
        seqs = [seq for seq, _ in reader.got]
        assert seqs == list(range(1, len(seqs) + 1)), (reader.sid, seqs, reader.notes)
        assert reader.terminal is not None, (reader.sid, seqs, reader.notes)
        events = stored(stack_server, stack.local.prefix, reader.sid)
        assert all(events[seq] == data for seq, data in reader.got), reader.sid
        assert json.loads(reader.got[-1][1])["type"] == reader.terminal
    for name, text in logs.items():
        assert log_problems(text) == [], name
