"""SSE readers for the fault scenarios: an incremental parser, a resuming follower, a reader that stalls.

Every reader keeps what a client keeps: the raw ``id:`` of the last event (sent back as
``Last-Event-ID``) and, per event, its seq and its ``data:`` bytes. The seq is read from the
event JSON's ``seq`` (an ``id:`` may become ``<seq>.<epoch>``); ``id:`` values are never
parsed beyond the part before the first ``.``. Follows WHATWG HTML, "9.2.6 Interpreting an
event stream" (LF line ends only: the publisher never sends CR).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import socket

import aiohttp

GUARD_S = 30.0
"""Hang guard of one reader's whole run; never a performance limit."""
TERMINALS = frozenset({"stream.done", "stream.error"})
"""Event types that end a stream."""


@dataclasses.dataclass
class Frame:
    """One SSE message: its ``id``, ``event``, joined ``data`` and ``retry`` fields (``None`` when absent)."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    retry: str | None = None

    @functools.cached_property
    def seq(self) -> int:
        """The event's seq: the data JSON's ``seq``, else the ``id`` up to its first ``.``."""
        if self.data is not None and self.data.startswith("{"):
            value = json.loads(self.data).get("seq")
            if isinstance(value, int):
                return value
        assert self.id is not None, f"a frame without a seq: {self}"
        return int(self.id.split(".", 1)[0])


class Parser:
    """Feeds body bytes, returns completed messages; records lines that are no SSE field."""

    FIELDS = ("id", "event", "data", "retry")

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        """Bytes of the message still open, in pieces (joined once it completes)."""
        self.bad: list[bytes] = []
        """Lines that are neither a known field nor a comment (``: ...``)."""

    def feed(self, chunk: bytes) -> list[Frame]:
        """Return the messages ``chunk`` completed (comment-only messages are left out)."""
        spans = chunk.startswith(b"\n") and bool(self._pending) and self._pending[-1].endswith(b"\n")
        if b"\n\n" not in chunk and not spans:
            self._pending.append(chunk)
            return []
        *messages, rest = (b"".join(self._pending) + chunk).split(b"\n\n")
        self._pending = [rest] if rest else []
        return [frame for frame in map(self._frame, messages) if frame is not None]

    def _frame(self, message: bytes) -> Frame | None:
        frame, seen = Frame(), False
        for line in message.split(b"\n"):
            if line.startswith(b":") or not line:
                continue
            name, _, value = line.decode().partition(":")
            if name not in self.FIELDS or b"\r" in line:
                self.bad.append(line[:200])
                continue
            value = value.removeprefix(" ")
            if name == "data" and frame.data is not None:
                value = frame.data + "\n" + value
            setattr(frame, name, value)
            seen = True
        return frame if seen else None


@dataclasses.dataclass
class Follower:
    """Follows one stream to its terminal event, resuming with ``Last-Event-ID`` after every end.

    Attributes:
        events: ``(seq, data)`` of every event received, in arrival order, across responses.
        statuses: The HTTP status of every response.
        gaps: The ``data`` of each ``stream.gap`` frame.
        ends: How each response ended (``eof``, ``cut``, ``<status>``, ``dropped``).
    """

    base: str
    sid: str
    credential: str
    last_id: str | None = None
    events: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    statuses: list[int] = dataclasses.field(default_factory=list)
    gaps: list[str] = dataclasses.field(default_factory=list)
    ends: list[str] = dataclasses.field(default_factory=list)
    bad: list[bytes] = dataclasses.field(default_factory=list)
    terminal: str | None = None

    @property
    def seqs(self) -> list[int]:
        """The seq of every event received."""
        return [seq for seq, _ in self.events]

    async def run(self, http: aiohttp.ClientSession, *, drop_after: list[int] | None = None,
                  gone_ok: bool = False, pause_s: float = 0.05, slow_s: float = 0.0) -> None:
        """Read until a terminal event or a 204; ``drop_after[i]``: leave response ``i`` after that many events.

        ``slow_s``: pause after each network read (a slow client); ``pause_s``: before each reconnect.

        A 404 or 410 ends the run when ``gone_ok`` (the stream is gone); any other
        status but 200 and 204 fails the test.
        """
        async with asyncio.timeout(GUARD_S):
            while self.terminal is None:
                limit = drop_after.pop(0) if drop_after else None
                status = await self._one(http, limit, slow_s)
                if status == 204 or (gone_ok and status in (404, 410)):
                    return
                assert status == 200, f"{self.sid}: status {status} after {self.last_id}: {self.ends[-1:]}"
                if self.terminal is None:
                    await asyncio.sleep(pause_s)

    async def _one(self, http: aiohttp.ClientSession, limit: int | None, slow_s: float) -> int:
        headers = {"Authorization": f"Bearer {self.credential}"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        try:
            async with http.get(f"{self.base}/v1/streams/{self.sid}/events", headers=headers) as resp:
                self.statuses.append(resp.status)
                if resp.status != 200:
                    self.ends.append(f"{resp.status} {(await resp.read())[:200]!r}")
                    return resp.status
                self.ends.append(await self._read(resp, limit, slow_s))
                return 200
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            self.ends.append(f"cut {type(exc).__name__}")
            return 200

    async def _read(self, resp: aiohttp.ClientResponse, limit: int | None, slow_s: float) -> str:
        parser, taken = Parser(), 0
        async for chunk in resp.content.iter_any():
            for frame in parser.feed(chunk):
                if frame.event == "stream.gap":
                    self.gaps.append(frame.data or "")
                elif frame.id is not None:
                    self.events.append((frame.seq, frame.data or ""))
                    self.last_id, taken = frame.id, taken + 1
                    if frame.event in TERMINALS:
                        self.terminal = frame.event
                        return "terminal"
                    if limit is not None and taken >= limit:
                        return "dropped"
            self.bad += parser.bad
            parser.bad.clear()
            if slow_s:
                await asyncio.sleep(slow_s)
        return "eof"


class StallClient:
    """One SSE request over a raw socket with a small receive buffer; the test decides when it reads.

    With a 4 KB buffer and nothing read, a write of a few MB stalls in the publisher: a
    slow or paused client. The chunked body is decoded as it comes.
    """

    def __init__(self, port: int, sid: str, credential: str, *, last_id: str | None = None) -> None:
        self.port, self.sid, self.credential, self.last_id = port, sid, credential, last_id
        self.status = 0
        self.frames: list[Frame] = []
        self.last_seq = 0
        """The seq of the last event received (0: none yet)."""
        self.ended = False
        self._parser = Parser()
        self.body = b""
        """The body of a response that is not chunked (a problem document)."""
        self._raw = b""
        self._head_done = False
        self._chunked = False
        self._left = -1
        """Bytes of the current chunk's data still to come; 0: its closing CRLF; -1: a size line."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @property
    def seqs(self) -> list[int]:
        """The seqs of the events (frames with an ``id``) received so far."""
        return [frame.seq for frame in self.frames if frame.id is not None]

    @property
    def gaps(self) -> list[Frame]:
        """The ``stream.gap`` frames received so far."""
        return [frame for frame in self.frames if frame.event == "stream.gap"]

    @property
    def bad(self) -> list[bytes]:
        """Lines that were no SSE field."""
        return self._parser.bad

    async def connect(self) -> None:
        """Open the socket (4 KB receive buffer) and send the request."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock, limit=4096)
        lines = [f"GET /v1/streams/{self.sid}/events HTTP/1.1", "Host: x", f"Authorization: Bearer {self.credential}"]
        if self.last_id is not None:
            lines.append(f"Last-Event-ID: {self.last_id}")
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self._writer.drain()

    async def read_some(self) -> bool:
        """Read once (waiting for data); ``False`` at the end of the response or of the connection."""
        assert self._reader is not None
        try:
            data = await self._reader.read(65536)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self.ended = True
            return False
        self._feed(data)
        return not self.ended

    async def read_until_seq(self, seq: int) -> None:
        """Read until an event with ``seq`` or more came, or the response ended."""
        async with asyncio.timeout(GUARD_S):
            while self.last_seq < seq and await self.read_some():
                pass

    async def read_to_end(self) -> None:
        """Read until the response ends."""
        async with asyncio.timeout(GUARD_S):
            while await self.read_some():
                pass

    def close(self) -> None:
        """Abort the connection."""
        if self._writer is not None:
            self._writer.transport.abort()

    def _feed(self, data: bytes) -> None:
        self._raw += data
        if not self._head_done:
            head, sep, rest = self._raw.partition(b"\r\n\r\n")
            if not sep:
                return
            self.status, self._head_done, self._raw = int(head.split(b" ", 2)[1]), True, rest
            self._chunked = b"transfer-encoding: chunked" in head.lower()
        if not self._chunked:
            self.body, self._raw = self.body + self._raw, b""
            return
        self._chunks()

    def _chunks(self) -> None:
        """Decode the chunked transfer coding (``<hex size>\\r\\n<data>\\r\\n``, size 0 ends) as bytes come.

        A chunk's data goes to the SSE parser as it arrives, so a chunk of megabytes read
        4 KB at a time costs no more than its size.
        """
        while self._raw:
            if self._left > 0:
                piece, self._raw = self._raw[:self._left], self._raw[self._left:]
                self._left -= len(piece)
                frames = self._parser.feed(piece)
                self.frames += frames
                self.last_seq = next((f.seq for f in reversed(frames) if f.id is not None), self.last_seq)
                continue
            line, sep, rest = self._raw.partition(b"\r\n")
            if not sep:
                return
            if self._left == 0:  # the CRLF closing a chunk's data
                self._raw, self._left = rest, -1
                continue
            self._raw, self._left = rest, int(line.split(b";")[0], 16)
            if self._left == 0:
                self.ended = True
                return
