"""Which publisher hub tasks survive a Redis Cluster that goes away for a while (private cluster).

    PYTHONPATH=. .venv/bin/python scripts/breaker/cluster_down_tasks.py
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import aiohttp
from aiohttp import web

from publisher.app import RUNNER_KWARGS, create_app
from publisher.edge import EdgeRunner
from publisher.state import HUB
from schema.contract import encode_event
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, bearer, make_settings, start
from tests.redis_servers import redis_cluster
from worker.redis_client import RedisOptions, connect


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, force=True)
    with redis_cluster(masters=3) as cluster:
        keys = Keys(prefix=f"brk2-{uuid.uuid4().hex[:8]}")
        settings = make_settings(heartbeat_s=0.4, redis_cluster=True)
        app = create_app(settings, keys=keys, redis_url=cluster.url)
        runner = EdgeRunner(app, **RUNNER_KWARGS)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        client = connect(cluster.url, RedisOptions(cluster=True))
        sid = "st_" + uuid.uuid4().hex
        await client.xadd(keys.events(sid), {"e": encode_event(start(sid))}, id="0-1")
        async with aiohttp.ClientSession() as http:
            resp = await http.get(f"http://{host}:{port}/v1/streams/{sid}/events", headers=bearer(API_KEY))
            await resp.content.readline()
            await asyncio.sleep(1.0)
            hub = app[HUB]
            print("before:", [(t.get_coro().__name__, t.done()) for t in hub._tasks])  # noqa: SLF001
            for node in cluster.nodes:
                node.stop()
            await asyncio.sleep(3.0)
            print("down:", [(t.get_coro().__name__, t.done(), t.done() and not t.cancelled() and repr(t.exception()))
                            for t in hub._tasks])  # noqa: SLF001
            for node in cluster.nodes:
                node.start()
            await asyncio.sleep(3.0)
            print("after:", [(t.get_coro().__name__, t.done()) for t in hub._tasks])  # noqa: SLF001
            resp.close()
        await client.aclose()
        await runner.cleanup()


asyncio.run(main())
