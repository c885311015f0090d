"""The failover scenario shared by tests/worker/test_failover.py and bench/failover_bench.py.

A private 3-master, 3-replica Redis Cluster (:func:`tests.redis_servers.redis_cluster`), a
fake provider streaming slowly, one worker and one publisher on the cluster, and one SSE
reader per stream (the Python client, resuming with ``Last-Event-ID``). Once every
stream is running, the master holding most of them is SIGKILLed; its replica is promoted
(``cluster-node-timeout`` 2 s). Then every stream is classified by what Redis holds at
the end, and every reader's view is checked against it.

What counts (:class:`Figures`):

* ``whole``: the stored stream is the provider's transcript, seq 1..n, ``completed``;
* ``explicit_error``: it ends with a ``stream.error`` (or, when storage refused even that,
  meta ``state=done`` with a status);
* ``unfinished``: neither (meta not ``done``): a stream nobody will ever end;
* ``silent_gaps``: readers that ended (terminal event or 204) without holding every seq up
  to the end and without a 410 / ``stream.gap``, or that hold an event that differs from
  the stored one at its seq (and not inside a range meta records as lost).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

import msgspec
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from fanout_client import FanoutClient, StreamUnavailableError
from infra.redis_client import RedisClient, RedisOptions, connect
from schema.contract import Event, StreamDone, StreamError
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, make_settings, running_publisher
from tests.redis_servers import RedisClusterServers, redis_cluster
from tests.worker.support import fake_upstream, meta, running_worker, settings_for, stored_events, strip_volatile
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig

CASE = "several_blocks_thinking_text_two_tools"
GOLDEN, _ = replay_file(DEFAULT_ROOTS[0] / "anthropic" / f"{CASE}.sse")
SLOW = ServerConfig(chunk_bytes=64, slow_delay_ms=100)
GUARD_S = 90.0
"""Hang guard of the whole scenario after the kill."""


class Figures(msgspec.Struct, kw_only=True):
    """The outcome of one failover run."""

    streams: int
    whole: int = 0
    explicit_error: int = 0
    unfinished: int = 0
    silent_gaps: int = 0
    readers_with_410_or_gap: int = 0
    reader_events_lost_by_storage: int = 0
    """Events a reader got live that the promoted replica never received (meta ``lost_from..lost_to``)."""
    killed_port: int = 0
    streams_on_killed_master: int = 0
    promoted_after_s: float = 0.0
    errors: list[str] = msgspec.field(default_factory=list)
    """``category: message`` of each explicit error."""


class ReaderView(msgspec.Struct, kw_only=True):
    """What one SSE reader received across its reconnects."""

    got: dict[int, dict[str, Any]] = msgspec.field(default_factory=dict)
    signalled: bool = False
    """It got a 410 (after a ``stream.gap`` or at a reconnect)."""
    ended: str = ""


async def _follow(client: FanoutClient, sid: str, token: str) -> ReaderView:
    view = ReaderView()
    try:
        async with asyncio.timeout(GUARD_S):  # a reader stalled on a live tail that never moves again
            return await _follow_into(view, client, sid, token)
    except TimeoutError:
        view.ended = "guard"
        return view


async def _follow_into(view: ReaderView, client: FanoutClient, sid: str, token: str) -> ReaderView:
    position = None
    while True:
        try:
            async for event in client.events(sid, token=token, last_event_id=position):
                view.got[event.seq] = msgspec.to_builtins(event)
                position = event.seq
            view.ended = "end"
            return view
        except StreamUnavailableError as exc:
            if exc.status == 410:
                view.signalled, view.ended = True, "410"
                return view
            await asyncio.sleep(0.3)  # 503 while the cluster fails over: resume from what we hold


def _publisher(url: str, keys: Keys) -> contextlib.AbstractAsyncContextManager[str]:
    return running_publisher(url, keys, make_settings(redis_cluster=True, heartbeat_s=0.5))


async def _wait(predicate: Any, guard_s: float) -> None:
    deadline = time.monotonic() + guard_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("failover scenario: condition not reached within the guard time")
        await asyncio.sleep(0.05)


async def _victim(client: RedisClient, cluster: RedisClusterServers, keys: Keys, sids: list[str]) -> tuple[int, int]:
    """Port of the master holding most streams, and how many it holds."""
    assert isinstance(client, RedisCluster)
    await client.initialize()
    ports = collections.Counter(int(client.get_node_from_key(keys.meta(s)).port) for s in sids)
    masters = {node.port for node in cluster.primaries()}
    port, count = next((p, c) for p, c in ports.most_common() if p in masters)
    return port, count


def _classify(figures: Figures, events: list[Event], state: dict[str, str]) -> None:
    last = events[-1] if events else None
    if isinstance(last, StreamDone) and last.status == "completed":
        whole = [e.seq for e in events] == list(range(1, len(GOLDEN) + 1)) and strip_volatile(events) == strip_volatile(
            GOLDEN)
        figures.whole += int(whole)
        figures.unfinished += int(not whole)  # a completed stream with a hole would be a silent loss
    elif isinstance(last, StreamError):
        figures.explicit_error += 1
        figures.errors.append(f"{last.error.category}: {last.error.message}")
    elif state.get("state") == "done":
        figures.explicit_error += 1
        figures.errors.append(f"{state.get('error_category')}: {state.get('error_message')}")
    else:
        figures.unfinished += 1


def _check_reader(figures: Figures, view: ReaderView, events: list[Event], state: dict[str, str]) -> None:
    stored = {e.seq: msgspec.to_builtins(e) for e in events}
    lost = range(int(state.get("lost_from", 0)), int(state.get("lost_to", -1)) + 1)
    silent = False
    for seq, event in view.got.items():
        if seq in stored:
            silent |= stored[seq] != event
        elif seq in lost:
            figures.reader_events_lost_by_storage += 1
        else:
            silent = True
    held = sorted(view.got)
    if not view.signalled and held != list(range(1, (held[-1] if held else 0) + 1)):
        silent = True
    if view.ended != "410" and stored and max(stored) not in view.got and not view.signalled:
        silent = silent or state.get("state") != "done" or view.ended == "guard"
    figures.silent_gaps += int(silent)
    figures.readers_with_410_or_gap += int(view.signalled)


async def _all_done(client: RedisClient, keys: Keys, sids: list[str]) -> None:
    """Wait (up to :data:`GUARD_S`) until every stream's meta is ``done``; those that never are count as unfinished."""
    async def done() -> bool:
        with contextlib.suppress(RedisError):
            return all(m.get("state") == "done" for m in [await meta(client, keys, sid) for sid in sids])
        return False

    with contextlib.suppress(AssertionError):
        await _wait(done, GUARD_S)


