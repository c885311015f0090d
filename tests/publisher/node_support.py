"""What the real-client suites share: ``node`` and pinned packages, golden streams in Redis, a control endpoint.

The suites in ``tests/node`` (``node --test``) read a publisher started by pytest on a
real port and a real Redis; the packages are installed from npm at the versions pinned
in ``tests/node/package.json`` with its lockfile (``npm ci``). Without ``node``/``npm``
the suites are skipped and say so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from schema.contract import Event, decode_event
from tests.publisher.helpers import StreamWriter

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
GOLDENS = sorted((ROOT / "transcripts").glob("*/*.events.jsonl"))
NODE_GUARD_S = 300.0
"""Hang guard of one Node run or install; never a performance limit."""


def installed(node_dir: Path = NODE_DIR) -> bool:
    """True when every dependency pinned in ``package.json`` is in ``node_modules``."""
    dependencies = json.loads((node_dir / "package.json").read_text())["dependencies"]
    return all((node_dir / "node_modules" / name / "package.json").exists() for name in dependencies)


def node_or_skip() -> str:
    """Path of ``node`` once ``tests/node/node_modules`` holds the pinned packages (``npm ci``).

    Calls ``pytest.skip`` (raises) when ``node`` or ``npm`` is not installed.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the real-client checks need them (apt-get install nodejs npm)")
    if not installed():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=NODE_GUARD_S)
    return node


def unique_call_id(call_id: str, index: int, used: set[str]) -> str:
    """The tool call id a client sees: the provider's when not yet used, else ``<id>~<index>`` (docs/agui.md)."""
    chosen = call_id if call_id and call_id not in used else f"{call_id or 'call'}~{index}"
    used.add(chosen)
    return chosen


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
    """Store ``events`` as a worker does (meta, then every entry, no notification)."""
    writer = StreamWriter(redis, keys, events[0].stream_id)
    await writer.meta(provider=getattr(events[0], "provider", "openai_chat"))
    await writer.append(*events, notify=False)


async def run_suite(node: str, suite: str, env: dict[str, str]) -> str:
    """Run one ``tests/node`` suite under ``node --test``; return its spec-reporter output (asserted to pass)."""
    proc = await asyncio.create_subprocess_exec(
        node, "--test", "--test-reporter=spec", str(NODE_DIR / suite), cwd=NODE_DIR,
        env={**env, "PATH": str(Path(node).parent)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), NODE_GUARD_S)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    assert "\u2139 fail 0\n" in text, text[-3000:]
    return text


async def control_server(writer: StreamWriter, rest: list[Event]) -> tuple[web.AppRunner, str]:
    """A tiny HTTP endpoint a Node suite calls after it dropped its connection: append ``rest``, paced."""
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

