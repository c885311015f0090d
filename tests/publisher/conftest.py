"""Fixtures: the publisher app on a real port (AppRunner + TCPSite on port 0) and an HTTP session."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from publisher.api.edge import EdgeRunner
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from schema.keys import Keys
from tests.conftest import is_cluster_url
from tests.publisher.helpers import make_settings


class Server:
    def __init__(self, app: web.Application, base_url: str) -> None:
        self.app = app
        self.base_url = base_url

    def url(self, path: str) -> str:
        return self.base_url + path


StartApp = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start_app(redis_url: str, keys: Keys, redis_client: Any) -> AsyncIterator[StartApp]:
    """Start publisher apps on free ports; each is stopped after the test, before its keys are deleted."""
    runners: list[web.AppRunner] = []

    async def start(settings: PublisherSettings | None = None, **kwargs: Any) -> Server:
        chosen = msgspec.structs.replace(settings or make_settings(), redis_cluster=is_cluster_url(redis_url))
        app = create_app(chosen, keys=keys, redis_url=redis_url, **kwargs)
        runner = EdgeRunner(app, **RUNNER_KWARGS)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        return Server(app, f"http://{host}:{port}")

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def server(start_app: StartApp) -> Server:
    """One publisher with the default test settings."""
    return await start_app()


@pytest.fixture
async def http(start_app: StartApp) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session, closed before the servers stop."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
    yield session
    await session.close()


@pytest.fixture
def sid() -> str:
    """A fresh stream id."""
    return f"st_{uuid.uuid4().hex}"



@dataclasses.dataclass(kw_only=True)
class Ctx:
    """What most publisher tests need: a default server, a session, Redis, the keys, a fresh stream id."""

    start_app: StartApp
    server: Server
    http: aiohttp.ClientSession
    redis: Any
    keys: Keys
    sid: str


@pytest.fixture
async def ctx(start_app: StartApp, server: Server, http: aiohttp.ClientSession, redis_client: Any, keys: Keys) -> Ctx:
    return Ctx(start_app=start_app, server=server, http=http, redis=redis_client, keys=keys,
               sid=f"st_{uuid.uuid4().hex}")