def _replicas_in_sync(cluster: RedisClusterServers) -> bool:
    """Whether every replica's link to its master is up (a replica that never synced cannot be promoted)."""
    for node in cluster.nodes:
        with contextlib.suppress(RedisError, OSError), node.client() as sync:
            info = sync.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
    return True


async def run_failover(n_streams: int = 12) -> Figures:
    """Run the scenario once (module docstring); return its figures."""
    keys = Keys(prefix="failover")
    with redis_cluster(masters=3, replicas=1) as cluster:
        async def synced() -> bool:
            return _replicas_in_sync(cluster)

        await _wait(synced, 30.0)
        client = connect(cluster.url, RedisOptions(cluster=True))
        try:
            return await _scenario(cluster, client, keys, n_streams)
        finally:
            await client.aclose()


async def _scenario(cluster: RedisClusterServers, client: RedisClient, keys: Keys, n: int) -> Figures:
    figures = Figures(streams=n)
    async with fake_upstream(SLOW) as (base, _state):
        settings = settings_for(base, cluster.url, keys, redis_cluster=True, lease_s=8.0, append_retry_s=8.0,
                                idle_timeout_s=20.0, progress_timeout_s=20.0, total_timeout_s=80.0,
                                terminal_wait_replicas=1)
        async with running_worker(settings, keys), _publisher(cluster.url, keys) as url, \
                FanoutClient(url, api_key=API_KEY) as fanout:
            subs = [await fanout.submit(provider="anthropic", model=f"slow-{CASE}",
                                        request={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64})
                    for _ in range(n)]
            sids = [s.stream_id for s in subs]
            readers = [asyncio.create_task(_follow(fanout, s.stream_id, s.token)) for s in subs]
            try:
                return await _kill_and_check(cluster, client, keys, figures, sids=sids, readers=readers)
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)


async def _kill_and_check(cluster: RedisClusterServers, client: RedisClient, keys: Keys, figures: Figures, *,
                          sids: list[str], readers: list[asyncio.Task[ReaderView]]) -> Figures:
    """Kill the busiest master once every stream runs, wait for the promotion and the ends, then count."""
    async def running() -> bool:
        return all(int(m.get("last_seq", 0)) >= 3 for m in [await meta(client, keys, sid) for sid in sids])

    await _wait(running, 30.0)
    figures.killed_port, figures.streams_on_killed_master = await _victim(client, cluster, keys, sids)
    killed_at = time.monotonic()
    next(node for node in cluster.nodes if node.port == figures.killed_port).kill()

    async def promoted() -> bool:
        return len(cluster.primaries()) == 3

    await _wait(promoted, 30.0)
    figures.promoted_after_s = round(time.monotonic() - killed_at, 2)
    views = await asyncio.gather(*readers)
    await _all_done(client, keys, sids)
    for sid, view in zip(sids, views, strict=True):
        events, state = await stored_events(client, keys, sid), await meta(client, keys, sid)
        _classify(figures, events, state)
        _check_reader(figures, view, events, state)
    return figures
