"""Stored-stream reads: meta, tombstone and event entries by exact position, and what a reader may see.

:mod:`~publisher.history.store` reads Redis (its top and backward reads in
:mod:`~publisher.history.probes`), :mod:`~publisher.history.entries` parses
stored items into entries with their SSE frames (kept per process by
:mod:`~publisher.history.frame_cache`), :mod:`~publisher.history.visibility`
decides the public projection.

May import :mod:`publisher.wire`, :mod:`infra` and :mod:`schema`. Must not import
:mod:`publisher.api`, :mod:`publisher.live`, :mod:`worker` or :mod:`tools`.
"""
