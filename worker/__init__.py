"""The fanout worker: takes jobs from Redis, calls providers, normalizes and appends their events.

Rooms: the pure core (``sse``, ``jsonarray``, ``eventstream``, ``frames``, ``adapters/``,
``normalizer``, ``pipeline``, ``error_policy``: bytes in, contract events out) and the I/O
shell around it (``runner``, ``intake``, ``job_run``, ``attempt``, ``upstream``,
``appender``, ``lease``, ``cancel``, ``telemetry``, ``main``). Shared Redis plumbing is in
:mod:`infra`.

Must not import :mod:`publisher` or :mod:`tools`.
"""
