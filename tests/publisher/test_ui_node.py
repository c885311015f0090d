"""``/ui`` checked by the real AI SDK: Node's test runner reads every golden transcript through ``ai``.

The publisher runs here on a real port and a real Redis; each golden transcript's events
are stored as a worker stores them; ``tests/node/ui_stream.test.mjs`` (``node --test``)
reads them through the SDK's ``DefaultChatTransport`` and ``readUIMessageStream`` and
compares the final message with the reducer's assembled result written to a manifest.
The ``ai`` package is installed from npm at the version pinned in ``tests/node``
(``npm ci``, lockfile); without ``node``/``npm`` the test is skipped and says so.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schema.contract import Event
from schema.reducer import ReasoningBlock, ToolCallBlock, reduce
from tests.publisher.conftest import StartApp
from tests.publisher.helpers import StreamWriter, block_start, delta, done, start, stop, token_for
from tests.publisher.node_support import (
    GOLDENS,
    control_server,
    golden_events,
    node_or_skip,
    run_suite,
    store_stream,
    unique_call_id,
)


@pytest.fixture(scope="module")
def node_ready() -> str:
    """Path of ``node`` once ``tests/node/node_modules`` holds the pinned packages; skip without Node."""
    return node_or_skip()


def expected_view(events: list[Event]) -> dict[str, Any]:
    """The reducer's result in the compact shape the Node side derives from the UIMessage parts."""
    result = reduce(events)
    parts: list[dict[str, Any]] = []
    used: set[str] = set()
    for block in result.blocks:
        if isinstance(block, ToolCallBlock):
            usable = result.status == "completed" and block.arguments is not None
            call_id = unique_call_id(block.call_id, block.index, used)
            part: dict[str, Any] = {"type": "tool", "toolCallId": call_id, "toolName": block.name, "usable": usable}
            if call_id != block.call_id:
                part["providerCallId"] = block.call_id
            if usable:
                part["input"] = block.arguments
            parts.append(part)
        else:
            parts.append({"type": "reasoning" if isinstance(block, ReasoningBlock) else "text", "text": block.text})
    return {"status": result.status, "parts": parts}


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
    control = await control_server(writer, rest)
    resume = {"stream_id": sid, "token": token_for(sid), "continue_url": control[1],
              "expected": expected_view(first + rest)}

    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(msgspec.json.encode({"base_url": server.base_url, "streams": streams, "resume": resume}))
    try:
        text = await run_suite(node_ready, "ui_stream.test.mjs", {"FANOUT_UI_MANIFEST": str(manifest)})
    finally:
        await control[0].cleanup()
    assert f"\u2139 pass {len(GOLDENS) + 4}\n" in text, text[-3000:]  # every golden, its parent test and three more
