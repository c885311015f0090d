"""One sans-I/O adapter per provider API, and the registry that picks one by name.

Each provider API has its adapter module (``anthropic``, ``openai_chat``,
``openai_responses``, ``gemini``, ``bedrock_converse``: routing by a dict of handlers and
the terminal signals, with the provider's behaviour in its docstring), a ``*_parts``
module (tables and total readers of the provider's JSON) and, where the block logic is
large, a ``*_blocks`` module (provider values to block operations). ``base`` is the
protocol every adapter implements; ``registry`` maps provider names to adapters.

Pure: imports no asyncio, aiohttp, redis or opentelemetry (``tests/test_purity.py``); an
adapter reads :mod:`worker.frames` and calls :mod:`worker.normalizer`. Must not import
:mod:`infra`, :mod:`worker.pipeline`, :mod:`worker.upstream`, :mod:`worker.attempt`,
:mod:`worker.job_run`, :mod:`worker.job_storage`, :mod:`worker.runner`,
:mod:`worker.appender`, :mod:`worker.stream_writer`, :mod:`worker.telemetry`,
:mod:`publisher` or :mod:`tools`.
"""
