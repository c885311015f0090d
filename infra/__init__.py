"""The I/O both processes share: the Redis client seam, table-driven Redis faults, jobs groups, telemetry setup.

Holds :mod:`infra.redis_client` (every Redis client and its topology: cluster or single
node, per-primary clients), :mod:`infra.redis_connections` (redis-py's connections made
safe against a peer's reset), :mod:`infra.live_pubsub` (classic or sharded pub/sub for
live notifications, decided once at startup),
:mod:`infra.redis_faults` (one classifier over :mod:`schema.redis_replies`),
:mod:`infra.storage` (bounded retries of writes, the readiness write probe, ``WAIT``),
:mod:`infra.groups` (the ``workers`` consumer group on the jobs streams) and
:mod:`infra.otel_setup` (OpenTelemetry providers from ``OTEL_*``).

Must not import: :mod:`worker`, :mod:`publisher`, :mod:`tools`. It may import
:mod:`schema` and third-party I/O libraries.
"""
