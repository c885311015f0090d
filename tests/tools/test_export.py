"""``fanout export``: finished streams to NDJSON / Parquet through a consumer group, on a real Redis.

Crash and restart are real: an export process killed with SIGKILL mid-way, then run again,
and an in-process sink that fails between writing and committing a batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from schema.contract import Event, StreamDone, StreamStart, Usage, encode_event
from schema.keys import Keys
from tests.conftest import is_cluster_url
from tests.publisher.helpers import StreamWriter, text_stream
from tools.export import Exporter, Row
from tools.export_cli import NdjsonSink, parse_since, repair_tail
from worker.appender import summary_fields

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("model-a", "model-b", "model-c")


def usage_done(event: Event, output_tokens: int) -> Event:
    assert isinstance(event, StreamDone)
    return StreamDone(stream_id=event.stream_id, seq=event.seq, ts=event.ts, status="completed",
                      finish_reason="stop", provider_finish_reason="stop", response_id="r",
                      model=event.model, usage=Usage(input_tokens=3, output_tokens=output_tokens))


async def finish_stream(redis: aioredis.Redis, keys: Keys, model: str, output_tokens: int, *,
                        keep_events: bool = True, summary_id: str = "*") -> tuple[str, list[Event]]:
    """Store one finished stream's events and its ``P:done`` summary, as the worker does."""
    sid = f"st_{uuid.uuid4().hex}"
    events = text_stream(sid, 2)
    events[-1] = usage_done(events[-1], output_tokens)
    if keep_events:
        writer = StreamWriter(redis, keys, sid)
        await writer.meta(model=model)
        await writer.append(*events, notify=False)
    terminal = events[-1]
    assert isinstance(terminal, StreamDone)
    fields = summary_fields(terminal, provider="openai_chat", model=model, started_ms=terminal.ts - 50,
                            first_delta_ms=terminal.ts - 40)
    await redis.xadd(keys.done, dict(zip(fields[::2], fields[1::2], strict=True)), id=summary_id)
    return sid, events


class ListSink:
    def __init__(self, fail_on_commit: int | None = None) -> None:
        self.rows: list[Row] = []
        self.committed: list[Row] = []
        self.commits = 0
        self.fail_on_commit = fail_on_commit

    def write(self, rows: list[Row]) -> None:
        self.rows += rows

    def commit(self) -> None:
        self.commits += 1
        if self.commits == self.fail_on_commit:
            raise OSError(28, "No space left on device")
        self.committed += self.rows
        self.rows = []


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


@pytest.mark.topologies
async def test_export_writes_summary_and_unchanged_events_of_every_finished_stream(
    redis_client: aioredis.Redis, keys: Keys, tmp_path: Path,
) -> None:
    stored = [await finish_stream(redis_client, keys, MODELS[i % 3], 10 + i) for i in range(5)]
    out = tmp_path / "export.ndjson"
    sink = NdjsonSink(str(out))
    assert await Exporter(redis_client, keys, sink).run() == 5
    sink.close()
    rows = lines(out)
    assert all("stream_id" in row for row in rows)
    for sid, events in stored:
        summary = [r for r in rows if r["kind"] == "summary" and r["stream_id"] == sid]
        assert len(summary) == 1
        assert summary[0]["events"] == summary[0]["events_stored"] == len(events)
        assert isinstance(summary[0]["output_tokens"], int)
        exported = [r for r in rows if r["kind"] == "event" and r["stream_id"] == sid]
        assert [r["seq"] for r in exported] == [e.seq for e in events]
        assert [json.dumps(r["event"], separators=(",", ":"), ensure_ascii=False).encode() for r in exported] == [
            encode_event(e) for e in events]
    again = NdjsonSink(str(out))
    assert await Exporter(redis_client, keys, again).run() == 0  # caught up: nothing new
    again.close()


@pytest.mark.topologies
async def test_a_batch_that_failed_before_its_commit_is_exported_by_the_next_run(
    redis_client: aioredis.Redis, keys: Keys,
) -> None:
    sids = {(await finish_stream(redis_client, keys, "m", 1))[0] for _ in range(6)}
    failing = ListSink(fail_on_commit=2)
    with pytest.raises(OSError, match="No space"):
        await Exporter(redis_client, keys, failing, batch=2).run()
    again = ListSink()
    await Exporter(redis_client, keys, again, batch=2).run()
    exported = {r["stream_id"] for r in failing.committed + again.committed if r["kind"] == "summary"}
    assert exported == sids
    # 1 summary + 6 events per stream, nothing twice: the failed batch stayed pending, then went whole
    assert len(failing.committed) + len(again.committed) == 6 * 7


@pytest.mark.topologies
async def test_a_stream_whose_events_expired_gets_an_expired_row(redis_client: aioredis.Redis, keys: Keys) -> None:
    sid, _events = await finish_stream(redis_client, keys, "m", 1, keep_events=False)
    sink = ListSink()
    await Exporter(redis_client, keys, sink).run()
    expired = [r for r in sink.committed if r["kind"] == "expired"]
    assert expired == [{"kind": "expired", "stream_id": sid, "events": 6, "events_stored": 0,
                        "detail": "the stream's events expired before the export (FANOUT_STREAM_TTL_S)"}]


