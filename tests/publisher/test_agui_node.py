"""``/agui`` checked by the real AG-UI client: an ``HttpAgent`` reads every golden, resumed and as a snapshot.

The publisher runs here on a real port and a real Redis; each golden transcript's events
are stored as a worker stores them; ``tests/node/agui_stream.test.mjs`` (``node --test``)
reads them with ``@ag-ui/client``'s ``HttpAgent`` (a GET, by overriding ``requestInit``),
whose run checks every event with the package's ``verifyEvents`` and its schemas and
assembles them with ``defaultApplyEvents``; the agent's messages, the tool calls it saw
end and the run's outcome must equal what the reducer's assembled result says (the
manifest's ``expected``), read whole, cut and resumed, and with ``?snapshot=1`` (every golden,
and a running stream whose tool call is half written). ``@ag-ui/core``/``@ag-ui/client`` are installed from npm at
the versions pinned in ``tests/node`` (``npm ci``, lockfile); without ``node``/``npm``
the test is skipped and says so.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from schema.contract import BlockRef, BlockStart, Event, ToolInfo
from tests.publisher.agui_support import expected_view
from tests.publisher.conftest import StartApp
from tests.publisher.helpers import StreamWriter, block_start, delta, done, start, stop, token_for
from tests.publisher.node_support import (
    GOLDENS,
    control_server,
    golden_events,
    node_or_skip,
    run_suite,
    store_stream,
)


@pytest.fixture(scope="module")
def node_ready() -> str:
    """Path of ``node`` once ``tests/node/node_modules`` holds the pinned packages; skip without Node."""
    return node_or_skip()


async def test_agui_client_reads_every_golden_and_resumes_a_dropped_stream(
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
    writer = StreamWriter(redis_client, keys, sid, epoch=b"e1")
    await writer.meta()
    await writer.append(*first)
    control = await control_server(writer, rest)
    resume = {"stream_id": sid, "token": token_for(sid), "continue_url": control[1],
              "expected": expected_view(first + rest)}

    call_sid, text_sid = f"st_{uuid.uuid4().hex}", f"st_{uuid.uuid4().hex}"
    call = BlockStart(stream_id=call_sid, seq=5, ts=1, block=BlockRef(id="b1", index=1, kind="tool_call"),
                      tool=ToolInfo(call_id="call_1", name="weather"))
    with_call = await running(redis_client, keys, [  # the text closed, the tool call half written
        start(call_sid), block_start(call_sid, 2, 0), delta(call_sid, 3, 0, "Let me check."), stop(call_sid, 4, 0),
        call, delta(call_sid, 6, 1, '{"city":', "tool_call")],
        [delta(call_sid, 7, 1, ' "Paris"}', "tool_call"), stop(call_sid, 8, 1, "tool_call"), done(call_sid, 9)])
    with_text = await running(redis_client, keys, [  # the text open
        start(text_sid), block_start(text_sid, 2, 0), delta(text_sid, 3, 0, "Hel")],
        [delta(text_sid, 4, 0, "lo"), stop(text_sid, 5, 0), done(text_sid, 6)])
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(msgspec.json.encode({"base_url": server.base_url, "streams": streams, "resume": resume,
                                              "snapshot": with_call[0], "snapshot_text": with_text[0]}))
    try:
        text = await run_suite(node_ready, "agui_stream.test.mjs", {"FANOUT_AGUI_MANIFEST": str(manifest)})
    finally:
        for runner in (control[0], with_call[1], with_text[1]):
            await runner.cleanup()
    # every golden three times (read whole; cut and resumed; snapshot=1), their three parent tests and six more
    assert f"\u2139 pass {3 * len(GOLDENS) + 9}\n" in text, text[-3000:]


async def running(redis_client: Any, keys: Any, first: list[Event],
                  rest: list[Event]) -> tuple[dict[str, Any], web.AppRunner]:
    """Store ``first`` of a running stream; return its manifest entry and the endpoint that writes ``rest``."""
    sid = first[0].stream_id
    writer = StreamWriter(redis_client, keys, sid, epoch=b"e1")
    await writer.meta()
    await writer.append(*first)
    runner, url = await control_server(writer, rest)
    return {"stream_id": sid, "token": token_for(sid), "continue_url": url,
            "expected": expected_view(first + rest)}, runner
