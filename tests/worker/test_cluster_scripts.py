"""Redis Cluster safety of every server-side script in worker/ and publisher/.

Two rules (ARCHITECTURE.md, "Scaling past one machine"; schema.keys):

1. a script names every key it touches in ``KEYS``: each key argument of each
   ``redis.call``/``redis.pcall`` is literally ``KEYS[n]`` (no key built inside the Lua,
   none taken from ``ARGV``); a command the checker does not know fails the test until
   its key positions are added to :data:`KEY_POSITIONS`;
2. every script call the code makes passes KEYS of ONE hash slot (Redis Cluster key slot:
   CRC16-XMODEM of the hash tag, or of the key, mod 16384).

Scripts are found, not listed: every module-level string holding ``redis.call`` in a
module of worker/ or publisher/; every ``register_script``/``eval``/``evalsha`` call
in those packages must name one of them, and the live run must exercise each.
"""

from __future__ import annotations

import ast
import asyncio
import binascii
import hashlib
import importlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import redis.asyncio.client
from aiohttp import web
from redis.crc import key_slot

from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from schema.contract import ErrorInfo, StreamError, StreamStart
from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    running_worker,
    settings_for,
    submit,
    wait_done,
)
from tools.upstream import ServerConfig
from worker.appender import Appender
from worker.intake import Intake
from worker.lease import Leases

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "publisher")

ALL_ARGS = "all"
KEY_POSITIONS: dict[str, str | tuple[int, ...]] = {
    **dict.fromkeys(("EXISTS", "DEL", "UNLINK", "TOUCH", "MGET"), ALL_ARGS),
    **dict.fromkeys((
        "GET", "SET", "SETNX", "SETEX", "INCR", "INCRBY", "DECR", "EXPIRE", "PEXPIRE", "TTL", "PTTL", "PERSIST",
        "HGET", "HMGET", "HSET", "HSETNX", "HDEL", "HINCRBY", "HGETALL", "HEXISTS", "HLEN",
        "XADD", "XLEN", "XRANGE", "XREVRANGE", "XTRIM", "XDEL", "XACK", "XCLAIM", "XAUTOCLAIM", "XPENDING",
        "DUMP", "RESTORE",
        # Channels are not keys, but ours are hash-tagged per stream and declared in KEYS so the
        # slot check covers them (SPUBLISH is slot-checked like a key by Redis Cluster).
        "PUBLISH", "SPUBLISH",
    ), (1,)),
}
"""1-based positions of key arguments after the command name (``all``: every argument)."""

_KEY_ARG = re.compile(r"KEYS\[\d+\]")
_CALL = re.compile(r"redis\.p?call\b")


# -- the Lua checker ----------------------------------------------------------------------------


def _split_call(lua: str, open_at: int) -> tuple[list[str], int]:
    """Split the arguments of the call whose ``(`` is at ``open_at``; return them and the end index."""
    args, depth, quote, start, i = [], 0, "", open_at + 1, open_at + 1
    while i < len(lua):
        char = lua[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                args.append(lua[start:i].strip())
                return [a for a in args if a], i
            depth -= 1
        elif char == "," and depth == 0:
            args.append(lua[start:i].strip())
            start = i + 1
        i += 1
    raise ValueError("unbalanced parentheses")


def undeclared_keys(lua: str) -> list[str]:
    """Return every problem with the key arguments of ``lua``'s Redis calls (empty: all in KEYS)."""
    problems: list[str] = []
    for match in _CALL.finditer(lua):
        rest = lua[match.end():]
        if not rest.lstrip().startswith("("):
            problems.append(f"{match.group()} used other than as a direct call")
            continue
        args, _end = _split_call(lua, match.end() + (len(rest) - len(rest.lstrip())))
        literal = re.fullmatch(r"'([A-Za-z]+)'|\"([A-Za-z]+)\"", args[0]) if args else None
        if literal is None:
            problems.append(f"command name is not a literal: {args[:1]}")
            continue
        command = (literal.group(1) or literal.group(2)).upper()
        positions = KEY_POSITIONS.get(command)
        if positions is None:
            problems.append(f"{command}: unknown command, add its key positions to KEY_POSITIONS")
            continue
        operands = args[1:]
        if positions == ALL_ARGS:
            keyed = [a for a in operands if a != "unpack(KEYS)"]
        else:
            if len(operands) < max(positions):
                problems.append(f"{command}: key argument missing")
                continue
            keyed = [operands[p - 1] for p in positions]
        problems += [f"{command}: key {a!r} is not KEYS[n]" for a in keyed if not _KEY_ARG.fullmatch(a)]
    return problems


# -- finding the scripts ------------------------------------------------------------------------


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield name, path


def discover_scripts() -> dict[str, str]:
    """Every module-level Lua string of worker/ and publisher/: ``module.NAME`` → source."""
    found: dict[str, str] = {}
    for name, path in _modules():
        if "redis.call" not in path.read_text() and "redis.pcall" not in path.read_text():
            continue
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, str) and _CALL.search(value) and not attr.startswith("__"):
                found[f"{name}.{attr}"] = value
    return found


