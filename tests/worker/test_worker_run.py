"""The worker end to end: jobs from Redis, the fake provider over real sockets, events in Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from fanout_cli import build_parser
from schema.contract import StreamDone, StreamError, StreamStart, decode_event
from schema.keys import Keys
from schema.settings import SettingsError
from schema.validate import validate
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    pending_count,
    running_worker,
    settings_for,
    stored_events,
    stored_ids,
    strip_volatile,
    submit,
    wait_done,
    wait_for,
)
from tools.replay import TRANSCRIPT_DIRS, replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig
from worker import main as worker_main
from worker.settings import load_worker_settings

pytestmark = pytest.mark.topologies

DIRS = sorted(TRANSCRIPT_DIRS)


def _cases(directory: str) -> list[Path]:
    return sorted(path for root in DEFAULT_ROOTS for path in (root / directory).glob("*.sse"))


def _golden(path: Path) -> list[dict[str, object]]:
    """The transcript's golden events: ``<case>.events.jsonl`` when present, else the offline replay."""
    golden = path.with_suffix(".events.jsonl")
    if golden.exists():
        lines = golden.read_bytes().split(b"\n")
        return strip_volatile([e for e in (decode_event(line) for line in lines if line) if e is not None])
    events, _ = replay_file(path)
    return strip_volatile(events)


@pytest.mark.parametrize("directory", DIRS)
async def test_worker_end_to_end_each_provider(directory: str, redis_url: str, keys: Keys,
                                              redis_client: aioredis.Redis) -> None:
    provider, framing = TRANSCRIPT_DIRS[directory]
    cases = _cases(directory)
    assert cases, f"no transcripts for {directory}"
    async with fake_upstream(ServerConfig(chunk_bytes=37, delay_ms=1)) as (base, state):
        settings = settings_for(base, redis_url, keys, gemini_framing=framing, max_retries=0, concurrency=8)
        async with running_worker(settings, keys):
            jobs = {path: make_job(provider, path.stem) for path in cases}
            for job in jobs.values():
                await submit(redis_client, keys, job)
            metas = {path: await wait_done(redis_client, keys, job.stream_id) for path, job in jobs.items()}
    assert len(state.requests) == len(cases)
    for path, job in jobs.items():
        events = await stored_events(redis_client, keys, job.stream_id)
        assert strip_volatile(events) == _golden(path), path.name
        assert validate(events) == [], path.name
        first = events[0]
        assert isinstance(first, StreamStart)
        assert (first.model, first.metadata, first.stream_id) == (path.stem, {"test": True}, job.stream_id)
        assert await stored_ids(redis_client, keys, job.stream_id) == [f"0-{e.seq}" for e in events]
        assert metas[path]["status"] == events[-1].status, path.name  # type: ignore[union-attr]
        assert metas[path]["last_seq"] == str(len(events)), path.name
    assert await pending_count(redis_client, keys) == 0


async def test_worker_takes_no_more_jobs_than_its_slots(redis_url: str, keys: Keys,
                                                        redis_client: aioredis.Redis) -> None:
    async with fake_upstream(ServerConfig(chunk_bytes=512, delay_ms=1, slow_delay_ms=80)) as (base, _state):
        settings = settings_for(base, redis_url, keys, concurrency=2)
        async with running_worker(settings, keys) as worker:
            jobs = [make_job("openai_chat", "slow-simple_text_cyrillic_usage_chunk") for _ in range(4)]
            entry_ids = [await submit(redis_client, keys, job) for job in jobs]

            async def two_running() -> bool:
                return len(worker.runs) == 2

            await wait_for(two_running)
            info = await redis_client.xinfo_groups(keys.jobs_shard(0))
            assert info[0]["pending"] == 2
            # the other two were never delivered
            assert info[0]["last-delivered-id"].decode() == keys.parse_job_ref(entry_ids[1])[1]
            for job in jobs:
                await wait_done(redis_client, keys, job.stream_id)
    for job in jobs:
        last = (await stored_events(redis_client, keys, job.stream_id))[-1]
        assert isinstance(last, StreamDone)
        assert last.status == "completed"
    assert await pending_count(redis_client, keys) == 0


