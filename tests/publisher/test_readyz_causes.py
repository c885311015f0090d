"""``/readyz`` names the unhealthy dependency and a short cause, never an address or the server's text.

On private servers (:mod:`tests.faults.refusals`): each transient refusal, a full Redis and
a stopped one. The 503 body names ``redis``, the table's cause and its kind; the address,
the server's words and exception class names stay in the log line (``event=not_ready``)
and in ``fanout health``'s output for the operator, which gives the same cause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import aiohttp
import pytest

from schema.keys import Keys
from schema.redis_replies import FaultKind
from tests.faults.refusals import Busy, Loading, MasterDown, NoReplicas, ReadOnly, Refusal
from tests.publisher.helpers import make_settings, running_publisher
from tests.redis_servers import RedisServer, redis_node

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 15.0
CAUSES: list[tuple[Callable[[RedisServer, RedisServer], Refusal], str, str]] = [
    (lambda master, replica: NoReplicas(master, replica, "config"), "replicas missing (NOREPLICAS)",
     "Not enough good replicas"),
    (lambda master, _replica: Busy(master), "busy running a script (BUSY)", "SCRIPT KILL"),
    (lambda master, _replica: Loading(master, load_s=6.0), "loading its dataset (LOADING)", "loading the dataset"),
    (lambda master, _replica: ReadOnly(master), "read-only replica (READONLY)", "can't write against"),
    (lambda master, _replica: MasterDown(master), "replica cut off from its master (MASTERDOWN)", "Link with MASTER"),
]
"""(refusal, the cause /readyz gives, words of the server's text that must stay out of the body)."""


async def _ready(http: aiohttp.ClientSession, base: str) -> tuple[int, dict[str, object], str]:
    async with asyncio.timeout(GUARD_S), http.get(f"{base}/readyz") as resp:
        text = await resp.text()
        return resp.status, await resp.json(content_type=None), text


async def _health(server: RedisServer, prefix: str) -> tuple[int, str]:
    env = {**os.environ, "REDIS_URL": server.url, "FANOUT_REDIS_PREFIX": prefix, "FANOUT_REDIS_CLUSTER": "0"}
    env.pop("FANOUT_HEALTH_URL", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "fanout_cli.py"), "health", "--timeout-s", "2", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(process.communicate(), GUARD_S)
    return int(process.returncode or 0), err.decode()


def _assert_safe(text: str, server: RedisServer, server_words: str) -> None:
    for leak in (str(server.port), "127.0.0.1", "localhost", "redis://", "Error", server_words):
        assert leak not in text, f"/readyz body leaks {leak!r}: {text}"


async def test_readyz_names_each_refusal_without_the_servers_words(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="publisher.api.readiness")
    keys = Keys(prefix="ready-causes")
    with redis_node(extra=["--enable-debug-command", "yes"]) as master, redis_node() as replica:
        NoReplicas.attach(master, replica)
        async with running_publisher(master.url, keys, make_settings()) as base, aiohttp.ClientSession() as http:
            assert (await _ready(http, base))[0] == 200
            for make, cause, server_words in CAUSES:
                refusal = make(master, replica)
                await asyncio.to_thread(refusal.begin)
                status, body, text = await _ready(http, base)
                code, err = await _health(master, keys.prefix)
                await asyncio.to_thread(refusal.end)
                assert (status, body["detail"], body["dependency"], body["cause"], body["fault"]) == (
                    503, f"redis: {cause}", "redis", cause, "transient")
                _assert_safe(text, master, server_words)
                assert (code, f"{cause} [transient]" in err, server_words in err) == (1, True, True)
                logged = [r.getMessage() for r in caplog.records if "event=not_ready" in r.getMessage()]
                assert any(server_words in line for line in logged)
                assert (await _ready(http, base))[0] == 200


async def test_readyz_of_a_full_redis_says_it_refuses_writes() -> None:
    keys = Keys(prefix="ready-full")
    with redis_node() as server:
        async with running_publisher(server.url, keys, make_settings()) as base, aiohttp.ClientSession() as http:
            with server.client() as sync:
                sync.config_set("maxmemory-policy", "noeviction")
                sync.set("ballast", b"x" * (4 << 20))
                sync.config_set("maxmemory", str(4 << 20))
            status, body, text = await _ready(http, base)
    assert (status, body["cause"], body["fault"]) == (503, "refuses writes: out of memory (OOM)", "pressure")
    _assert_safe(text, server, "maxmemory")


async def test_readyz_of_a_stopped_redis_says_unreachable_and_logs_where(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="publisher.api.readiness")
    keys = Keys(prefix="ready-down")
    with redis_node() as server:
        async with running_publisher(server.url, keys, make_settings()) as base, aiohttp.ClientSession() as http:
            assert (await _ready(http, base))[0] == 200
            await asyncio.to_thread(server.stop)
            status, body, text = await _ready(http, base)
            code, err = await _health(server, keys.prefix)
    assert (status, body["detail"], body["fault"]) == (503, "redis: unreachable", "transient")
    _assert_safe(text, server, "refused")
    assert code == 1
    assert f"redis at {server.url}: unreachable [transient]" in err  # the operator's tool names where
    assert any(str(server.port) in r.getMessage() for r in caplog.records if "event=not_ready" in r.getMessage())


def test_openapi_documents_the_members_of_the_readyz_problem() -> None:
    doc = json.loads((ROOT / "openapi.json").read_text())
    members = doc["components"]["schemas"]["Problem"]["properties"]
    assert {"dependency", "cause", "fault"} <= set(members)
    assert set(members["fault"]["enum"]) == set(get_args(FaultKind))
    assert "`dependency`, `cause` and `fault`" in doc["paths"]["/readyz"]["get"]["responses"]["503"]["description"]
