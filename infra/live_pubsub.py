"""Which pub/sub carries live notifications: decided once at startup, the same way in worker and publisher.

:func:`live_mode` chooses between classic pub/sub (``PUBLISH``/``SUBSCRIBE``: on a single
node, and on a Redis 6.2 cluster, where it reaches every node over the cluster bus, so a
subscriber needs a plain connection to ONE node: :func:`infra.redis_client.node_client`)
and sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``, Redis 7 clusters: a message stays on the
shard that owns the channel's slot; the publisher subscribes at each owner,
:mod:`publisher.live.shard_links`). :func:`publish_live` sends one notification the way
the mode says (the append script does it itself, :mod:`worker.append_script`).

Clients and topologies come from :mod:`infra.redis_client`. Must not import
:mod:`worker`, :mod:`publisher` or :mod:`tools` (as all of :mod:`infra`).

Redis pages followed: Pub/Sub ("Sharded Pub/Sub"), SPUBLISH, INFO.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from redis.asyncio.cluster import RedisCluster

from infra.redis_client import RedisClient, primary_clients
from schema.settings import SettingsError

LivePubSub: TypeAlias = Literal["auto", "classic", "sharded"]
"""``FANOUT_LIVE_PUBSUB``: which pub/sub carries live notifications (:func:`live_mode`)."""
LiveMode: TypeAlias = Literal["classic", "sharded"]
"""What :func:`live_mode` decided: ``PUBLISH``/``SUBSCRIBE`` or ``SPUBLISH``/``SSUBSCRIBE``."""
SHARDED_PUBSUB_MIN_VERSION: Final = (7, 0)
"""Oldest Redis with sharded pub/sub (``SPUBLISH``, ``SSUBSCRIBE``)."""


def _version(text: object) -> tuple[int, ...]:
    """``7.0.15`` -> ``(7, 0, 15)``; an unparseable version counts as ``(0,)`` (too old)."""
    parts = []
    for part in str(text).split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts) or (0,)


async def server_versions(client: RedisClient) -> dict[str, tuple[int, ...]]:
    """Return ``redis_version`` (``INFO server``) of each primary, by ``host:port`` (one entry for a single node).

    Raises:
        redis.exceptions.RedisError: A node did not answer.
    """
    out = {}
    for node in await primary_clients(client):
        try:
            info = await node.info("server")
            kwargs = node.connection_pool.connection_kwargs
            name = str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")
            out[name] = _version(info.get("redis_version", ""))
        finally:
            await node.aclose()
    return out


async def live_mode(client: RedisClient, setting: LivePubSub = "auto") -> LiveMode:
    """Decide which pub/sub carries live notifications; worker and publisher both call this at startup.

    ``auto`` (the default) answers ``sharded`` on a Redis Cluster whose every primary runs
    Redis >= :data:`SHARDED_PUBSUB_MIN_VERSION`, else ``classic``: a classic ``PUBLISH`` on a
    cluster is broadcast over the cluster bus to every node, so its cost grows with the
    cluster, while a sharded one stays on the shard that owns the channel's slot. A
    single node always uses classic pub/sub (nothing to shard). ``classic`` forces it
    (e.g. during a rolling upgrade from a release whose workers only ``PUBLISH``);
    ``sharded`` insists and refuses a deployment that cannot do it.

    Worker and publisher must agree, or live events reach readers only through the
    publisher's audit (one read per idle topic per half heartbeat): give both the same
    ``FANOUT_LIVE_PUBSUB``.

    Raises:
        SettingsError: ``sharded`` on a single node, or on a cluster with a primary older
            than 7.0 (named, with its version).
        redis.exceptions.RedisError: ``INFO`` failed (Redis unreachable).
    """
    if setting == "classic":
        return "classic"
    if not isinstance(client, RedisCluster):
        if setting == "sharded":
            raise SettingsError("FANOUT_LIVE_PUBSUB=sharded needs a Redis Cluster (FANOUT_REDIS_CLUSTER=1); "
                                "a single node uses classic pub/sub (auto or classic)")
        return "classic"
    old = {name: v for name, v in (await server_versions(client)).items() if v < SHARDED_PUBSUB_MIN_VERSION}
    if not old:
        return "sharded"
    if setting == "sharded":
        named = ", ".join(f"{name} runs {'.'.join(map(str, v))}" for name, v in sorted(old.items()))
        raise SettingsError(f"FANOUT_LIVE_PUBSUB=sharded needs Redis >= 7.0 on every primary: {named}")
    return "classic"


async def publish_live(client: RedisClient, mode: LiveMode, channel: str | bytes, payload: str | bytes) -> int:
    """``SPUBLISH`` (``sharded``) or ``PUBLISH`` (``classic``) one message; return how many subscribers got it.

    For code that notifies a live channel outside the append script (tests, benchmarks,
    tools acting as a worker). The cluster client routes ``SPUBLISH`` to the channel's
    slot owner.

    Raises:
        redis.exceptions.RedisError: Redis failed.
    """
    if mode == "sharded":
        return int(await client.spublish(channel, payload))
    return int(await client.publish(channel, payload))
