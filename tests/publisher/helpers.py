"""Helpers for publisher tests: contract events, a stream writer acting as a worker, an SSE reader.

Events are written like the bug cases do: ``XADD <events> 0-<seq> e <json>``, ``HSET``
meta, ``PUBLISH`` the seq on the live channel (``SPUBLISH`` where the deployment's live
mode is sharded, as the worker's script would: :func:`infra.live_pubsub.live_mode`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from infra.live_pubsub import LiveMode, live_mode, publish_live
from publisher.api.tokens import issue
from publisher.app import RUNNER_KWARGS, create_app
from publisher.history.visibility import Scope
from publisher.live.notification import encode_notification
from publisher.settings import PublisherSettings
from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    ErrorInfo,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    encode_event,
    is_terminal,
    terminal_status,
)
from schema.keys import Keys
from schema.stored import encode_stored

API_KEY = "test-api-key-0123456789"
SECRET = "test-secret-" + "x" * 40
GUARD_S = 10.0
"""Guard against hangs only; never a performance limit."""


def make_settings(**overrides: Any) -> PublisherSettings:
    base: dict[str, Any] = {
        "api_keys": [API_KEY],
        "token_secret": SECRET,
        "shutdown_window_s": 0.0,
    }
    base.update(overrides)
    return PublisherSettings(**base)


def token_for(stream_id: str, scope: Scope = "public", ttl_s: int = 3600, secret: str = SECRET) -> str:
    return issue(secret, stream_id, scope, int(time.time()) + ttl_s)


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def now_ms() -> int:
    return int(time.time() * 1000)


def start(sid: str, seq: int = 1) -> Event:
    return StreamStart(stream_id=sid, seq=seq, ts=now_ms(), provider="openai_chat", model="m")


def block_start(sid: str, seq: int, index: int, kind: str = "text", visibility: str | None = None) -> Event:
    block = BlockRef(id=f"b{index}", index=index, kind=kind)
    if kind == "reasoning":
        return BlockStart(stream_id=sid, seq=seq, ts=now_ms(), block=block,
                          visibility=visibility or "public", redacted=False)
    return BlockStart(stream_id=sid, seq=seq, ts=now_ms(), block=block)


def delta(sid: str, seq: int, index: int, text: str = "x", kind: str = "text") -> Event:
    block = BlockRef(id=f"b{index}", index=index, kind=kind)
    return BlockDelta(stream_id=sid, seq=seq, ts=now_ms(), block=block, delta=Delta(kind="text", text=text))


def stop(sid: str, seq: int, index: int, kind: str = "text") -> Event:
    block = BlockRef(id=f"b{index}", index=index, kind=kind)
    return BlockStop(stream_id=sid, seq=seq, ts=now_ms(), block=block)


def done(sid: str, seq: int) -> Event:
    return StreamDone(stream_id=sid, seq=seq, ts=now_ms(), status="completed", finish_reason="stop",
                      provider_finish_reason="stop", usage=None, response_id="r1", model="m")


def error(sid: str, seq: int, status: str = "failed") -> Event:
    info = ErrorInfo(category="upstream_error", retryable=False, message="boom")
    return StreamError(stream_id=sid, seq=seq, ts=now_ms(), status=status, error=info,
                       usage=None, finish_reason=None)


def text_stream(sid: str, deltas: int, *, end: str = "done") -> list[Event]:
    """stream.start, one text block with ``deltas`` deltas, then stream.done (or stream.error)."""
    events = [start(sid), block_start(sid, 2, 0)]
    events += [delta(sid, 3 + i, 0, f"t{i} ") for i in range(deltas)]
    seq = 3 + deltas
    events.append(stop(sid, seq, 0))
    events.append(done(sid, seq + 1) if end == "done" else error(sid, seq + 1))
    return events


class StreamWriter:
    """Writes one stream's entries as a worker would (without the fencing script)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, sid: str, *, epoch: bytes = b"",
                 compact: bool = False) -> None:
        self.redis, self.keys, self.sid = redis, keys, sid
        self.compact = compact
        """Store the compact form (field ``c``, schema.stored) and notify it, as today's worker; else the JSON form."""
        self.mode: LiveMode | None = None
        self.epoch = epoch
        """The generation written (meta ``epoch`` at seq 1, on every notification); ``b""``: none, as before 1.1."""

    async def meta(self, **fields: Any) -> None:
        base = {"state": "running", "provider": "openai_chat", "model": "m", "created_ms": now_ms(), "last_seq": 0}
        base.update(fields)
        await self.redis.hset(self.keys.meta(self.sid), mapping=base)

    async def append(self, *events: Event, notify: bool = True, maxlen: int | None = None,
                     full: bool = False) -> None:
        """Store ``events`` one by one, each notified seq-only (an older worker) or, with
        ``full``, carrying its event as the append script does."""
        for event in events:
            value = encode_stored(event) if self.compact else encode_event(event)
            await self.redis.xadd(self.keys.events(self.sid), {"c" if self.compact else "e": value},
                                  id=f"0-{event.seq}", maxlen=maxlen, approximate=False)
            fields: dict[str, Any] = {"last_seq": event.seq}
            if event.seq == 1 and self.epoch:
                fields["epoch"] = self.epoch
            if is_terminal(event):
                fields.update(state="done", status=terminal_status(event))
            await self.redis.hset(self.keys.meta(self.sid), mapping=fields)
            if notify:
                await self.notify(event.seq, [value] if full else None)

    async def notify(self, last_seq: int, events: list[bytes] | None = None) -> None:
        """Publish one live notification: seq-only, or carrying ``events`` (ending at ``last_seq``)."""
        payload = (encode_notification(last_seq - len(events) + 1, events, 1 << 30, self.epoch, compact=self.compact)
                   if events
                   else encode_notification(last_seq, [b""], 0, self.epoch))
        self.mode = self.mode or await live_mode(self.redis)
        await publish_live(self.redis, self.mode, self.keys.live(self.sid), payload)

    async def expire(self, last_seq: int, status: str = "completed") -> None:
        """Leave only the tombstone, as after the events' TTL."""
        await self.redis.hset(self.keys.tomb(self.sid), mapping={"last_seq": last_seq, "status": status})
        await self.redis.delete(self.keys.events(self.sid), self.keys.meta(self.sid))


