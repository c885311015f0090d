"""Cancel notifications: one Pub/Sub subscription per worker process on ``P:cancels``.

The publisher sets ``P:{id}:cancel`` = 1 and PUBLISHes the stream id on ``P:cancels``
(:mod:`schema.keys`). This listener hands each id to a callback that stops the job if it
runs here. A notification missed while disconnected is caught by the flag check at job
start and at every lease renewal (:mod:`worker.lease`). The subscription runs on a plain
connection to one node (:func:`infra.redis_client.node_client`: classic pub/sub reaches
every node of a cluster), picked again after each failure. Redis command pages followed:
SUBSCRIBE, PUBLISH (non-sharded Pub/Sub, Redis 6.2 compatible).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.exceptions

from infra.redis_client import RedisClient, node_client
from infra.redis_faults import redis_error_fields
from schema.keys import Keys

log = logging.getLogger("fanout.worker.cancel")

RESUBSCRIBE_DELAY_S = 1.0
"""Pause before subscribing again after the subscription's connection failed."""


class CancelListener:
    """Listens on ``P:cancels`` and calls ``on_cancel(stream_id)`` per notification.

    Args:
        redis: asyncio client.
        keys: Key layout.
        on_cancel: Called in the event loop with each announced stream id; must not block.
    """

    def __init__(self, redis: RedisClient, keys: Keys, on_cancel: Callable[[str], None]) -> None:
        self.redis, self.keys, self.on_cancel = redis, keys, on_cancel
        self.ready = asyncio.Event()
        """Set once the subscription is active (tests wait for it before publishing)."""

    async def run(self) -> None:
        """Listen until cancelled, subscribing again after connection failures."""
        while True:
            try:
                node = await node_client(self.redis)
            except redis.exceptions.RedisError as exc:
                log.warning("event=cancel_subscription_lost error=%s message=%r", type(exc).__name__, str(exc))
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)
                continue
            pubsub = node.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.cancels)
                self.ready.set()
                async for message in pubsub.listen():
                    self._dispatch(message)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self.ready.clear()
                log.warning("event=cancel_subscription_lost %s", redis_error_fields(exc))
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2 on
                await node.aclose()

    def _dispatch(self, message: dict[str, object]) -> None:
        if message.get("type") != "message":
            return
        data = message.get("data")
        stream_id = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        self.on_cancel(stream_id)
