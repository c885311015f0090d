"""A loopback TCP proxy before a private Redis that misbehaves on demand, as a network or a stuck server would.

:class:`FaultProxy` forwards ``127.0.0.1:<port>`` to a Redis port and can:

* :meth:`freeze`/:meth:`thaw`: hold every reply (requests still reach Redis and run);
* gate: hold the replies of the first request holding :attr:`gate_pattern` until
  :attr:`gate_open` is set (:attr:`gate_entered` is set when it arrives), so a fault can be
  placed while one exact command is in flight;
* hold: once :attr:`hold_pattern` is set, keep the next request holding it from Redis
  until :attr:`hold_open` is set (:attr:`hold_entered` is set when it arrives);
* :meth:`cut`: reset every open connection, both ways (``SO_LINGER`` 0: a TCP RST);
* :attr:`down`: reset every new connection at once (Redis unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """See the module docstring; ``async with`` starts and closes it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.down = False
        self.cuts = 0
        self.gate_pattern: bytes | None = None
        self.gate_entered = asyncio.Event()
        self.gate_open = asyncio.Event()
        self.hold_pattern: bytes | None = None
        self.hold_entered = asyncio.Event()
        self.hold_open = asyncio.Event()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gate_open.set()
        self.hold_open.set()
        self.thaw()
        self.cut()
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def freeze(self) -> None:
        """Hold every reply from now on."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Let held and later replies through."""
        self._flowing.set()

    def cut(self) -> None:
        """Reset every open connection (RST both ways)."""
        self.cuts += 1
        writers, self._writers = self._writers, []
        for writer in writers:
            _reset(writer)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            # Cancelled at close: end quietly, since asyncio.start_server's done-callback calls
            # exception() on the task and logs a cancelled one as an unhandled error.
            with contextlib.suppress(asyncio.CancelledError):
                await self._forward(client_r, client_w)
        finally:
            self._handlers.discard(task)

    async def _forward(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.down:
            _reset(client_w)
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(client_w)
            return
        self._writers += [client_w, up_w]
        held = asyncio.Event()
        held.set()

        async def requests() -> None:
            while data := await client_r.read(65536):
                if self.gate_pattern is not None and self.gate_pattern in data and not self.gate_entered.is_set():
                    held.clear()
                    self.gate_entered.set()
                    asyncio.get_running_loop().create_task(self._open_later(held))
                if self.hold_pattern is not None and self.hold_pattern in data and not self.hold_entered.is_set():
                    self.hold_entered.set()
                    await self.hold_open.wait()
                up_w.write(data)
                await up_w.drain()

        async def replies() -> None:
            while data := await up_r.read(65536):
                await self._flowing.wait()
                await held.wait()
                client_w.write(data)
                await client_w.drain()

        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.gather(requests(), replies())
        for writer in (client_w, up_w):
            writer.transport.abort()

    async def _open_later(self, held: asyncio.Event) -> None:
        await self.gate_open.wait()
        held.set()