def _script_call_sites() -> list[tuple[str, int, str]]:
    """(module, line, first argument's source) of every register_script/eval/evalsha call."""
    sites = []
    for name, path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("register_script", "eval", "evalsha", "script_load")):
                first = ast.unparse(node.args[0]) if node.args else ""
                sites.append((name, node.lineno, first))
    return sites


def sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts by their SHA-1


# -- static tests -------------------------------------------------------------------------------


def test_scripts_are_found() -> None:
    names = set(discover_scripts())
    assert {"worker.append_script.APPEND_LUA", "worker.lease.CLAIM_LUA", "worker.lease.TOUCH_LUA",
            "worker.lease.ACK_LUA", "publisher.api.submit.CREATE_META"} <= names


def test_every_script_call_site_names_a_found_script() -> None:
    scripts = discover_scripts()
    sites = _script_call_sites()
    assert sites, "no register_script/eval call found: the search is broken"
    for module, line, first in sites:
        value = getattr(importlib.import_module(module), first, None)  # defined there, or imported
        assert value in scripts.values(), f"{module}:{line} runs {first!r}, not a module-level Lua constant"


@pytest.mark.parametrize("name", sorted(discover_scripts()))
def test_script_uses_only_keys_passed_in_keys(name: str) -> None:
    assert undeclared_keys(discover_scripts()[name]) == []


@pytest.mark.parametrize(("lua", "problem"), [
    ("redis.call('HSET', 'fanout:' .. ARGV[1] .. ':meta', 'a', 1)", "HSET: key"),
    ("redis.call('XADD', ARGV[4], '*', 'k', 'v')", "XADD: key 'ARGV[4]'"),
    ("redis.call('PUBLISH', ARGV[3], 5)", "PUBLISH: key 'ARGV[3]'"),
    ("redis.call('EXISTS', KEYS[1], KEYS[1] .. ':x')", "EXISTS: key"),
    ("local k = KEYS[1]\nredis.call('GET', k)", "GET: key 'k'"),
    ("redis.pcall('SUNION', KEYS[1], KEYS[2])", "SUNION: unknown command"),
    ("local c = 'GET'\nredis.call(c, KEYS[1])", "command name is not a literal"),
    ("local f = redis.call\nf('GET', KEYS[1])", "redis.call used other than as a direct call"),
])
def test_checker_flags_keys_not_passed_in_keys(lua: str, problem: str) -> None:
    problems = undeclared_keys(lua)
    assert any(p.startswith(problem) for p in problems), problems


def test_checker_accepts_nested_arguments() -> None:
    lua = "redis.call('XADD', KEYS[1], '0-' .. (f + i - 1), 'e', ARGV[9 + i])\nredis.call('DEL', unpack(KEYS))"
    assert undeclared_keys(lua) == []


def test_key_slot_is_crc16_xmodem_of_the_hash_tag() -> None:
    assert binascii.crc_hqx(b"123456789", 0) == 0x31C3  # the CRC-16/XMODEM check value
    assert key_slot(b"123456789") == 0x31C3 % 16384
    keys = Keys("fanout")
    sid = "st_abc"
    tagged = {key_slot(k.encode()) for k in (keys.events(sid), keys.meta(sid), keys.tomb(sid), keys.live(sid),
                                              keys.cancel(sid))}
    assert tagged == {key_slot(sid.encode())}
    assert key_slot(keys.jobs_shard(0).encode()) != key_slot(keys.done.encode())


# -- the live run -------------------------------------------------------------------------------


