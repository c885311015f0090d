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
* live notifications: :func:`live_mode` decides, once at startup and the same way in worker
  and publisher, between classic pub/sub (``PUBLISH``/``SUBSCRIBE``: on a single node, and
  on a Redis 6.2 cluster, where it reaches every node over the cluster bus, so a
  subscriber needs a plain connection to ONE node: :func:`node_client`) and sharded
  pub/sub (``SPUBLISH``/``SSUBSCRIBE``, Redis 7 clusters: a message stays on the shard that
  owns the channel's slot; the publisher subscribes at each owner,
  :mod:`publisher.live.shard_links`);
* per-node commands (``INFO``, ``SCAN``, ``CLUSTER INFO``): :func:`primary_clients`.

Stale connections (Redis restarted, a failover): every client retries a command that
failed on a connection or timeout error :data:`RETRIES` times with jittered exponential
backoff (:data:`RETRY_BASE_S` .. :data:`RETRY_CAP_S`), and PINGs a connection idle longer
than :data:`HEALTH_CHECK_INTERVAL_S` before using it, so a dead pooled connection is
replaced instead of failing a request. A connection the peer reset (TCP RST) while it sat
in the pool is one of those on uvloop too (:class:`_ResetSafe`). A retried non-idempotent command may have been
applied once already: the append script's fenced seq check makes its retry exact; an
``XADD`` of a job is at worst enqueued twice, and the second claim finds the stream
running or done (:mod:`worker.lease`).

Redis pages followed: Cluster specification (hash tags, redirections), CLUSTER INFO,
INFO, Pub/Sub ("Sharded Pub/Sub"), SPUBLISH; redis-py docs: Clustering, Retry.
"""

from __future__ import annotations

import inspect
import random
from typing import Any, Final, Literal, TypeAlias, TypeVar, cast

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AskError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schema.settings import SettingsError

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

LivePubSub: TypeAlias = Literal["auto", "classic", "sharded"]
"""``FANOUT_LIVE_PUBSUB``: which pub/sub carries live notifications (:func:`live_mode`)."""
LiveMode: TypeAlias = Literal["classic", "sharded"]
"""What :func:`live_mode` decided: ``PUBLISH``/``SUBSCRIBE`` or ``SPUBLISH``/``SSUBSCRIBE``."""
SHARDED_PUBSUB_MIN_VERSION: Final = (7, 0)
"""Oldest Redis with sharded pub/sub (``SPUBLISH``, ``SSUBSCRIBE``)."""


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


_C = TypeVar("_C", bound=AbstractConnection)


class _ResetSafe(AbstractConnection):
    """A connection whose write to a transport already closed by a peer's reset is a ``ConnectionError``.

    When the peer resets (TCP RST) a connection idle in the pool, uvloop closes its
    transport, redis-py's pool check does not notice (the stream reader holds the error,
    not an end of file), and the next write raises ``RuntimeError`` ("unable to perform
    operation on <TCPTransport closed=True ...>; the handler is closed"), which the retry
    does not cover: the command failed, and an SSE request got a ``500``. asyncio's own loop
    drops such a write and fails the read with ``ConnectionError``. As a ``ConnectionError``
    it is retried on a new connection (redis-py has already closed this one).
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Send as redis-py does; a write refused by a transport the peer reset raises ``ConnectionError``."""
        writer = self._writer
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:
            if writer is None or not writer.transport.is_closing():
                raise
            raise RedisConnectionError(f"connection reset by the peer before the write: {exc}") from exc


class _TCPConnection(_ResetSafe, Connection):
    """``redis://`` (:class:`_ResetSafe`)."""


class _SSLConnection(_ResetSafe, SSLConnection):
    """``rediss://`` (:class:`_ResetSafe`)."""


class _UnixConnection(_ResetSafe, UnixDomainSocketConnection):
    """``unix://`` (:class:`_ResetSafe`)."""


_RESET_SAFE: Final[dict[type[AbstractConnection], type[AbstractConnection]]] = {
    Connection: _TCPConnection, SSLConnection: _SSLConnection, UnixDomainSocketConnection: _UnixConnection}
"""redis-py's connection class for a URL scheme -> the same made :class:`_ResetSafe`."""


def _reset_safe(cls: type[_C]) -> type[_C]:
    """Return the :class:`_ResetSafe` subclass of redis-py's ``cls`` (``cls`` itself when it is none of the three)."""
    return cast("type[_C]", _RESET_SAFE.get(cls, cls))


def _reset_safe_pool(client: aioredis.Redis) -> aioredis.Redis:
    """Make the connections ``client``'s pool opens from now on :class:`_ResetSafe`; return ``client``."""
    pool = client.connection_pool
    pool.connection_class = _reset_safe(pool.connection_class)
    return client


class _Cluster(RedisCluster):
    """redis-py's cluster client, routing ``XREADGROUP`` by its keys itself; its connections are :class:`_ResetSafe`.

    redis-py asks the server (``COMMAND GETKEYS``, twice) for the keys of a command with
    "movable keys" such as ``XREADGROUP`` before sending it, tripling what an idle worker
    sends and putting it all on one node. The keys of ``XREADGROUP GROUP g c [COUNT n]
    [BLOCK ms] [NOACK] STREAMS k.. id..`` follow ``STREAMS`` (the first half of the rest).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the nodes found later are built from these kwargs (one dict, shared with the nodes manager)
        self.connection_kwargs["connection_class"] = _reset_safe(self.connection_kwargs["connection_class"])
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = _reset_safe(node.connection_class)

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
        return _reset_safe_pool(aioredis.Redis.from_pool(pool))
    if options.max_connections is not None:
        kwargs["max_connections"] = options.max_connections
    return _reset_safe_pool(aioredis.Redis.from_url(url, **kwargs))


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
    return _reset_safe_pool(aioredis.Redis(host=node.host, port=int(node.port), **kwargs))


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
