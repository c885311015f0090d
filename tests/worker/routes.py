"""Helpers of the fallback tests: fake endpoints, an upstreams file over them, a worker that routes by it.

Each endpoint is its own fake provider (:func:`tests.worker.support.fake_upstream`) on a real
socket; a route's ``upstream_model`` picks what each one answers (a recorded case, or one of
the fake's failure models: ``status-<code>``, ``hang``, ``pings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator, Mapping

from infra.redis_client import RedisClient, RedisOptions, connect
from schema.contract import Event
from schema.keys import Keys
from schema.upstreams import Upstreams
from schema.upstreams_file import parse_upstreams
from tests.worker.support import GUARD_S, fake_upstream, make_job, stored_events, submit, wait_done
from tools.upstream import ServerConfig, ServerState
from worker.runner import Worker
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import Credentials, new_session

OK = "simple_text"
"""A recorded Anthropic answer that completes (its provider model: :data:`OK_MODEL`)."""
OK_MODEL = "claude-sonnet-4-5-20250929"
IN_STREAM = "vertex_claude_overloaded_before_content"
"""200, ``message_start``, ``ping``, then ``overloaded_error`` before any content."""
AFTER_CONTENT = "error_after_partial_text"
"""Text deltas, then a retryable ``api_error``: the stream ends there."""
ROUTE = "team-model"
"""The public model name of the test route."""


def closed_port_url() -> str:
    """Return an http URL on 127.0.0.1 whose port refuses connections (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def unaccepting_url() -> Iterator[str]:
    """Yield an http URL on 127.0.0.1 whose TCP connects hang: a listener whose accept queue is full.

    Linux drops the SYN of a connection to a listener whose backlog is full, so the client's
    connect waits (its connect timeout decides) instead of being refused.
    """
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        held = [socket.socket() for _ in range(4)]
        try:
            for sock in held:
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.connect(listener.getsockname())
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            for sock in held:
                sock.close()


def upstreams_toml(urls: Mapping[str, str], models: Mapping[str, str], *,
                   endpoint_keys: Mapping[str, str] | None = None, route_keys: str = "") -> str:
    """Return an upstreams file: one Anthropic endpoint per ``urls`` entry, one route over them in that order.

    Args:
        urls: Endpoint name → its fake's base URL.
        models: Endpoint name → the upstream model it is sent (what its fake answers).
        endpoint_keys: Endpoint name → extra TOML lines of its table.
        route_keys: Extra TOML lines of the route's table.
    """
    lines = []
    for name, url in urls.items():
        lines += [f"[endpoints.{name}]", 'api = "anthropic"', f'url = "{url}"', 'auth = "none"',
                  (endpoint_keys or {}).get(name, ""), ""]
    names = ", ".join(f'"{name}"' for name in urls)
    upstream = ", ".join(f'{name} = "{model}"' for name, model in models.items())
    lines += [f'[models."{ROUTE}"]', f"endpoints = [{names}]", f"upstream_model = {{ {upstream} }}", route_keys]
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def fakes(*names: str, config: ServerConfig | None = None) -> AsyncIterator[dict[str, tuple[str, ServerState]]]:
    """Serve one fake provider per name; yield name → (base URL, its state)."""
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(fake_upstream(config or ServerConfig(delay_ms=1)))
               for name in names}


@contextlib.asynccontextmanager
async def routing_worker(settings: WorkerSettings, keys: Keys, toml: str, *, telemetry: Telemetry | None = None,
                         credentials: Credentials | None = None) -> AsyncIterator[Worker]:
    """Run a worker in this event loop that routes jobs by the upstreams file ``toml``, until the block ends."""
    upstreams: Upstreams = parse_upstreams(toml, "test-upstreams.toml")
    client = connect(settings.redis_url, RedisOptions(cluster=settings.redis_cluster))
    session = new_session(settings)
    worker = Worker.create(client, keys, settings, session=session, telemetry=telemetry, upstreams=upstreams,
                           credentials=credentials)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.ready.wait(), GUARD_S)
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, GUARD_S + settings.drain_s)
        await session.close()
        await client.aclose()


async def run_route_job(redis: RedisClient, keys: Keys, model: str = ROUTE, endpoint: str = "") -> list[Event]:
    """Submit an Anthropic job for ``model`` (the route) or ``endpoint``, wait for its end; return its stored events."""
    job = make_job("anthropic", model, endpoint=endpoint)
    await submit(redis, keys, job)
    await wait_done(redis, keys, job.stream_id)
    return await stored_events(redis, keys, job.stream_id)


def models_sent(state: ServerState) -> list[str]:
    """The ``model`` of every request a fake received, in order."""
    return [request["body"]["model"] for request in state.requests]
