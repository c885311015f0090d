"""The one place that creates Redis clients: single node by default, Redis Cluster with ``FANOUT_REDIS_CLUSTER=1``.

Worker, publisher, ``fanout health``, the demo and the benchmarks call :func:`connect`; the
rest of the code takes a :data:`RedisClient` and never asks which mode it runs in. What
redis-py (8.1) gives each mode and what fanout relies on:

* commands: the same API; the cluster client routes each command by its key's slot and
  follows ``MOVED``/``ASK``; every fanout script names only keys of one slot in ``KEYS``
  (:mod:`schema.keys`), and ``register_script`` works on both (``EVALSHA`` routed by the
  first key, ``SCRIPT LOAD`` on ``NOSCRIPT``);
* pipelines: only ``pipeline(transaction=False)``; the cluster pipeline splits commands
  by node and REFUSES some commands, among them ``PUBLISH``, ``EVALSHA``, ``MGET``: send
  those as plain commands;
* live notifications: :func:`infra.live_pubsub.live_mode` decides, once at startup and the
  same way in worker and publisher, between classic pub/sub (a subscriber needs a plain
  connection to ONE node: :func:`node_client`) and sharded pub/sub (the publisher
  subscribes at each slot owner, :mod:`publisher.live.shard_links`);
* per-node commands (``INFO``, ``SCAN``, ``CLUSTER INFO``): :func:`primary_clients`.

Stale connections (Redis restarted, a failover): every client retries a command that failed on
a connection or timeout error :data:`RETRIES` times with jittered exponential backoff
(:data:`RETRY_BASE_S` .. :data:`RETRY_CAP_S`), and PINGs a connection idle longer than
:data:`HEALTH_CHECK_INTERVAL_S` before using it, so a dead pooled connection is replaced
instead of failing a request. A connection the peer reset (TCP RST) while it sat in the pool is
one of those on uvloop too (:class:`~infra.redis_connections.ResetSafe`). A retried non-idempotent command may have
been applied once already: the append script's fenced seq check makes its retry exact; an
``XADD`` of a job is at worst enqueued twice, and the second claim finds the stream running or
done (:mod:`worker.lease`).

Redis pages followed: Cluster specification (hash tags, redirections), CLUSTER INFO;
redis-py docs: Clustering, Retry.
"""

from __future__ import annotations

import inspect
import random
from typing import Any, Final, TypeAlias

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AskError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from infra.redis_connections import reset_safe, reset_safe_pool

RedisClient: TypeAlias = aioredis.Redis | RedisCluster
"""What every fanout component takes: a single-node client or a cluster client."""

REDIS_ERRORS: Final = (RedisError, RedisClusterException)
"""What a Redis call of either client may raise: redis-py's cluster client raises
``RedisClusterException`` (not a ``RedisError``) e.g. when the slots are not all covered."""


def cluster_mode_mismatch(exc: BaseException, cluster: bool) -> str | None:
    """Return what to fix when ``exc`` shows ``FANOUT_REDIS_CLUSTER`` does not match the server, else ``None``.

    A plain client sent to a Cluster node gets ``MOVED``/``ASK`` for keys of other nodes'
    slots (redis-py's message is only ``<slot> <host:port>``); the cluster client refuses
    a node with cluster mode off. Running again cannot help either.
    """
    if not cluster and isinstance(exc, AskError):
        return ("REDIS_URL is a node of a Redis Cluster (it redirected a key to another node): "
                "set FANOUT_REDIS_CLUSTER=1")
    if cluster and isinstance(exc, RedisClusterException) and "Cluster mode is not enabled" in str(exc):
        return "REDIS_URL is not a Redis Cluster node (cluster mode is off there): set FANOUT_REDIS_CLUSTER=0"
    if cluster and isinstance(exc, RedisClusterException) and "Unix domain socket" in str(exc):
        return "a Redis Cluster is reached over TCP, not a unix socket: use a redis:// URL or FANOUT_REDIS_CLUSTER=0"
    return None

RETRIES: Final = 3
"""Retries of a command that failed on a connection or timeout error."""
RETRY_BASE_S: Final = 0.05
"""First backoff of those retries, seconds (jittered, doubled each time)."""
RETRY_CAP_S: Final = 1.0
"""Longest backoff of one retry, seconds."""
HEALTH_CHECK_INTERVAL_S: Final = 5.0
"""A pooled connection idle longer than this is PINGed before use, seconds."""


class RedisOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How to connect; every field but ``cluster`` is optional.

    Attributes:
        cluster: ``FANOUT_REDIS_CLUSTER``: ``REDIS_URL`` names one seed node of a Redis
            Cluster (``redis://`` or ``rediss://`` only: no Unix socket in cluster mode).
        max_connections: Pool size (per node in cluster mode); ``None``: redis-py's default.
        pool_timeout_s: Single node only: wait this long for a free connection of a full
            pool (a blocking pool) instead of failing; ``None``: unbounded pool. The
            cluster client has no blocking pool: a full node pool raises at once.
        client_name: ``CLIENT SETNAME`` of every connection (shows in ``CLIENT LIST``).
        socket_timeout_s: Read/write timeout of each command, seconds; ``None``: none.
        connect_timeout_s: TCP connect timeout, seconds; ``None``: none.
        retries: Retries after a connection or timeout error (:data:`RETRIES`).
    """

    cluster: bool = False
    max_connections: int | None = None
    pool_timeout_s: float | None = None
    client_name: str | None = None
    socket_timeout_s: float | None = None
    connect_timeout_s: float | None = None
    retries: int = RETRIES


class _Cluster(RedisCluster):
    """redis-py's cluster client, routing ``XREADGROUP`` by its keys itself; its connections are reset-safe.

    redis-py asks the server (``COMMAND GETKEYS``, twice) for the keys of a command with
    "movable keys" such as ``XREADGROUP`` before sending it, tripling what an idle worker
    sends and putting it all on one node. The keys of ``XREADGROUP GROUP g c [COUNT n]
    [BLOCK ms] [NOACK] STREAMS k.. id..`` follow ``STREAMS`` (the first half of the rest).
    Connections: :func:`~infra.redis_connections.reset_safe` of redis-py's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the nodes found later are built from these kwargs (one dict, shared with the nodes manager)
        self.connection_kwargs["connection_class"] = reset_safe(self.connection_kwargs["connection_class"])
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = reset_safe(node.connection_class)

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if str(command).upper() == "XREADGROUP":
            words = [a.upper() if isinstance(a, str | bytes) else a for a in args]
            marker = next((w for w in words[3:] if w in ("STREAMS", b"STREAMS")), None)
            if marker is not None:
                start = words.index(marker, 3) + 1
                keys = args[start: start + (len(args) - start) // 2]
                slots = {self.keyslot(key) for key in keys}
                if len(slots) == 1:
                    return slots.pop()
        return await super()._determine_slot(command, *args)


def _retry(retries: int) -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=RETRY_BASE_S, cap=RETRY_CAP_S), retries,
                 supported_errors=(RedisConnectionError, RedisTimeoutError))


def _common(options: RedisOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "retry": _retry(options.retries), "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "socket_timeout": options.socket_timeout_s, "socket_connect_timeout": options.connect_timeout_s,
    }
    if options.client_name:
        kwargs["client_name"] = options.client_name
    return kwargs


def connect(url: str, options: RedisOptions | None = None) -> RedisClient:
    """Return a client of ``url``: :class:`RedisCluster` when ``options.cluster``, else :class:`redis.asyncio.Redis`.

    No connection is opened yet (the first command opens one; the cluster client then
    reads the slot map from the seed). Close it with ``await client.aclose()``.

    Args:
        url: ``REDIS_URL`` (``redis://``, ``rediss://``, or ``unix://`` for a single node).
        options: See :class:`RedisOptions` (default: single node, redis-py's pool).

    Raises:
        ValueError: A URL redis-py cannot parse.
        redis.exceptions.RedisClusterException: Cluster mode with a Unix socket URL.
    """
    options = options or RedisOptions()
    kwargs = _common(options)
    if options.cluster:
        if options.max_connections is not None:
            kwargs["max_connections"] = options.max_connections
        return _Cluster.from_url(url, **kwargs)
    if options.pool_timeout_s is not None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=options.max_connections or 50, timeout=options.pool_timeout_s, **kwargs)
        return reset_safe_pool(aioredis.Redis.from_pool(pool))
    if options.max_connections is not None:
        kwargs["max_connections"] = options.max_connections
    return reset_safe_pool(aioredis.Redis.from_url(url, **kwargs))


def is_cluster(client: RedisClient) -> bool:
    """Whether ``client`` talks to a Redis Cluster (for health checks and tests; other code must not branch on it)."""
    return isinstance(client, RedisCluster)


def _plain(client: aioredis.Redis) -> aioredis.Redis:
    pool = client.connection_pool
    return aioredis.Redis.from_pool(aioredis.ConnectionPool(  # from_pool: aclose closes the pool too
        connection_class=pool.connection_class, **pool.connection_kwargs))


_REDIS_PARAMS: Final = frozenset(inspect.signature(aioredis.Redis.__init__).parameters) - {"self", "host", "port"}


def _of_node(node: ClusterNode) -> aioredis.Redis:
    # the node's connection kwargs, less those only the cluster client knows
    kwargs = {k: v for k, v in node.connection_kwargs.items() if k in _REDIS_PARAMS}
    return reset_safe_pool(aioredis.Redis(host=node.host, port=int(node.port), **kwargs))


async def node_client(client: RedisClient) -> aioredis.Redis:
    """Return a NEW single-node client for classic pub/sub: the same server, or one random cluster primary.

    Classic ``PUBLISH`` on any cluster node reaches subscribers on every node, so one node
    suffices. The caller closes it (``aclose``); call again after a connection failure to
    pick a node of the current topology.

    Raises:
        redis.exceptions.RedisError: The cluster's slot map could not be read.
    """
    if isinstance(client, RedisCluster):
        await client.initialize()
        return _of_node(random.choice(client.get_primaries()))  # noqa: S311 - load spreading, not security
    return _plain(client)


async def primary_clients(client: RedisClient) -> list[aioredis.Redis]:
    """Return NEW single-node clients, one per primary (one for a single node); the caller closes them.

    For commands that concern a node rather than a key: ``INFO``, ``SCAN``, ``CLUSTER INFO``.

    Raises:
        redis.exceptions.RedisError: The cluster's slot map could not be read.
    """
    if isinstance(client, RedisCluster):
        await client.initialize()
        return [_of_node(node) for node in client.get_primaries()]
    return [_plain(client)]


async def cluster_problems(client: RedisClient) -> list[str]:
    """Return why the cluster is not usable (``[]`` when every primary reports ``cluster_state:ok``).

    A single-node client always answers ``[]``.

    Raises:
        redis.exceptions.RedisError: The slot map could not be read (the caller reports it).
    """
    if not isinstance(client, RedisCluster):
        return []
    problems = []
    await client.initialize()
    for node in client.get_primaries():
        info = await client.execute_command("CLUSTER INFO", target_nodes=node)
        state = info.get("cluster_state") if isinstance(info, dict) else None
        if state != "ok":
            problems.append(f"node {node.name} reports cluster_state:{state}")
    return problems
