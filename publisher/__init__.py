"""The fanout publisher: the aiohttp edge that takes jobs and serves streams over SSE with resume.

Top level: the app factory (``app``), the command (``main``), settings, typed app state
and telemetry. Rooms: :mod:`publisher.api` (the HTTP surface), :mod:`publisher.live` (the
live fan-out), :mod:`publisher.history` (stored-stream reads), :mod:`publisher.wire`
(wire formats).

Must not import :mod:`worker` or :mod:`tools` (optional routes arrive as plug-ins).
"""
