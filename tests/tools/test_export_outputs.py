"""``fanout export --output`` to what is not a regular file (``/dev/null``, a named pipe, a full device).

Each test runs the real ``fanout export`` against the real Redis; the outputs are real
device files and a real FIFO.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.tools.test_export import _export_cmd, finish_stream, lines, run_export
from tools.export_cli import output_failure


async def pending(redis_client: aioredis.Redis, keys: Keys, group: str = "export") -> int:
    """How many summaries ``group`` has read but not acknowledged."""
    summary = await redis_client.xpending(keys.done, group)
    return int(summary["pending"])


async def test_export_to_dev_null_acknowledges_every_finished_stream(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str,
) -> None:
    for _ in range(3):
        await finish_stream(redis_client, keys, "m", 1)
    status, err = await run_export(_export_cmd(redis_url, keys, Path("/dev/null"), "--batch", "2"))
    assert (status, "Traceback" in err) == (0, False), err
    assert "3 streams exported to /dev/null" in err
    assert await pending(redis_client, keys) == 0
    status, err = await run_export(_export_cmd(redis_url, keys, Path("/dev/null")))
    assert "0 streams exported" in err  # caught up: the group's position moved past all three


async def test_export_to_a_named_pipe_delivers_every_line(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    sids = {(await finish_stream(redis_client, keys, "m", 1))[0] for _ in range(3)}
    fifo, copy = tmp_path / "pipe", tmp_path / "copy.ndjson"
    os.mkfifo(fifo)

    def drain() -> None:
        with fifo.open("rb") as reader, copy.open("wb") as out:
            out.write(reader.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    status, err = await run_export(_export_cmd(redis_url, keys, fifo))
    reader.join(timeout=60)
    assert status == 0, err
    assert {r["stream_id"] for r in lines(copy) if r["kind"] == "summary"} == sids


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full is Linux's always-full device")
async def test_a_full_output_says_run_again_and_acknowledges_nothing(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    sids = {(await finish_stream(redis_client, keys, "m", 1))[0] for _ in range(2)}
    status, err = await run_export(_export_cmd(redis_url, keys, Path("/dev/full")))
    assert "Traceback" not in err, err
    assert status == 1
    line = err.strip().splitlines()[-1]
    assert "writing /dev/full failed: No space left on device" in line
    assert "run again once that is fixed" in line
    out = tmp_path / "export.ndjson"
    status, err = await run_export(_export_cmd(redis_url, keys, out))
    assert status == 0, err
    assert {r["stream_id"] for r in lines(out) if r["kind"] == "summary"} == sids  # the failed batch was not lost


def test_an_output_error_a_rerun_cannot_fix_does_not_say_run_again() -> None:
    message = output_failure("/some/out", OSError(errno.EINVAL, "Invalid argument"))
    assert "run again" not in message
    assert "choose another --output" in message
    assert "nothing acknowledged is lost" in message
