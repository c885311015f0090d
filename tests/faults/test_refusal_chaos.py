"""Chaos: a random sequence of transient refusals while streams run; every stream still ends as its golden.

A private master (``enable-debug-command``, for ``LOADING``) with one replica under
``min-replicas-to-write 1``; four streams on two workers; then :data:`FAULTS` refusals
drawn at random from ``NOREPLICAS``, ``BUSY``, ``LOADING``, ``READONLY`` and
``MASTERDOWN`` (:mod:`tests.faults.refusals`), each held :data:`HOLD_S` with a pause of
:data:`PAUSE_S` between them: a few seconds in all. Every stream must end exactly as
the transcript's golden, claimed once (no ``worker_lost``), with one provider call each
(:func:`tests.faults.run_through.assert_ran_through`: each stream's writes met a refusal),
and the server must have sent the first drawn code to the workers (later ones may find
the streams finished and the intake pausing). Each refusal is real: it begins only once
the server answers its code (:meth:`tests.faults.refusals.Refusal.begin`). The seed is
random per run and named in any failure; ``FANOUT_CHAOS_SEED`` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from schema.keys import Keys
from tests.faults.refusals import Busy, Loading, MasterDown, NoReplicas, ReadOnly, Refusal, errors_sent
from tests.faults.run_through import SubmitJobs, assert_ran_through, run_through
from tests.redis_servers import RedisServer, redis_node

pytestmark = pytest.mark.faults

FAULTS = 5
"""Refusals per run."""
HOLD_S = (0.3, 0.8)
"""Each refusal lasts a uniform draw from this range once the server sends it, seconds."""
PAUSE_S = (0.1, 0.4)
"""Pause between two refusals, seconds."""


def _refusals(master: RedisServer, replica: RedisServer) -> list[Refusal]:
    return [NoReplicas(master, replica, "config"), Busy(master), Loading(master, load_s=0.6), ReadOnly(master),
            MasterDown(master)]


async def test_streams_run_through_a_random_sequence_of_transient_refusals(caplog: pytest.LogCaptureFixture) -> None:
    seed = int(os.environ.get("FANOUT_CHAOS_SEED") or random.randrange(2**32))
    draw = random.Random(seed)
    with redis_node(extra=["--enable-debug-command", "yes"]) as master, redis_node() as replica:
        NoReplicas.attach(master, replica)
        refusals = _refusals(master, replica)
        sequence = [draw.choice(refusals) for _ in range(FAULTS)]

        async def inject(_sids: list[str], _keys: Keys, _submit: SubmitJobs) -> None:
            for refusal in sequence:
                await asyncio.to_thread(refusal.begin)
                await asyncio.sleep(draw.uniform(*HOLD_S))
                await asyncio.to_thread(refusal.end)
                await asyncio.sleep(draw.uniform(*PAUSE_S))

        outcome = await run_through(master.url, cluster=False, inject=inject, records=caplog.records)
        sent = {refusal.code: errors_sent(master, refusal.code) for refusal in sequence}
    codes = [refusal.code for refusal in sequence]
    try:
        assert_ran_through(outcome)
        assert sent[codes[0]] > 1, sent  # the first met the running streams: the probe's reply, and the workers'
    except AssertionError as exc:
        raise AssertionError(f"chaos seed {seed} (FANOUT_CHAOS_SEED={seed} replays it), refusals {codes}") from exc