class HookedRedis:
    """Forwards to the real client; runs ``hook`` once, when an XRANGE of ``key`` matches ``when``."""

    def __init__(self, inner: Any, key: str, when, hook) -> None:
        self._inner, self._key, self._when, self._hook = inner, key, when, hook
        self.fired = False
        self.xrange_calls: list[str] = []
        self.xrange_counts: list[int | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, name, min="-", max="+", count=None):
        result = await self._inner.xrange(name, min, max, count=count)
        if name == self._key:
            self.xrange_calls.append(min)
            self.xrange_counts.append(count)
            if not self.fired and self._when(result):
                self.fired = True
                await self._hook()
        return result


def recording_redis(key: str) -> tuple[Callable[[Any], HookedRedis], list[HookedRedis]]:
    """Return ``(wrap_redis, hooked)``: the app's client wrapped to record every XRANGE of ``key`` (no hook)."""
    hooked: list[HookedRedis] = []

    async def nothing() -> None:
        return None

    def wrap(client: Any) -> HookedRedis:
        hooked.append(HookedRedis(client, key, lambda result: False, nothing))
        return hooked[0]

    return wrap, hooked


class SSEClient:
    """Reads SSE messages one by one from an aiohttp response (WHATWG field parsing, LF only)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def message(self) -> dict[str, str] | None:
        """Return the next message's fields (``comment`` for comment-only), or ``None`` at EOF."""
        fields: dict[str, str] = {}
        while True:
            line = await asyncio.wait_for(self.response.content.readline(), GUARD_S)
            if not line:
                return None
            text = line.decode().rstrip("\n")
            if text == "":
                if fields:
                    return fields
                continue
            name, _, value = text.partition(":")
            fields[name or "comment"] = value[1:] if value.startswith(" ") else value

    async def events(self) -> list[dict[str, str]]:
        """Read to EOF and return the messages that carry an ``id``."""
        out = []
        while (msg := await self.message()) is not None:
            if "id" in msg:
                out.append(msg)
        return out

    async def next_event(self) -> dict[str, str] | None:
        """Return the next message with ``data`` (skipping retry hints and comments)."""
        while (msg := await self.message()) is not None:
            if "data" in msg:
                return msg
        return None


def ids(messages: list[dict[str, str]]) -> list[int]:
    return [int(m["id"]) for m in messages]


async def eventually(check: Any) -> None:
    """Poll ``check()`` (plain or awaitable result) until true; the guard only stops hangs.

    For conditions with no event to wait on: state inside the server or in Redis.
    """
    async with asyncio.timeout(GUARD_S):
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running_publisher(url: str, keys: Keys, settings: PublisherSettings | None = None, *,
                            wrap: Callable[[Any], Any] | None = None) -> AsyncIterator[str]:
    """Run a publisher app on a free loopback port against ``url``; yield its base URL, stop it after."""
    app = create_app(settings or make_settings(), keys=keys, redis_url=url, wrap_redis=wrap)
    runner = web.AppRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def drain_socket(sock: socket.socket) -> bytes:
    """Read a raw socket to its end (EOF or reset); the server must close it within ``GUARD_S``."""
    sock.settimeout(GUARD_S)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data
