"""Wire formats of a stream: contract SSE, the AI SDK's UI message stream, AG-UI, Durable Streams. Pure.

Bytes and chunk objects only: no I/O, no Redis, no aiohttp. Must not import
:mod:`publisher.api`, :mod:`publisher.live`, :mod:`publisher.history`, :mod:`infra`,
:mod:`worker` or :mod:`tools`.
"""
