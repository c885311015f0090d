"""The fanout worker: takes jobs from Redis, calls providers, normalizes and appends their events.

Rooms: the pure core, bytes in and contract events out: framing (``frames``, ``sse``,
``sse_lines``, ``jsonarray``, ``jsonscan``, ``eventstream`` with ``eventstream_headers``,
``bedrock_frames``), the provider adapters (``adapters/``), the normalizer (``normalizer``
on ``outbox``, with ``blocks`` and ``terminal``), ``pipeline``, ``error_policy``,
``routing`` (cooldowns, route plans, slot counts), ``jobentry`` and ``summary``. Around
it the I/O shell: ``main``, ``settings``, ``runner``,
``intake``, ``job_groups``, ``job_run``, ``job_storage``, ``route_run`` (a job's attempts
over its route's endpoints), ``router`` (the process's cooldowns and slots), ``targets``,
``attempt``, ``upstream``,
``upstream_errors``, ``appender``, ``stream_writer``, ``append_script``, ``salvage``,
``lease``, ``cancel``, ``control``, ``telemetry``. Shared Redis plumbing is in :mod:`infra`.

The pure core imports no asyncio, aiohttp, redis, opentelemetry or :mod:`infra`
(``tests/test_purity.py`` lists its modules). Must not import :mod:`publisher` or
:mod:`tools`.
"""
