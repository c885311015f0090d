"""pytest -p scripts.breaker7.ports_plugin: every private redis-server of the tests on ports 42000-42999.

Patches the two port pickers of the test helpers; a cluster node listens on a port in
42000-42499 and its bus on port + 500 (``--cluster-port``), so no port leaves the range.
"""
import random
import socket

import tests.redis_servers as redis_servers
import tests.worker.redis_proc as redis_proc

_LOW, _HIGH = 42000, 42499


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick(cluster: bool = False) -> int:
    for _ in range(500):
        port = random.randint(_LOW, _HIGH)
        if _free(port) and _free(port + 500):
            return port
    raise RuntimeError("no free port in 42000-42499")


def _free_port_cluster(*, cluster: bool) -> int:
    return _pick(cluster)


redis_proc.free_port = lambda: _pick()
redis_servers.free_port = _free_port_cluster
_orig_args = redis_servers.RedisServer._args


def _args(self: redis_servers.RedisServer) -> list[str]:
    args = _orig_args(self)
    if self.cluster:
        args += ["--cluster-port", str(self.port + 500)]
    return args


redis_servers.RedisServer._args = _args  # type: ignore[method-assign]


def _start(self: redis_servers.RedisClusterServers) -> None:
    """``RedisClusterServers.start`` with ``CLUSTER MEET <ip> <port> <bus port>`` (the bus is port + 500)."""
    for node in self.nodes:
        node.start()
    step = redis_servers.SLOTS // self.masters
    for index, node in enumerate(self.nodes[: self.masters]):
        end = redis_servers.SLOTS if index == self.masters - 1 else (index + 1) * step
        with node.client() as client:
            client.execute_command("CLUSTER ADDSLOTS", *range(index * step, end))
    with self.nodes[0].client() as first:
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER MEET", "127.0.0.1", node.port, node.port + 500)
    self._wait(lambda info, nodes: len(nodes) >= len(self.nodes)
               and not any("handshake" in n["flags"] or not n["node_id"] for n in nodes.values()))
    self._attach_replicas()
    self._wait(lambda info, nodes: info.get("cluster_state") == "ok"
               and sum("slave" in n["flags"] for n in nodes.values()) >= self._replica_count)


redis_servers.RedisClusterServers.start = _start  # type: ignore[method-assign]
