"""Writing a Durable Streams answer's body: budgeted and timed as an ``/events`` response is.

A catch-up or long-poll page (:func:`send_answer`) and an SSE body (:class:`BudgetedWriter`)
wait on their client under ``FANOUT_WRITE_TIMEOUT_S`` and the readers' memory budgets
(:mod:`publisher.live.reader_budget`): a client that stops reading is dropped (its
connection reset) and reads again from its offset, instead of leaving the publisher
holding what it did not take.

Follows the Durable Streams Protocol, sections 5.6 to 5.8.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from publisher.live.reader_budget import reset_on_close
from publisher.state import BUDGET, SETTINGS


def drop(request: web.Request) -> None:
    """Abort the request's connection (the client reads again from its offset)."""
    if request.transport is not None:
        request.transport.abort()


async def send_answer(request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """Answer 200 with ``body`` (a catch-up or long-poll page) as SSE bodies are written.

    Its wait counts against the readers' memory budgets and ``FANOUT_WRITE_TIMEOUT_S``
    (:class:`BudgetedWriter`): a client that stops reading is dropped, not left holding the page.
    """
    response = web.StreamResponse(status=200, headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    try:
        await BudgetedWriter(request, response).write(body)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left, or was dropped
    return response


class BudgetedWriter:
    """Writes one answer's body; drops a client that takes nothing for ``FANOUT_WRITE_TIMEOUT_S``.

    Args:
        request: The request answered (its connection is aborted on a drop).
        response: Its prepared response.
    """

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request, self.response = request, response
        self.timeout_s = request.app[SETTINGS].write_timeout_s
        self.last = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last write."""
        return time.monotonic() - self.last

    async def write(self, data: bytes) -> None:
        """Write ``data``, counting it against the readers' memory budgets while it waits.

        Raises:
            ConnectionResetError: The client stopped reading, or was dropped over a budget.
        """
        budget, transport = self.request.app[BUDGET], self.request.transport
        own = (transport.get_write_buffer_size() if transport is not None else 0) + len(data)
        waiting = budget.begin(self._reset, data, 0, own)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.response.write(data)
        except TimeoutError:
            drop(self.request)
            raise ConnectionResetError("the client stopped reading") from None
        finally:
            budget.end(waiting)
        self.last = time.monotonic()

    def _reset(self) -> None:
        reset_on_close(self.request.transport)
        drop(self.request)
