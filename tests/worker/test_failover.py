"""Failover of a Redis Cluster master while streams run: every stream ends whole or explicit, no silent gap.

The scenario is :func:`tests.worker.failover.run_failover` (also run, with its figures
printed, by ``bench/failover_bench.py``).
"""

from __future__ import annotations

from tests.worker.failover import run_failover


async def test_master_sigkill_leaves_every_stream_whole_or_explicit_and_no_reader_a_silent_gap() -> None:
    figures = await run_failover(n_streams=12)
    assert figures.streams_on_killed_master > 0
    assert figures.unfinished == 0, figures
    assert figures.whole + figures.explicit_error == figures.streams, figures
    assert figures.silent_gaps == 0, figures
    assert all(error.startswith(("internal: storage error", "worker_lost:")) for error in figures.errors), figures