async def test_a_summary_whose_stream_was_written_again_gets_a_regenerated_row_not_the_new_events(
        redis_client: aioredis.Redis, keys: Keys) -> None:
    """Redis restored from an older snapshot re-ran the job: the events stored are another generation's."""
    sid = f"st_{uuid.uuid4().hex}"
    events = text_stream(sid, 2)
    first = events[0]
    assert isinstance(first, StreamStart)
    events[0] = StreamStart(stream_id=sid, seq=1, ts=first.ts, provider=first.provider, model=first.model,
                            epoch="bbbb2222")
    writer = StreamWriter(redis_client, keys, sid, epoch=b"bbbb2222")
    await writer.meta()
    await writer.append(*events, notify=False)
    terminal = events[-1]
    assert isinstance(terminal, StreamDone)
    fields = summary_fields(terminal, provider="openai_chat", model="m", started_ms=1, first_delta_ms=2,
                            epoch="aaaa1111")  # the summary of the first generation, exported after the restore
    await redis_client.xadd(keys.done, dict(zip(fields[::2], fields[1::2], strict=True)))
    sink = ListSink()
    await Exporter(redis_client, keys, sink).run()
    assert [r["kind"] for r in sink.committed] == ["summary", "regenerated"]
    assert sink.committed[0]["epoch"] == "aaaa1111"
    assert sink.committed[1] == {
        "kind": "regenerated", "stream_id": sid, "epoch": "aaaa1111", "stored_epoch": "bbbb2222",
        "detail": "the stream was written again as another generation (Redis restored from an older snapshot?); "
                  "the events of this summary's generation are gone"}


async def test_a_summary_of_the_stored_generation_exports_its_events(redis_client: aioredis.Redis, keys: Keys) -> None:
    sid = f"st_{uuid.uuid4().hex}"
    events = text_stream(sid, 2)
    first = events[0]
    assert isinstance(first, StreamStart)
    events[0] = StreamStart(stream_id=sid, seq=1, ts=first.ts, provider=first.provider, model=first.model,
                            epoch="aaaa1111")
    writer = StreamWriter(redis_client, keys, sid, epoch=b"aaaa1111")
    await writer.meta()
    await writer.append(*events, notify=False)
    terminal = events[-1]
    assert isinstance(terminal, StreamDone)
    fields = summary_fields(terminal, provider="openai_chat", model="m", started_ms=1, first_delta_ms=2,
                            epoch="aaaa1111")
    await redis_client.xadd(keys.done, dict(zip(fields[::2], fields[1::2], strict=True)))
    sink = ListSink()
    await Exporter(redis_client, keys, sink).run()
    assert [r["kind"] for r in sink.committed] == ["summary"] + ["event"] * len(events)


async def test_since_skips_streams_that_finished_before_it(redis_client: aioredis.Redis, keys: Keys) -> None:
    await finish_stream(redis_client, keys, "m", 1, summary_id="1000-0")
    recent, _ = await finish_stream(redis_client, keys, "m", 1)
    sink = ListSink()
    await Exporter(redis_client, keys, sink, since_ms=parse_since("1h")).run()
    assert {r["stream_id"] for r in sink.committed} == {recent}


def test_parse_since_accepts_ms_iso_and_relative_times() -> None:
    assert parse_since("1764500000000") == 1764500000000
    assert parse_since("2026-12-01T00:00:00Z") == 1796083200000
    assert parse_since("2026-12-01T00:00:00") == 1796083200000
    assert parse_since("2h", now_ms=10_000_000) == 10_000_000 - 7_200_000
    with pytest.raises(ValueError, match="Invalid isoformat"):
        parse_since("yesterday")


def test_repair_tail_cuts_a_line_left_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "out.ndjson"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')
    repair_tail(path, step=4)
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n'


def _export_cmd(redis_url: str, keys: Keys, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fanout_cli", "export", "--redis-url", redis_url, "--prefix", keys.prefix,
            "--output", str(out), *extra]


def env_for(cmd: list[str]) -> dict[str, str]:
    """The environment of an export of ``cmd``'s ``--redis-url``: cluster mode for a cluster URL."""
    url = cmd[cmd.index("--redis-url") + 1]
    return {**os.environ, "FANOUT_REDIS_CLUSTER": "1" if is_cluster_url(url) else "0"}


