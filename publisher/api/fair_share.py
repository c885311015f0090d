"""Fair shares: limits on what one credential (or one client address) holds at once.

Each request of a limited route holds one place under the one who sent it, from its
arrival until its response ends, counted against that kind's limit:

=====================  =========================================  ===============================
sent with              counted under                              limits (``FANOUT_*``)
=====================  =========================================  ===============================
a read token           a digest of the token                      ``MAX_*_PER_TOKEN``
an API key             a digest of the key                        ``MAX_*_PER_KEY``
no credential          the client address (see trusted proxies)   ``MAX_*_PER_ADDRESS``
=====================  =========================================  ===============================

for two routes: ``sse`` (open ``/events`` and ``/ui`` responses: ``MAX_CONNECTIONS_*``) and
``status`` (``GET /v1/streams/{id}`` in flight, and ``GET /readyz`` per address:
``MAX_STATUS_READS_*``). Limits are inclusive: the request that would hold one place more
than the limit is refused (:class:`ShareExceededError`, a 429 ``too-many-requests`` with
``Retry-After``; ``/events`` answers its busy 200 instead), both hinting
``FANOUT_SHARE_RETRY_AFTER_S``; so one credential at its limit never takes what others are
served with. A status read is also paced (``paced``: ``FANOUT_STATUS_READ_RATE_PER_*``, a
token bucket per credential, :mod:`publisher.api.status_rate`): past its bucket, a 429 whose
``Retry-After`` is the wait until the bucket holds one request again. Only credentials that
:func:`publisher.api.auth.authorize_read` accepted are counted by digest (BLAKE2b, 16 bytes:
the credential itself is never kept). The client address is the socket's peer; only when
the peer is one of ``FANOUT_TRUSTED_PROXIES`` is it the rightmost ``X-Forwarded-For``
address that is not (RFC 7239 section 5.2's caution: only hops we trust may be believed).
Imports no redis.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Callable
from typing import Final, Literal

from aiohttp import web

from publisher.api.auth import bearer
from publisher.api.problems import ProblemError
from publisher.api.status_rate import RATE_SETTINGS, RateBuckets, RateKind, retry_after_s
from publisher.api.tokens import TOKEN_PREFIX
from publisher.settings import PublisherSettings, proxy_networks

Route = Literal["sse", "status"]
"""What a place is held for: an open SSE response, or a status request in flight."""
Kind = Literal["token", "key", "address"]
"""Who holds it: a read token, an API key, or a client address (no credential)."""

DIGEST_BYTES: Final = 16
"""Size of a credential's digest (BLAKE2b), the key it is counted under."""
SETTING_NAMES: Final[dict[tuple[Route, Kind], str]] = {
    ("sse", "token"): "FANOUT_MAX_CONNECTIONS_PER_TOKEN",
    ("sse", "key"): "FANOUT_MAX_CONNECTIONS_PER_KEY",
    ("sse", "address"): "FANOUT_MAX_CONNECTIONS_PER_ADDRESS",
    ("status", "token"): "FANOUT_MAX_STATUS_READS_PER_TOKEN",
    ("status", "key"): "FANOUT_MAX_STATUS_READS_PER_KEY",
    ("status", "address"): "FANOUT_MAX_STATUS_READS_PER_ADDRESS",
}
"""The setting of each limit, named in refusals."""
_WHO: Final[dict[Kind, str]] = {"token": "read token", "key": "API key", "address": "client address"}
_WHAT: Final[dict[Route, str]] = {"sse": "open event streams", "status": "status requests in flight"}

Holder = tuple[Route, Kind, bytes | str]


class ShareExceededError(ProblemError):
    """One more place than its limit was asked for: a 429 ``too-many-requests`` with ``Retry-After``.

    Args:
        route: The route of the place.
        kind: Who asked.
        limit: The limit reached.
        retry_after_s: The ``Retry-After`` hint, seconds.
    """

    def __init__(self, route: Route, kind: Kind, limit: int, retry_after_s: int) -> None:
        name = SETTING_NAMES[route, kind]
        super().__init__("too-many-requests",
                         f"this {_WHO[kind]} already has {limit} {_WHAT[route]}, its limit ({name}); "
                         f"retry after {retry_after_s} s or when one ends",
                         headers={"Retry-After": str(retry_after_s)}, extensions={"limit": limit})


class RateExceededError(ProblemError):
    """A status read past its credential's bucket: a 429 ``too-many-requests`` with ``Retry-After``.

    Args:
        kind: Whose bucket is empty.
        buckets: Its kind's buckets (their rate and burst are named).
        wait_s: Seconds until the bucket holds one request again.
    """

    def __init__(self, kind: RateKind, buckets: RateBuckets, wait_s: float) -> None:
        rate_name, burst_name = RATE_SETTINGS[kind]
        retry = retry_after_s(wait_s)
        super().__init__("too-many-requests",
                         f"this {_WHO[kind]} made its {buckets.burst} status requests ({burst_name}), paced at "
                         f"{buckets.rate:g} a second ({rate_name}); retry after {retry} s",
                         headers={"Retry-After": str(retry)}, extensions={"limit": buckets.burst})


