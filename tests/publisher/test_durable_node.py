"""``/durable`` checked by the real Durable Streams client and the protocol's own conformance suite.

The publisher runs on a real port and a real Redis; every golden transcript's events are
stored as a worker stores them. ``tests/node_durable/durable.test.mjs`` (``node --test``)
reads each with ``@durable-streams/client`` by catch-up reads, and live by long-poll and by
SSE (only ``stream.start`` is stored first; the rest is appended when the reader asks, so it
can only come by the live mode), resumes long-poll and SSE reads after a cut, and checks the
answers for an unknown stream, a malformed offset and offsets no longer retained.

The read-only tests of ``@durable-streams/server-conformance-tests`` (:data:`CONFORMANCE_READ_ONLY`)
run against the same publisher through a proxy that maps the suite's stream URLs
(``/v1/stream/<name>``) to fanout's (``/v1/streams/<name>/durable``) and adds an API key:
the protocol leaves both URL layout and authentication to the server. Every other test of
the suite creates or appends to a stream first (``PUT``/``POST``), which fanout refuses.

Packages are installed from npm at the versions pinned in ``tests/node_durable`` (``npm ci``,
lockfile); without ``node``/``npm`` the tests are skipped and say so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from publisher.wire.durable import format_offset
from schema.contract import Event, encode_event
from tests.publisher.conftest import Server, StartApp
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    block_start,
    delta,
    done,
    make_settings,
    start,
    stop,
    token_for,
)
from tests.publisher.test_ui_node import GOLDENS, golden_events

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node_durable"
NODE_GUARD_S = 600.0
"""Hang guard of a whole Node run (npm ci excluded); never a performance limit."""
EPOCH = b"a1b2c3d4e5"
READ_PAGE = 4
"""The publisher's page size here, so long goldens take several catch-up chunks."""
CONFORMANCE_READ_ONLY = (
    "Browser Security Headers should include security headers on error responses",
    "HEAD Metadata should return 404 for non-existent stream",
    "Offset Validation and Resumability should return 404 for offset=now on non-existent stream",
    "Offset Validation and Resumability should return 404 for offset=now with long-poll on non-existent stream",
    "Offset Validation and Resumability should return 404 for offset=now with SSE on non-existent stream",
    "Caching and ETag should allow If-None-Match in CORS preflight responses",
)
"""Every test of server-conformance-tests 0.3.6 that writes nothing (found by reading its source)."""
HTTP: web.AppKey[aiohttp.ClientSession] = web.AppKey("http", aiohttp.ClientSession)