async def run_export(cmd: list[str]) -> tuple[int, str]:
    """Run ``fanout export`` to its end; return (exit status, stderr)."""
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env_for(cmd), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.topologies
async def test_export_killed_mid_way_then_rerun_loses_nothing(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    sids = {(await finish_stream(redis_client, keys, "m", 1))[0] for _ in range(300)}
    out = tmp_path / "export.ndjson"
    cmd = _export_cmd(redis_url, keys, out, "--batch", "1")
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env_for(cmd),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    async with asyncio.timeout(60):
        while not out.exists() or out.stat().st_size < 4096:  # noqa: ASYNC110 - a file grows: no event to wait on
            await asyncio.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
    assert len({r["stream_id"] for r in lines(out) if r["kind"] == "summary"}) < len(sids)  # it died mid-way
    with out.open("ab") as file:
        file.write(b'{"kind":"summary","stream_')  # the torn last line of a crash
    status, err = await run_export(_export_cmd(redis_url, keys, out))
    assert status == 0, err
    rows = lines(out)
    assert {r["stream_id"] for r in rows if r["kind"] == "summary"} == sids
    events = {(r["stream_id"], r["seq"]) for r in rows if r["kind"] == "event"}
    assert events == {(sid, seq) for sid in sids for seq in range(1, 7)}


@pytest.mark.topologies
async def test_duckdb_sums_usage_per_model_from_the_ndjson(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is a dev dependency: make install")
    expected: dict[str, int] = {}
    for i in range(9):
        model = MODELS[i % 3]
        await finish_stream(redis_client, keys, model, 100 + i)
        expected[model] = expected.get(model, 0) + 100 + i
    out = tmp_path / "export.ndjson"
    status, err = await run_export(_export_cmd(redis_url, keys, out))
    assert status == 0, err
    query = ("SELECT model, sum(output_tokens) FROM read_json_auto(?, format='newline_delimited') "
             "WHERE kind = 'summary' GROUP BY model ORDER BY model")
    assert dict(duckdb.connect().execute(query, [str(out)]).fetchall()) == expected


async def test_parquet_export_writes_summaries_and_events(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the parquet extra: make install")
    sids = {(await finish_stream(redis_client, keys, "m", 5))[0] for _ in range(3)}
    out = tmp_path / "parquet"
    status, err = await run_export(_export_cmd(redis_url, keys, out, "--format", "parquet"))
    assert status == 0, err
    summaries = pq.read_table(out / "summaries").to_pylist()
    events = pq.read_table(out / "events").to_pylist()
    assert {s["stream_id"] for s in summaries} == sids
    assert len(events) == 3 * 6
    assert all(json.loads(e["event"])["seq"] == e["seq"] for e in events)


def test_cli_errors_are_one_line_with_the_documented_status(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fanout_cli", "export"]
    bad_since = subprocess.run([*cmd, "--since", "yesterday"], cwd=ROOT, capture_output=True, text=True,
                               check=False, timeout=60)
    assert bad_since.returncode == 2
    assert "--since 'yesterday' is not a time" in bad_since.stderr
    assert "Traceback" not in bad_since.stderr
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    down = subprocess.run([*cmd, "-o", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    assert down.returncode == 1
    assert "Redis at redis://127.0.0.1:1/0 failed" in down.stderr
    assert "Traceback" not in down.stderr


async def test_follow_waits_idle_longer_than_a_read_timeout_and_exports_what_finishes_later(
    redis_client: aioredis.Redis, keys: Keys, redis_url: str, tmp_path: Path,
) -> None:
    out = tmp_path / "follow.ndjson"
    cmd = _export_cmd(redis_url, keys, out, "--follow")
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env_for(cmd), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    await asyncio.sleep(6.5)  # idle past redis-py's default 5 s read timeout and several BLOCK rounds
    assert proc.returncode is None, "the follow export must still be running"
    sid, _events = await finish_stream(redis_client, keys, "m", 1)
    async with asyncio.timeout(30):
        while not out.exists() or sid.encode() not in out.read_bytes():  # noqa: ASYNC110 - a file grows
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(("args", "words"), [
    (["--since", "99999999999999999999999"], "--since '99999999999999999999999' is not a time"),
    (["--batch", "0"], "--batch: must be a whole number >= 1"),
    (["--group", ""], "--group must name a consumer group"),
])
def test_export_refuses_bad_arguments_with_exit_2(args: list[str], words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "export", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("env", "args", "words"), [
    ({"REDIS_URL": "foo"}, [], "REDIS_URL 'foo' is not a Redis URL"),
    ({"REDIS_URL": "http://x"}, [], "REDIS_URL 'http://x' is not a Redis URL"),
    ({}, ["--redis-url", "foo"], "--redis-url 'foo' is not a Redis URL"),
])
def test_export_refuses_a_malformed_redis_url_with_exit_2(tmp_path: Path, env: dict[str, str], args: list[str],
                                                          words: str) -> None:
    out = tmp_path / "never.ndjson"
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "export", *args, "--output", str(out)], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60, env={**os.environ, **env})
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()  # refused before any output is opened


def test_a_prefix_with_no_finished_stream_exports_nothing_and_creates_no_key(redis_url: str, tmp_path: Path) -> None:
    import redis as sync_redis

    prefix = f"nothere-{os.getpid()}-{tmp_path.name}"
    env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": prefix}
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "export", "--output", "-"], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60, env=env)
    assert done.returncode == 0
    assert f"no stream has finished under prefix {prefix!r}" in done.stderr
    assert done.stdout == ""
    with sync_redis.Redis.from_url(redis_url) as client:
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