class Claim:
    """One place held under a fair share; :meth:`release` gives it back (once; later calls do nothing)."""

    __slots__ = ("_counts", "_holder")

    def __init__(self, counts: dict[Holder, int], holder: Holder) -> None:
        self._counts = counts
        self._holder: Holder | None = holder

    def release(self) -> None:
        """Give the place back."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        left = self._counts[holder] - 1
        if left:
            self._counts[holder] = left
        else:
            del self._counts[holder]


class FairShares:
    """The places held in this process, per route and holder.

    Args:
        settings: The limits (``max_connections_per_*``, ``max_status_reads_per_*``), the
            trusted proxies and ``share_retry_after_s`` (the ``Retry-After`` of a refusal).
        refused: Refusals counted per route (``Telemetry.shares_refused``: plain ints the
            meter reads, so a refusal costs no metrics call).
        clock: Monotonic seconds of the status-read buckets (``time.monotonic``).

    Raises:
        SettingsError: A ``FANOUT_TRUSTED_PROXIES`` entry that is no address or network.
    """

    def __init__(self, settings: PublisherSettings, refused: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limits: dict[tuple[Route, Kind], int] = {
            ("sse", "token"): settings.max_connections_per_token,
            ("sse", "key"): settings.max_connections_per_key,
            ("sse", "address"): settings.max_connections_per_address,
            ("status", "token"): settings.max_status_reads_per_token,
            ("status", "key"): settings.max_status_reads_per_key,
            ("status", "address"): settings.max_status_reads_per_address,
        }
        self._proxies = proxy_networks(settings.trusted_proxies)
        self.retry_after_s = settings.share_retry_after_s
        """The ``Retry-After`` of a refusal (``FANOUT_SHARE_RETRY_AFTER_S``), seconds."""
        self._refused = refused if refused is not None else {}
        self._counts: dict[Holder, int] = {}
        self.paces: dict[RateKind, RateBuckets] = {
            "token": RateBuckets(settings.status_read_rate_per_token, settings.status_read_burst_per_token,
                                 settings.status_read_buckets, clock),
            "key": RateBuckets(settings.status_read_rate_per_key, settings.status_read_burst_per_key,
                               settings.status_read_buckets, clock),
        }
        """The status-read buckets per kind of credential (an address is not paced)."""

    def take(self, request: web.Request, route: Route, *, anonymous: bool = False) -> Claim | None:
        """Take one place for ``request`` on ``route``, or return ``None`` when its holder has its limit.

        The caller releases a place taken when the response ends.

        Args:
            request: A request whose credential (if any) was accepted.
            route: ``sse`` or ``status``.
            anonymous: Count it under the client address whatever it carries (a route that
                checks no credential must not count one it never verified).
        """
        holder: Holder = (route, *self._holder(request, anonymous))
        held = self._counts.get(holder, 0)
        if held >= self._limits[route, holder[1]]:
            self._refused[route] = self._refused.get(route, 0) + 1
            return None
        self._counts[holder] = held + 1
        return Claim(self._counts, holder)

    def claim(self, request: web.Request, route: Route, *, anonymous: bool = False, paced: bool = False) -> Claim:
        """Take one place as :meth:`take` does, or refuse with the problem owed.

        Args:
            request: As :meth:`take`.
            route: As :meth:`take`.
            anonymous: As :meth:`take`.
            paced: Also take one request from the credential's status-read bucket (once the
                place is taken: a request refused for its place takes nothing from it).

        Raises:
            ShareExceededError: The holder already has its limit of places on ``route``.
            RateExceededError: ``paced`` and the credential's bucket is empty.
        """
        claim = self.take(request, route, anonymous=anonymous)
        kind, who = self._holder(request, anonymous)
        if claim is None:
            raise ShareExceededError(route, kind, self._limits[route, kind], self.retry_after_s)
        if paced and kind != "address" and isinstance(who, bytes):
            wait_s = self.paces[kind].take(who)
            if wait_s:
                claim.release()
                self._refused[route] = self._refused.get(route, 0) + 1
                raise RateExceededError(kind, self.paces[kind], wait_s)
        return claim

    def _holder(self, request: web.Request, anonymous: bool) -> tuple[Kind, bytes | str]:
        return ("address", self.client_address(request)) if anonymous else self.identity(request)

    def held(self, route: Route) -> int:
        """Return how many places are held on ``route``, by every holder together."""
        return sum(count for (held_route, _, _), count in self._counts.items() if held_route == route)

    def identity(self, request: web.Request) -> tuple[Kind, bytes | str]:
        """Return who sent ``request``: ``(token|key, digest)``, or ``("address", address)`` without a credential.

        The credential is found where :func:`publisher.api.auth.authorize_read` takes it: the
        ``Authorization: Bearer`` header, else the ``token`` query parameter.
        """
        credential = bearer(request) or request.query.get("token", "")
        if not credential:
            return "address", self.client_address(request)
        digest = hashlib.blake2b(credential.encode("utf-8", "surrogateescape"), digest_size=DIGEST_BYTES).digest()
        return ("token" if credential.startswith(TOKEN_PREFIX) else "key"), digest

    def client_address(self, request: web.Request) -> str:
        """Return the client's address: the peer's, or behind trusted proxies the nearest untrusted hop's.

        The hops are the comma-separated ``X-Forwarded-For`` values (every such header, in
        order), read from the right; a hop that is not an IP address ends the walk at the peer.
        """
        peer = request.remote or ""
        if not self._trusted(peer):
            return peer
        hops = [hop.strip() for value in request.headers.getall("X-Forwarded-For", ()) for hop in value.split(",")]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return _canonical(hop) or peer
        return peer

    def _trusted(self, address: str) -> bool:
        if not self._proxies:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._proxies)


def _canonical(address: str) -> str:
    """Return an IP address in its one written form, or ``""`` when ``address`` is none."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return ""

