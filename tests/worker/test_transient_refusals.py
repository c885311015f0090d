"""Streams run through each transient refusal of a real ``redis-server`` and end as their golden says.

One test per reply code (:mod:`tests.faults.refusals` makes the server send it, on
private servers started here): four streams are running when the refusal begins; it
lasts a second or more; every stream ends exactly as the transcript's golden, claimed
once (no ``worker_lost``), the provider called once per job, nothing left pending, and
each stream's writes met the refusal (:func:`tests.faults.run_through.assert_ran_through`).
The server's own count of the code's replies (``INFO errorstats``) proves it was sent to
the workers, not only to the test's probe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import pytest
from redis.cluster import RedisCluster

from schema.keys import Keys
from tests.faults.refusals import (
    Busy,
    ClusterDown,
    Loading,
    MasterDown,
    NoReplicas,
    ReadOnly,
    Refusal,
    TryAgain,
    errors_sent,
)
from tests.faults.run_through import SubmitJobs, assert_ran_through, hold, run_through
from tests.redis_servers import RedisServer, redis_cluster, redis_node

HOLD_S = 1.5
"""How long each refusal is held once the server sends it, seconds."""


@contextlib.contextmanager
def _node() -> Iterator[RedisServer]:
    with redis_node(extra=["--enable-debug-command", "yes"]) as server:
        yield server


async def _through_one_node(make: Callable[[RedisServer], Refusal], caplog: pytest.LogCaptureFixture) -> None:
    with _node() as server:
        refusal = make(server)

        async def inject(_sids: list[str], _keys: Keys, _submit: SubmitJobs) -> None:
            await hold(refusal.begin, refusal.end, HOLD_S)

        outcome = await run_through(server.url, cluster=False, inject=inject, records=caplog.records)
        assert errors_sent(server, refusal.code) > 1  # the probe's one, and the workers'
    assert_ran_through(outcome)


async def test_streams_run_through_noreplicas_while_the_replica_is_stopped(caplog: pytest.LogCaptureFixture) -> None:
    with _node() as master, redis_node() as replica:
        NoReplicas.attach(master, replica)
        refusal = NoReplicas(master, replica, "stop")

        async def inject(_sids: list[str], _keys: Keys, _submit: SubmitJobs) -> None:
            await hold(refusal.begin, refusal.end, HOLD_S)

        outcome = await run_through(master.url, cluster=False, inject=inject, records=caplog.records)
        assert errors_sent(master, "NOREPLICAS") > 1
    assert_ran_through(outcome)


async def test_streams_run_through_busy_while_a_script_runs(caplog: pytest.LogCaptureFixture) -> None:
    await _through_one_node(Busy, caplog)


async def test_streams_run_through_loading_while_the_dataset_reloads(caplog: pytest.LogCaptureFixture) -> None:
    await _through_one_node(Loading, caplog)


async def test_streams_run_through_readonly_while_the_master_is_a_replica(caplog: pytest.LogCaptureFixture) -> None:
    await _through_one_node(ReadOnly, caplog)


async def test_streams_run_through_masterdown_while_the_replica_serves_no_stale_data(
        caplog: pytest.LogCaptureFixture) -> None:
    await _through_one_node(MasterDown, caplog)


async def test_streams_run_through_clusterdown_while_a_slot_is_unserved(caplog: pytest.LogCaptureFixture) -> None:
    with redis_cluster(masters=1) as cluster:
        refusal = ClusterDown(cluster)

        async def inject(_sids: list[str], _keys: Keys, _submit: SubmitJobs) -> None:
            await hold(refusal.begin, refusal.end, HOLD_S)

        outcome = await run_through(cluster.url, cluster=True, inject=inject, records=caplog.records)
        assert errors_sent(cluster.nodes[0], "CLUSTERDOWN") > 1
    assert_ran_through(outcome)


async def test_streams_run_through_tryagain_while_their_slots_migrate(caplog: pytest.LogCaptureFixture) -> None:
    with redis_cluster(masters=2) as cluster:
        async def inject(sids: list[str], keys: Keys, _submit: SubmitJobs) -> None:
            refusal = TryAgain(cluster, [keys.meta(sid) for sid in sids])
            await hold(refusal.begin, refusal.end, HOLD_S)

        outcome = await run_through(cluster.url, cluster=True, inject=inject, records=caplog.records)
        assert sum(errors_sent(node, "TRYAGAIN") for node in cluster.nodes) > 1
    assert_ran_through(outcome)


async def test_claims_wait_out_tryagain_and_call_the_provider_once(caplog: pytest.LogCaptureFixture) -> None:
    with redis_cluster(masters=2) as cluster:
        async def inject(sids: list[str], keys: Keys, submit_jobs: SubmitJobs) -> None:
            for sid in sids:  # the queued meta alone: the slots migrate before any job is claimed
                await asyncio.to_thread(_queued_meta, cluster.url, keys.meta(sid))
            refusal = TryAgain(cluster, [keys.meta(sid) for sid in sids])
            await hold(refusal.begin, refusal.end, HOLD_S, meanwhile=submit_jobs)

        outcome = await run_through(cluster.url, cluster=True, inject=inject, records=caplog.records, at_claim=True)
    assert_ran_through(outcome)
    claims = [m for m in (r.getMessage() for r in caplog.records) if "event=storage_retry " in m and "what=claim " in m]
    assert {sid for sid in outcome.events if any(f"stream_id={sid} " in line for line in claims)} == set(outcome.events)


def _queued_meta(url: str, key: str) -> None:
    with RedisCluster.from_url(url) as client:
        client.hset(key, "state", "queued")
