"""``/ui`` checked by the real AI SDK: Node's test runner reads every golden transcript through ``ai``.

The publisher runs here on a real port and a real Redis; each golden transcript's events
are stored as a worker stores them; ``tests/node/ui_stream.test.mjs`` (``node --test``)
reads them through the SDK's ``DefaultChatTransport`` and ``readUIMessageStream`` and
compares the final message with the reducer's assembled result written to a manifest.
The ``ai`` package is installed from npm at the version pinned in ``tests/node``
(``npm ci``, lockfile); without ``node``/``npm`` the test is skipped and says so.
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

import msgspec
import pytest
from aiohttp import web

from schema.contract import Event, decode_event
from schema.reducer import ReasoningBlock, ToolCallBlock, reduce
from tests.publisher.conftest import StartApp
from tests.publisher.helpers import StreamWriter, block_start, delta, done, start, stop, token_for

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
GOLDENS = sorted((ROOT / "transcripts").glob("*/*.events.jsonl"))
NODE_GUARD_S = 300.0
"""Hang guard of the whole Node run (npm ci excluded); never a performance limit."""


@pytest.fixture(scope="module")
def node_ready() -> Iterator[str]:
    """Path of ``node`` once ``tests/node/node_modules`` holds the pinned ``ai``; skip without Node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the AI SDK check needs them (apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "ai" / "package.json").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=NODE_GUARD_S)
    return node


def expected_view(events: list[Event]) -> dict[str, Any]:
    """The reducer's result in the compact shape the Node side derives from the UIMessage parts."""
    result = reduce(events)
    parts: list[dict[str, Any]] = []
    for block in result.blocks:
        if isinstance(block, ToolCallBlock):
            usable = result.status == "completed" and block.arguments is not None
            part: dict[str, Any] = {"type": "tool", "toolCallId": block.call_id, "toolName": block.name,
                                    "usable": usable}
            if usable:
                part["input"] = block.arguments
            parts.append(part)
        else:
            parts.append({"type": "reasoning" if isinstance(block, ReasoningBlock) else "text", "text": block.text})
    return {"status": result.status, "parts": parts}


def golden_events(path: Path, stream_id: str) -> list[Event]:
    """The golden's events with their stream id replaced by ``stream_id``."""
    events = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        item = json.loads(line)
        item["stream_id"] = stream_id
        event = decode_event(json.dumps(item))
        assert event is not None
        events.append(event)
    return events


async def store_stream(redis: Any, keys: Any, events: list[Event]) -> None:
    writer = StreamWriter(redis, keys, events[0].stream_id)
    await writer.meta(provider=getattr(events[0], "provider", "openai_chat"))
    await writer.append(*events, notify=False)


async def test_ai_sdk_reads_every_golden_and_resumes_a_dropped_stream(
    node_ready: str, start_app: StartApp, redis_client: Any, keys: Any, tmp_path: Path,
) -> None:
    server = await start_app()
    streams = []
    for path in GOLDENS:
        stream_id = f"st_{uuid.uuid4().hex}"
        events = golden_events(path, stream_id)
        await store_stream(redis_client, keys, events)
        streams.append({"name": f"{path.parent.name}/{path.name.removesuffix('.events.jsonl')}",
                        "stream_id": stream_id, "token": token_for(stream_id), "expected": expected_view(events)})

    sid = f"st_{uuid.uuid4().hex}"
    first = [start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hello, "), delta(sid, 4, 0, "wor")]
    rest = [delta(sid, 5, 0, "ld"), stop(sid, 6, 0), done(sid, 7)]
    writer = StreamWriter(redis_client, keys, sid)
    await writer.meta()
    await writer.append(*first)
    control = await _control_server(writer, rest)
    resume = {"stream_id": sid, "token": token_for(sid), "continue_url": control[1],
              "expected": expected_view(first + rest)}

    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(msgspec.json.encode({"base_url": server.base_url, "streams": streams, "resume": resume}))
    try:
        proc = await asyncio.create_subprocess_exec(
            node_ready, "--test", "--test-reporter=spec", str(NODE_DIR / "ui_stream.test.mjs"),
            cwd=NODE_DIR, env={"FANOUT_UI_MANIFEST": str(manifest), "PATH": str(Path(node_ready).parent)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), NODE_GUARD_S)
    finally:
        await control[0].cleanup()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    assert f"\u2139 pass {len(GOLDENS) + 3}\n" in text, text[-3000:]  # every golden, its parent test and two more
    assert "\u2139 fail 0\n" in text, text[-3000:]


async def _control_server(writer: StreamWriter, rest: list[Event]) -> tuple[web.AppRunner, str]:
    """A tiny HTTP endpoint the Node test calls after it dropped its connection: append the rest."""

    tasks: list[asyncio.Task[None]] = []

    async def go_on(_request: web.Request) -> web.Response:
        async def append_slowly() -> None:
            for event in rest:
                await asyncio.sleep(0.05)
                await writer.append(event)

        tasks.append(asyncio.create_task(append_slowly()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/continue", go_on)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}/continue"
