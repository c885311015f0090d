"""Python client for fanout consumers: submit jobs and follow streams with automatic resume.

:meth:`FanoutClient.events` is an async iterator over a stream's contract events that
reconnects by itself when the connection drops, sending ``Last-Event-ID`` so no event
is missed or repeated, waiting as the server's ``retry:`` hint asks (with exponential
backoff and jitter on repeated failures), and stopping on ``204`` or a terminal event.
SSE bytes are decoded by :class:`fanout_client.sse.SSEParser`.

Errors name what to do: a base URL that is not ``http(s)://`` is refused when the client
is built (``ValueError``); a first connection that cannot be made at all (refused,
unknown host) raises :class:`PublisherUnreachableError` at once instead of retrying; a
``404`` for a route (not for a stream) says the base URL is not the publisher's root.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final, Literal, overload

import aiohttp
import msgspec

from fanout_client.answers import NOT_A_ROUTE, base_url_problem, connect_reason, refusal_error
from fanout_client.contract import Event
from fanout_client.errors import HistoryResetError, PublisherUnreachableError
from fanout_client.reconnect import DEFAULT_RETRY_MS, MAX_BACKOFF_S, Connection, backoff_s, event_id
from fanout_client.reducer import AssembledResult, Assembler
from fanout_client.snapshot import StreamSnapshot, assembler_from, decode_message, ends
from fanout_client.sse import SSEParser

__all__ = ["DEFAULT_RETRY_MS", "MAX_BACKOFF_S", "MAX_RESETS", "NOT_A_ROUTE", "FanoutClient", "Submission",
           "base_url_problem"]

MAX_RESETS: Final = 3
"""Most restarts of :meth:`FanoutClient.result` after a ``history-reset`` (contract 1.1)."""


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """What ``POST /v1/streams`` answered."""

    stream_id: str
    """The stream's id."""
    events_url: str
    """Absolute or root-relative URL of the SSE route."""
    status_url: str
    """URL of the status route."""
    token: str
    """Read token for this stream."""
    token_expires_at: int | None = None
    """Token expiry, seconds since the epoch."""
    cancel_url: str | None = None
    """URL of the cancel route."""
    token_scope: str | None = None
    """Scope of ``token``: ``public`` (a submission's token) or ``internal``."""


