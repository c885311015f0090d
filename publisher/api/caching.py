"""HTTP caching of finished streams: a strong ``ETag``, ``Cache-Control`` until the stream's TTL, ``304``.

Once a stream's terminal event is stored, nothing of its generation changes again: its
events from any position, its snapshot, its ``/ui`` message stream and its status
document are fixed bytes until the stream expires. Their responses carry

* ``ETag``: a strong tag, a digest of the representation's identity: the route, what the
  request chose (projection, position, snapshot, ...), the stream id, its generation
  (meta ``epoch`` and ``created_ms``: a stream written again gets a new tag) and its last
  seq, plus :data:`REPRESENTATION` (bumped when the bytes a route makes of the same events
  change). It is computed from meta alone, so a revalidation reads no event;
* ``Cache-Control: private, max-age=<s>``: every read needs a credential (a read token, in
  the header or in ``?token=``), so only the reader's own cache may keep the response,
  never a shared one, whose key would hold the token; ``max-age`` is the stream's
  remaining TTL (``PTTL`` of its meta), at most ``FANOUT_FINISHED_MAX_AGE_S``;
* ``Vary: Authorization`` (the header's credential decides the projection), and on
  ``/events`` ``Last-Event-ID`` too (the position decides the body).

A request whose ``If-None-Match`` names the tag (weak comparison, or ``*``) gets ``304``
with the same headers and no body. A running stream's responses are ``no-store``.

Follows RFC 9110 (8.8.3 ``ETag``, 13.1.2 ``If-None-Match``, 12.5.5 ``Vary``, 15.4.5 ``304``)
and RFC 9111 (5.2.2 ``Cache-Control`` response directives).
"""

from __future__ import annotations

import hashlib
from typing import Final

from aiohttp import web

from publisher.history.store import StreamInfo
from publisher.state import KEYS, SETTINGS, STORE

REPRESENTATION: Final = "2"
"""Version of the bytes the routes make of stored events; part of every tag."""
NO_STORE: Final = "no-store"
"""``Cache-Control`` of a running stream's responses."""


class Freshness:
    """The caching headers of one response about a finished stream, and whether the client's copy is current.

    Args:
        etag: The strong tag, quoted.
        max_age_s: ``max-age``, seconds.
        vary: The ``Vary`` header value.
        extra: More ``Cache-Control`` directives (``no-transform`` for event streams).
    """

    __slots__ = ("etag", "headers")

    def __init__(self, etag: str, max_age_s: int, vary: str, extra: str = "") -> None:
        self.etag = etag
        control = f"private, max-age={max_age_s}" + (f", {extra}" if extra else "")
        self.headers: dict[str, str] = {"ETag": etag, "Cache-Control": control, "Vary": vary}
        """``ETag``, ``Cache-Control`` and ``Vary``."""

    def matches(self, request: web.Request) -> bool:
        """Return True when ``If-None-Match`` names this tag (weak comparison) or is ``*``."""
        header = request.headers.get("If-None-Match")
        if header is None:
            return False
        for candidate in header.split(","):
            tag = candidate.strip()
            if tag == "*" or tag.removeprefix("W/") == self.etag:
                return True
        return False

    def not_modified(self) -> web.Response:
        """Return the ``304`` answer (no body, the same caching headers)."""
        return web.Response(status=304, headers=self.headers)


def entity_tag(stream_id: str, info: StreamInfo, route: str, variant: tuple[object, ...]) -> str:
    """Return the strong ``ETag`` (quoted) of one representation of a finished stream.

    Args:
        stream_id: The stream.
        info: Its meta and stored top (``epoch``, ``created_ms`` and ``last_seq`` name the generation).
        route: ``events``, ``ui`` or ``status``.
        variant: What the request chose that changes the bytes (projection, position, ...).
    """
    identity = "\x1f".join([REPRESENTATION, route, stream_id, info.epoch, info.meta.get("created_ms", ""),
                            str(info.last_seq), *map(str, variant)])
    return '"f' + hashlib.blake2b(identity.encode(), digest_size=15).hexdigest() + '"'


async def freshness(request: web.Request, stream_id: str, info: StreamInfo, route: str,
                    variant: tuple[object, ...], *, vary: str = "Authorization", extra: str = "") -> Freshness | None:
    """Return the caching headers of a finished stream's response, or ``None`` for a running one (``no-store``).

    ``None`` too when ``FANOUT_FINISHED_MAX_AGE_S`` is 0, or the stream is known only by its
    tombstone. Reads the meta's ``PTTL`` (one command) for ``max-age``.

    Raises:
        RedisError: The ``PTTL`` failed.
    """
    cap_s = request.app[SETTINGS].finished_max_age_s
    if not (info.known and info.terminal) or cap_s == 0:
        return None
    ttl_ms = await request.app[STORE].redis.pttl(request.app[KEYS].meta(stream_id))
    max_age_s = cap_s if ttl_ms == -1 else max(0, min(cap_s, ttl_ms // 1000))  # -1: no expiry; -2: gone
    return Freshness(entity_tag(stream_id, info, route, variant), max_age_s, vary, extra)
