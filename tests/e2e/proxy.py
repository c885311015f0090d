"""A loopback TCP proxy that can cut a connection mid-response, as a dropped network would."""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to a target port; cuts the first SSE response after N events.

    Attributes:
        requests: The raw request heads seen, in order (to check ``Last-Event-ID``).
        cut_after_events: Blank-line-terminated SSE messages relayed on the first
            ``/events`` response before both sockets are closed (0 disables cutting).
    """

    def __init__(self, target_port: int, *, cut_after_events: int) -> None:
        self.target_port = target_port
        self.cut_after_events = cut_after_events
        self.requests: list[str] = []
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        head = await client_r.readuntil(b"\r\n\r\n")
        text = head.decode("latin-1")
        self.requests.append(text)
        up_w.write(_one_request_per_connection(head))
        cut = "/events" in text.split("\r\n", 1)[0] and self.cuts == 0 and self.cut_after_events > 0
        if cut:
            self.cuts += 1
        tasks = [asyncio.create_task(self._pipe(client_r, up_w)),
                 asyncio.create_task(self._pipe(up_r, client_w, cut_after=self.cut_after_events if cut else 0))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, up_w):
            writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut_after: int = 0) -> None:
        body = b""
        sent = 0
        while data := await reader.read(65536):
            if not cut_after:
                writer.write(data)
                await writer.drain()
                continue
            body += data
            end = _end_of_nth_message(body, cut_after)
            stop = len(body) if end is None else end
            writer.write(body[sent:stop])
            await writer.drain()
            sent = stop
            if end is not None:
                return


def _one_request_per_connection(head: bytes) -> bytes:
    """Rewrite a request head to ``Connection: close``, so every request opens its own
    connection and each passes through :meth:`CuttingProxy._handle` (no keep-alive reuse)."""
    lines = [line for line in head.split(b"\r\n")[:-2] if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def _end_of_nth_message(body: bytes, n: int) -> int | None:
    """Offset just past the n-th SSE message carrying an ``id:`` line, or None if not there yet.

    Works on the raw HTTP/1.1 response (head, then chunked or plain body): messages end
    with a blank line, and chunk-size lines between them never contain one.
    """
    head_end = body.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    count, pos = 0, head_end + 4
    while (blank := body.find(b"\n\n", pos)) >= 0:
        if b"\nid: " in b"\n" + body[pos:blank]:
            count += 1
            if count == n:
                return blank + 2
        pos = blank + 2
    return None