class FanoutClient:
    """Client of one fanout publisher.

    Args:
        base_url: The publisher's root URL, e.g. ``http://127.0.0.1:8080``.
        api_key: Bearer API key, needed to submit and cancel (and to read any stream).
        session: An ``aiohttp.ClientSession`` to reuse; one is created (and closed by
            :meth:`close`) otherwise.
        max_reconnects: Consecutive failed reconnects tolerated before giving up.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        session: aiohttp.ClientSession | None = None,
        max_reconnects: int = 20,
    ) -> None:
        problem = base_url_problem(base_url)
        if problem is not None:
            raise ValueError(problem)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._session = session
        self._own_session = session is None
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        """Reconnects made by :meth:`events` so far (for tests and progress views)."""

    async def __aenter__(self) -> FanoutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (created on first use)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

    async def close(self) -> None:
        """Close the session if this client created it."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, path_or_url: str) -> str:
        return path_or_url if "://" in path_or_url else f"{self.base_url}{path_or_url}"

    def _auth(self, token: str | None = None) -> dict[str, str]:
        secret = token or self.api_key
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    async def submit(
        self,
        *,
        provider: str,
        model: str,
        request: dict[str, Any],
        stream_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        endpoint: str | None = None,
    ) -> Submission:
        """Submit a job (``POST /v1/streams``) and return the publisher's answer.

        ``endpoint`` names an endpoint of the workers' upstreams file (``FANOUT_UPSTREAMS_FILE``).

        Raises:
            StreamUnavailableError: The publisher refused it (the problem body is attached).
            PublisherUnreachableError: No connection could be made to ``base_url``.
        """
        body: dict[str, Any] = {"provider": provider, "model": model, "request": request}
        if stream_id:
            body["stream_id"] = stream_id
        if metadata:
            body["metadata"] = metadata
        if endpoint:
            body["endpoint"] = endpoint
        async with self._request("POST", "/v1/streams", json=body, headers=self._auth()) as resp:
            data = await self._json_or_raise(resp, expect=(200, 201))
        return msgspec.convert(data, Submission)

    async def cancel(self, stream_id: str) -> int:
        """Ask the publisher to cancel a stream; return the HTTP status (202, or 409 once terminal)."""
        async with self._request("POST", f"/v1/streams/{stream_id}/cancel", headers=self._auth()) as resp:
            return resp.status

    async def status(self, stream_id: str, token: str | None = None) -> dict[str, Any]:
        """Return ``GET /v1/streams/{id}``: the stream's status and assembled result so far."""
        async with self._request("GET", f"/v1/streams/{stream_id}", headers=self._auth(token)) as resp:
            return await self._json_or_raise(resp, expect=(200,))

    @overload
    def events(self, stream_id: str, *, token: str | None = None, last_event_id: int | str | None = None,
               events_url: str | None = None, snapshot: Literal[False] = False) -> AsyncIterator[Event]: ...

    @overload
    def events(self, stream_id: str, *, token: str | None = None, last_event_id: int | str | None = None,
               events_url: str | None = None, snapshot: bool) -> AsyncIterator[Event | StreamSnapshot]: ...

    async def events(
        self,
        stream_id: str,
        *,
        token: str | None = None,
        last_event_id: int | str | None = None,
        events_url: str | None = None,
        snapshot: bool = False,
    ) -> AsyncIterator[Event | StreamSnapshot]:
        """Yield the stream's events after ``last_event_id``, resuming by itself on disconnect.

        Args:
            stream_id: The stream to follow.
            token: Its read token (else the API key is used).
            last_event_id: The SSE ``id`` of the last event already held (``<seq>.<epoch>``,
                or a bare seq, which the publisher does not check against the stream's
                generation); ``None`` starts at the beginning.
            events_url: The URL from the submission (default ``/v1/streams/{id}/events``).
            snapshot: Without ``last_event_id``, ask for the stream's state instead of its
                history (``?snapshot=1``): a :class:`~fanout_client.snapshot.StreamSnapshot`
                comes first (a publisher older than contract 1.1 sends the history instead),
                then the events after its seq; a reconnect resumes after the last id held.

        Yields:
            Contract events in seq order, each once; unknown event types are skipped.
            Ends after the terminal event (or a snapshot of a finished stream), or at once
            on ``204`` (already complete).

        Raises:
            HistoryResetError: The stream was written again as another generation while
                it was followed (or ``last_event_id`` names another one): the events
                yielded so far are not its history; read it again from the start.
            StreamUnavailableError: 400/401/403/404/410 from the publisher.
            PublisherUnreachableError: The first connection could not be made at all
                (refused, unknown host), or more than ``max_reconnects`` consecutive
                reconnects failed.
        """
        url = self._url(events_url or f"/v1/streams/{stream_id}/events")
        position = None if last_event_id is None else str(last_event_id)
        retry_ms, failures, connected = DEFAULT_RETRY_MS, 0, False
        while True:
            conn = Connection()
            try:
                query = {"snapshot": "1"} if snapshot and position is None else None
                async for frame_id, event, hint in self._one_connection(url, token, position, conn, query):
                    if hint is not None:
                        retry_ms = hint
                    if frame_id is not None:
                        position, failures = frame_id, 0
                    if event is not None:
                        yield event
                        if ends(event):
                            return
            except PublisherUnreachableError:
                if not connected:
                    raise
            except (TimeoutError, aiohttp.ClientError, ConnectionError):
                pass
            connected = connected or conn.connected
            if conn.complete:
                return
            failures += 1
            if failures > self.max_reconnects:
                raise PublisherUnreachableError(
                    f"gave up after {self.max_reconnects} failed reconnects to the publisher at {self.base_url}")
            self.reconnects += 1
            await asyncio.sleep(backoff_s(retry_ms, failures))

    async def _one_connection(
        self, url: str, token: str | None, position: str | None, conn: Connection,
        query: dict[str, str] | None = None,
    ) -> AsyncIterator[tuple[str | None, Event | StreamSnapshot | None, int | None]]:
        headers = {**self._auth(token), "Accept": "text/event-stream"}
        if position is not None:
            headers["Last-Event-ID"] = position
        async with self._request("GET", url, headers=headers, params=query) as resp:
            conn.connected = True
            if resp.status == 204:
                conn.complete = True
                return
            if resp.status != 200:
                await self._json_or_raise(resp, expect=(200,))
            parser = SSEParser()
            async for chunk in resp.content.iter_any():
                for message in parser.feed(chunk):
                    yield event_id(message.id), decode_message(message.event, message.data), message.retry_ms

    async def result(self, stream_id: str, *, token: str | None = None) -> AssembledResult:
        """Follow the stream to its end and return the assembled result.

        It asks for a snapshot (``events(..., snapshot=True)``), so a stream that is
        already long or finished costs its state, not its history. A stream written again
        as another generation meanwhile (:class:`HistoryResetError`) is assembled again
        from its start, at most :data:`MAX_RESETS` times, so the result is always one
        generation's.
        """
        for attempt in range(MAX_RESETS + 1):
            assembler = Assembler(stream_id)
            try:
                async for item in self.events(stream_id, token=token, snapshot=True):
                    if isinstance(item, StreamSnapshot):
                        assembler = assembler_from(item)
                    else:
                        assembler.apply(item)
            except HistoryResetError:
                if attempt == MAX_RESETS:
                    raise
                continue
            return assembler.result()
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def _request(self, method: str, path_or_url: str, **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request; a connection that cannot be made becomes :class:`PublisherUnreachableError`."""
        try:
            async with self.session.request(method, self._url(path_or_url), **kwargs) as resp:
                yield resp
        except aiohttp.ClientConnectorError as exc:
            raise PublisherUnreachableError(
                f"cannot connect to the publisher at {self.base_url}: {connect_reason(exc)}") from exc

    async def _json_or_raise(self, resp: aiohttp.ClientResponse, *, expect: tuple[int, ...]) -> dict[str, Any]:
        try:
            data = await resp.json(content_type=None)
        except (ValueError, aiohttp.ContentTypeError):
            data = None
        if resp.status in expect and isinstance(data, dict):
            return data
        raise refusal_error(resp.status, f"{resp.method} {resp.url.path}", data, base_url=self.base_url,
                            reason=resp.reason)
