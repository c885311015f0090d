"""``fanout export`` says why a second run with the same group exports nothing."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from schema.keys import Keys
from tests.tools.test_export import _export_cmd, finish_stream, run_export


async def test_a_second_run_says_the_group_already_delivered_everything(redis_url: str, redis_client: aioredis.Redis,
                                                                          keys: Keys, tmp_path: Path) -> None:
    for model in ("model-a", "model-b"):
        await finish_stream(redis_client, keys, model, 5)
    out = tmp_path / "streams.ndjson"
    code, first = await run_export(_export_cmd(redis_url, keys, out))
    assert code == 0, first
    assert "2 streams exported" in first
    assert "already delivered" not in first
    code, second = await run_export(_export_cmd(redis_url, keys, out))
    assert code == 0, second
    assert "0 streams exported" in second
    assert "consumer group 'export' has already delivered all 2 finished streams" in second
    assert "--group export-2" in second
    code, again = await run_export(_export_cmd(redis_url, keys, tmp_path / "again.ndjson", "--group", "export-2"))
    assert code == 0, again
    assert "2 streams exported" in again


async def test_an_empty_finished_stream_says_nothing_finished_yet(redis_url: str, redis_client: aioredis.Redis,
                                                                  keys: Keys, tmp_path: Path) -> None:
    await redis_client.xgroup_create(keys.done, "other", id="0", mkstream=True)  # P:done exists, empty
    code, said = await run_export(_export_cmd(redis_url, keys, tmp_path / "out.ndjson"))
    assert code == 0, said
    assert "no stream has finished yet" in said
    assert "already delivered" not in said
