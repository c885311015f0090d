"""Typed application state (``web.AppKey``) shared by the publisher's modules.

Each key is set once while the app is built or in its ``cleanup_ctx``; handlers only
read them. Kept apart from :mod:`publisher.app` so handler modules can import the keys
without importing the factory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from publisher.settings import PublisherSettings
from schema.keys import Keys
from schema.upstreams import Upstreams

if TYPE_CHECKING:
    from infra.redis_client import RedisClient
    from publisher.api.fair_share import FairShares
    from publisher.api.limits import ConnectionGate
    from publisher.api.status_cache import StatusCache
    from publisher.api.submit import JobShards
    from publisher.history.store import Store
    from publisher.live.hub import Hub
    from publisher.live.reader_budget import ReaderBudget
    from publisher.telemetry import Telemetry

SETTINGS = web.AppKey("settings", PublisherSettings)
"""The resolved settings (secret included)."""
UPSTREAMS = web.AppKey("upstreams", Upstreams)
"""Endpoints and routes a submission is checked against (``FANOUT_UPSTREAMS_FILE``, or today's variables)."""
KEYS = web.AppKey("keys", Keys)
"""The Redis key layout of this deployment (a unique prefix per test)."""
REDIS: web.AppKey[RedisClient] = web.AppKey("redis")
"""The command client (a connection pool), opened in ``cleanup_ctx``."""
STORE: web.AppKey[Store] = web.AppKey("store")
"""Stream reads over the (possibly test-wrapped) command client."""
HUB: web.AppKey[Hub] = web.AppKey("hub")
"""The fan-out hub, opened in ``cleanup_ctx``."""
SHARDS: web.AppKey[JobShards] = web.AppKey("shards")
"""The jobs shard of a submission and the record of the shard count."""
GATE: web.AppKey[ConnectionGate] = web.AppKey("gate")
"""Counter of open SSE responses against ``max_connections``."""
TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry")
"""Tracer and metric instruments."""
FAIR_SHARES: web.AppKey[FairShares] = web.AppKey("fair_shares")
"""Places held per credential (or address) on the SSE and status routes."""
STATUS_CACHE: web.AppKey[StatusCache] = web.AppKey("status_cache")
"""Assembled status results, shared and kept; opened in ``cleanup_ctx`` (it reads through the store)."""
BUDGET: web.AppKey[ReaderBudget] = web.AppKey("reader_budget")
"""Memory budgets of SSE readers waiting on their clients."""