async def test_two_workers_share_the_group(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream(ServerConfig(chunk_bytes=256, delay_ms=1, slow_delay_ms=60)) as (base, _state):
        settings = settings_for(base, redis_url, keys, concurrency=2)
        async with running_worker(settings, keys, consumer="w-a") as a, running_worker(settings, keys,
                                                                                      consumer="w-b") as b:
            jobs = [make_job("anthropic", "slow-simple_text_ping_and_padding") for _ in range(4)]
            for job in jobs:
                await submit(redis_client, keys, job)
            for job in jobs:
                await wait_done(redis_client, keys, job.stream_id)
            assert a.consumer != b.consumer
    owners = {(await meta(redis_client, keys, job.stream_id))["owner"] for job in jobs}
    assert owners == {"w-a", "w-b"}


async def test_undecodable_job_is_acked_and_skipped(redis_url: str, keys: Keys,
                                                    redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        await redis_client.xadd(keys.jobs_shard(0), {b"j": b"{not json"})
        await redis_client.xadd(keys.jobs_shard(0), {b"other": b"field"})
        await submit(redis_client, keys, make_job("openai_chat", "m", stream_id="bad}id:{x"))
        good = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
        await submit(redis_client, keys, good)
        await wait_done(redis_client, keys, good.stream_id)

        async def none_pending() -> bool:
            return await pending_count(redis_client, keys) == 0

        await wait_for(none_pending)


async def test_finished_stream_job_is_acked_without_running(redis_url: str, keys: Keys,
                                                            redis_client: aioredis.Redis) -> None:
    job = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
    await redis_client.hset(keys.tomb(job.stream_id), mapping={"last_seq": 5, "status": "completed"})
    async with fake_upstream() as (base, state):
        async with running_worker(settings_for(base, redis_url, keys), keys):
            entry = await submit(redis_client, keys, job)

            async def none_pending() -> bool:
                info = await redis_client.xinfo_groups(keys.jobs_shard(0))
                return info[0]["last-delivered-id"].decode() == keys.parse_job_ref(entry)[1] and info[0]["pending"] == 0

            await wait_for(none_pending)
        assert state.requests == []
    assert await stored_events(redis_client, keys, job.stream_id) == []


async def test_http_error_is_stored_as_failed_stream(redis_url: str, keys: Keys,
                                                     redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state), running_worker(
            settings_for(base, redis_url, keys, max_retries=0), keys):
        job = make_job("anthropic", "status-401")
        await submit(redis_client, keys, job)
        await wait_done(redis_client, keys, job.stream_id)
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [e.seq for e in events] == [1, 2]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "authentication", False)
    assert last.error.provider_code == "authentication_error"
    await asyncio.sleep(0)


def test_settings_read_from_environment() -> None:
    settings = load_worker_settings({
        "FANOUT_IDLE_TIMEOUT_S": "1.5", "FANOUT_CONCURRENCY": "3", "REDIS_URL": "redis://r:6379/1",
        "FANOUT_METRICS_POLL_S": "0.5", "FANOUT_GEMINI_FRAMING": "json_array", "FANOUT_MAX_RETRIES": "0",
        "OPENAI_API_KEY": "sk-not-a-setting",
    })
    assert (settings.idle_timeout_s, settings.concurrency, settings.redis_url) == (1.5, 3, "redis://r:6379/1")
    assert settings.metrics_poll_s == 0.5
    assert (settings.gemini_framing, settings.max_retries) == ("json_array", 0)
    assert "sk-not-a-setting" not in repr(settings)
    assert load_worker_settings({}, concurrency=7).concurrency == 7
    assert settings.lease_renew_s == settings.lease_s / 3


@pytest.mark.parametrize(("name", "value", "shown", "why"), [
    ("FANOUT_ANTHROPIC_BASE_URL", "notaurl", "notaurl", "expected an http(s) URL with a host, e.g. https://api.anthropic.com"),
    ("FANOUT_OPENAI_BASE_URL", "api.openai.com/v1", "api.openai.com/v1", "expected an http(s) URL with a host"),
    ("FANOUT_OPENAI_BASE_URL", "ftp://mirror/v1", "ftp://mirror/v1", "expected an http(s) URL with a host"),
    ("FANOUT_GEMINI_BASE_URL", "https://", "https://", "expected an http(s) URL with a host"),
    ("FANOUT_GEMINI_BASE_URL", "http://h:70000", "http://h:70000", "Port out of range"),
    ("FANOUT_GEMINI_BASE_URL", "http://h:0", "http://h:0", "(port 0)"),
    ("FANOUT_ANTHROPIC_BASE_URL", "https://u:pw@proxy x", "https://u:***@proxy x", "expected an http(s) URL"),
], ids=["word", "no-scheme", "ftp", "no-host", "port-range", "port-0", "space-and-password"])
def test_a_provider_base_url_that_is_not_an_http_url_with_a_host_is_refused(name: str, value: str, shown: str,
                                                                             why: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_worker_settings({name: value})
    message = str(caught.value)
    assert message.startswith(f"bad configuration: {name}={shown!r}: ")
    assert why in message
    assert ":pw@" not in message


def test_provider_base_urls_with_a_host_are_accepted() -> None:
    settings = load_worker_settings({"FANOUT_OPENAI_BASE_URL": "http://127.0.0.1:8080/v1",
                                     "FANOUT_ANTHROPIC_BASE_URL": "https://u:pw@proxy.internal",
                                     "FANOUT_GEMINI_BASE_URL": "http://[::1]:65535"})
    assert settings.openai_base_url == "http://127.0.0.1:8080/v1"
    assert settings.gemini_base_url == "http://[::1]:65535"


def test_worker_command_rejects_bad_configuration(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FANOUT_IDLE_TIMEOUT_S", "-1")
    args = build_parser(["worker"]).parse_args(["worker", "--concurrency", "2"])
    assert worker_main.run(args) == 2
    assert "FANOUT_IDLE_TIMEOUT_S='-1'" in capsys.readouterr().err
    with pytest.raises(SettingsError):
        load_worker_settings({"FANOUT_CONCURRENCY": "none"})