@pytest.fixture(scope="module")
def node_ready() -> Iterator[str]:
    """Path of ``node`` once ``tests/node_durable/node_modules`` holds the pinned packages; skip without Node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the Durable Streams client check needs them")
    if not (NODE_DIR / "node_modules" / "@durable-streams" / "client" / "package.json").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=NODE_GUARD_S)
    return node


def as_json(events: list[Event]) -> list[Any]:
    return [json.loads(encode_event(event)) for event in events]


class Streams:
    """Streams stored for the Node side, and the events each is still owed (appended on ``POST /continue``)."""

    def __init__(self, redis: Any, keys: Any) -> None:
        self.redis, self.keys = redis, keys
        self.owed: dict[str, tuple[StreamWriter, list[Event]]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def store(self, events: list[Event], stored: int | None = None) -> dict[str, Any]:
        """Store the first ``stored`` events (all by default); the rest is owed."""
        sid = events[0].stream_id
        writer = StreamWriter(self.redis, self.keys, sid, epoch=EPOCH)
        await writer.meta(provider=getattr(events[0], "provider", "openai_chat"))
        cut = len(events) if stored is None else stored
        await writer.append(*events[:cut], notify=cut < len(events))
        if cut < len(events):
            self.owed[sid] = (writer, events[cut:])
        return {"stream_id": sid, "token": token_for(sid), "expected": as_json(events)}

    async def go_on(self, request: web.Request) -> web.Response:
        writer, rest = self.owed.pop(request.query["stream"])

        async def append_slowly() -> None:
            for event in rest:
                await asyncio.sleep(0.005)
                await writer.append(event)

        self.tasks.append(asyncio.create_task(append_slowly()))
        return web.Response(status=204)


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def manifest_for(server: Server, streams: Streams, continue_url: str) -> dict[str, Any]:
    catch_up, live = [], []
    for path in GOLDENS:
        name = f"{path.parent.name}/{path.name.removesuffix('.events.jsonl')}"
        catch_up.append({"name": name, **await streams.store(golden_events(path, f"st_{uuid.uuid4().hex}"))})
        for mode in ("long-poll", "sse"):
            events = golden_events(path, f"st_{uuid.uuid4().hex}")
            live.append({"name": name, "mode": mode, **await streams.store(events, stored=1)})
    resume = []
    for mode in ("long-poll", "sse"):
        sid = f"st_{uuid.uuid4().hex}"
        events = [start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hello, "), delta(sid, 4, 0, "wor"),
                  delta(sid, 5, 0, "ld"), stop(sid, 6, 0), done(sid, 7)]
        resume.append({"mode": mode, **await streams.store(events, stored=3)})
    expired = f"st_{uuid.uuid4().hex}"
    await StreamWriter(streams.redis, streams.keys, expired).expire(7)
    reset_sid = f"st_{uuid.uuid4().hex}"
    reset = await streams.store([start(reset_sid), block_start(reset_sid, 2, 0)])
    errors = {"unknown": {"stream_id": f"st_{uuid.uuid4().hex}", "token": ""},
              "expired": {"stream_id": expired, "token": token_for(expired), "offset": "-1"},
              "reset": {**reset, "offset": format_offset(1, "otherepoch")}}
    errors["unknown"]["token"] = token_for(errors["unknown"]["stream_id"])
    return {"base_url": server.base_url, "continue_url": continue_url, "catch_up": catch_up, "live": live,
            "resume": resume, "errors": errors}


async def run_node(node: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        node, *args, cwd=NODE_DIR, env={"PATH": str(Path(node).parent), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(proc.communicate(), NODE_GUARD_S)
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


async def test_the_durable_streams_client_reads_every_golden_in_every_mode_and_resumes(
    node_ready: str, start_app: StartApp, redis_client: Any, keys: Any, tmp_path: Path,
) -> None:
    server = await start_app(make_settings(read_page=READ_PAGE, cors_origins=["*"]))
    streams = Streams(redis_client, keys)
    control = web.Application()
    control.router.add_post("/continue", streams.go_on)
    runner, control_url = await serve(control)
    try:
        manifest = tmp_path / "manifest.json"
        manifest.write_bytes(msgspec.json.encode(await manifest_for(server, streams, f"{control_url}/continue")))
        code, text = await run_node(node_ready, ["--test", "--test-reporter=spec", "durable.test.mjs"],
                                    {"FANOUT_DURABLE_MANIFEST": str(manifest)})
    finally:
        await runner.cleanup()
    assert code == 0, text[-6000:]
    assert f"\u2139 pass {3 * len(GOLDENS) + 9}\n" in text, text[-3000:]  # 3 per golden, 3 parents, 6 more
    assert "\u2139 fail 0\n" in text, text[-3000:]
    assert not streams.owed  # every live read asked for the rest of its stream


def conformance_proxy(target: str) -> web.Application:
    """Map ``/v1/stream/<name>`` to ``<target>/v1/streams/<name>/durable``, adding the API key."""

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        if request.method != "OPTIONS":
            headers["Authorization"] = f"Bearer {API_KEY}"
        url = f"{target}/v1/streams/{request.match_info['name']}/durable"
        async with request.app[HTTP].request(request.method, url, params=request.query, headers=headers,
                                               data=await request.read(), allow_redirects=False) as upstream:
            hop = {"transfer-encoding", "content-length", "connection", "content-encoding"}
            response = web.StreamResponse(status=upstream.status,
                                          headers={k: v for k, v in upstream.headers.items() if k.lower() not in hop})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session(app: web.Application) -> Any:
        app[HTTP] = aiohttp.ClientSession()
        yield
        await app[HTTP].close()

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/v1/stream/{name}", forward)
    return app


async def test_the_read_only_tests_of_the_conformance_suite_pass(node_ready: str, start_app: StartApp) -> None:
    server = await start_app(make_settings(cors_origins=["*"]))
    runner, proxy_url = await serve(conformance_proxy(server.base_url))
    pattern = "^(" + "|".join(name.replace("(", r"\(").replace(")", r"\)") for name in CONFORMANCE_READ_ONLY) + ")$"
    try:
        code, text = await run_node(node_ready, [
            "node_modules/vitest/vitest.mjs", "run", "--config", "conformance.config.mjs", "--reporter=verbose",
            "--testNamePattern", pattern], {"CONFORMANCE_TEST_URL": proxy_url, "NO_COLOR": "1"})
    finally:
        await runner.cleanup()
    assert code == 0, text[-6000:]
    assert f"Tests  {len(CONFORMANCE_READ_ONLY)} passed" in text, text[-3000:]