class ScriptCalls:
    """Records the KEYS of every EVAL/EVALSHA any asyncio client sends."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[bytes, ...]]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = redis.asyncio.client.Redis.execute_command

        async def execute_command(client: Any, *args: Any, **options: Any) -> Any:
            name = str(args[0]).upper() if args else ""
            if name in ("EVAL", "EVALSHA"):
                body = args[1] if isinstance(args[1], str) else bytes(args[1]).decode()
                numkeys = int(args[2])
                keys = tuple(k if isinstance(k, bytes) else str(k).encode() for k in args[3:3 + numkeys])
                self.calls.append((body if name == "EVALSHA" else sha(body), keys))
            return await original(client, *args, **options)

        monkeypatch.setattr(redis.asyncio.client.Redis, "execute_command", execute_command)


async def _run_everything(redis_url: str, keys: Keys, client: aioredis.Redis) -> None:
    """Submit through the publisher, run the job on a worker (claim, appends, renewals), cancel, release."""
    settings = PublisherSettings(api_keys=["cluster-test-key-0123"], token_secret="s" * 48, shutdown_window_s=0.0)
    app = create_app(settings, keys=keys, redis_url=redis_url)
    runner = web.AppRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        config = ServerConfig(chunk_bytes=200, slow_delay_ms=100)  # about a second: several renewals
        async with fake_upstream(config) as (base, _state):
            worker_settings = settings_for(base, redis_url, keys, lease_s=0.3, compact_grace_s=0.0,
                                           compact_sweep_s=0.05)
            async with running_worker(worker_settings, keys), aiohttp.ClientSession() as http:
                body = {"provider": "anthropic", "model": "slow-simple_text_ping_and_padding",
                        "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}}
                headers = {"Authorization": "Bearer cluster-test-key-0123"}
                async with http.post(f"http://{host}:{port}/v1/streams", json=body, headers=headers) as resp:
                    assert resp.status == 201, await resp.text()
                    sid = (await resp.json())["stream_id"]
                meta = await wait_done(client, keys, sid)
                assert meta["status"] == "completed"
                for _ in range(100):  # the compaction script, swept right after the terminal
                    if await client.hget(keys.meta(sid), "compacted"):
                        break
                    await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()

    # Release at shutdown, with and without a token, and a renewal that finds the cancel flag.
    leases = Leases(client, keys, consumer="releaser", lease_s=30)
    job = make_job("openai_chat", "m")
    entry = await submit(client, keys, job)
    await Intake(client, keys, consumer="releaser", lease_s=30).ensure_groups()
    await client.xreadgroup(JOBS_GROUP, "releaser", {keys.jobs_shard(0): ">"}, count=10)
    claim = await leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id=entry,
                               now_ms=int(time.time() * 1000))
    writer = Appender(client, keys).writer(job.stream_id, token=claim.token, last_seq=claim.last_seq)
    await writer.append([StreamStart(stream_id=job.stream_id, seq=1, ts=1, provider="openai_chat", model="m",
                                     metadata={})])
    await client.set(keys.cancel(job.stream_id), "1")
    assert await leases.renew(entry_id=entry, stream_id=job.stream_id, token=claim.token) == "cancel"
    assert await leases.release(entry_id=entry, stream_id=job.stream_id, token=claim.token)
    assert await leases.release(entry_id=entry)

    # The salvage scripts: a terminal stored past a refusal, then a terminal status without an event.
    for foreign, stored in ((False, "event"), (True, "marked")):
        job = make_job("openai_chat", "m")
        if foreign:
            await client.xadd(keys.events(job.stream_id), {"x": "1"}, id="5-1")
        claim = await leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id="1-1",
                                   now_ms=int(time.time() * 1000))
        writer = Appender(client, keys).writer(job.stream_id, token=claim.token, last_seq=claim.last_seq)
        error = StreamError(stream_id=job.stream_id, seq=1, ts=1, status="failed", usage=None, finish_reason=None,
                            error=ErrorInfo(category="internal", retryable=False, message="storage error"))
        assert await writer.end_refused([error]) == stored

    # Redis 6.2's terminal: the same script without its flags line, past events a failover lost.
    job = make_job("openai_chat", "m")
    claim = await leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id="1-1",
                               now_ms=int(time.time() * 1000))
    appender = Appender(client, keys)
    appender.salvage.flags_supported = False
    writer = appender.writer(job.stream_id, token=claim.token, last_seq=claim.last_seq)
    await writer.append([StreamStart(stream_id=job.stream_id, seq=1, ts=1, provider="openai_chat", model="m",
                                     metadata={})])
    writer.last_seq = 3
    error = StreamError(stream_id=job.stream_id, seq=4, ts=4, status="failed", usage=None, finish_reason=None,
                        error=ErrorInfo(category="internal", retryable=True, message="storage error: lost 2..3"))
    assert await writer.end_refused([error], jump=True) == "event"


async def test_every_script_call_passes_keys_of_one_slot(redis_url: str, keys: Keys, redis_client: aioredis.Redis,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = ScriptCalls()
    recorder.install(monkeypatch)
    await asyncio.wait_for(_run_everything(redis_url, keys, redis_client), 60)

    scripts = {sha(source): name for name, source in discover_scripts().items()}
    assert recorder.calls
    unknown = {digest for digest, _keys in recorder.calls} - set(scripts)
    assert not unknown, f"script calls of no module-level Lua constant: {unknown}"
    unexercised = set(scripts.values()) - {scripts[digest] for digest, _keys in recorder.calls}
    assert not unexercised, f"scripts this run never called: {unexercised}"
    bad = {(scripts[digest], call_keys) for digest, call_keys in recorder.calls
           if len({key_slot(k) for k in call_keys}) != 1}  # none (no KEYS) counts as bad too
    assert not bad, f"script calls whose KEYS are not exactly one slot: {sorted(bad)}"

