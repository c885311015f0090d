"""Pace of status reads: a token bucket per credential, so one cannot make the publisher write results non-stop.

``FANOUT_MAX_STATUS_READS_PER_*`` bounds how many status requests one credential has in flight,
not how often it asks: two requests of one read token asked again as soon as answered pulled a
2 MB result at 750 MB/s, a core's worth of writing (issue 21 item 3). Each credential here has a
bucket of ``FANOUT_STATUS_READ_BURST_PER_*`` requests, refilled at
``FANOUT_STATUS_READ_RATE_PER_*`` a second; a request takes one, or is refused with the seconds
until one is back (the ``Retry-After`` of its 429).

The bucket counts requests, not bytes of results. A request is counted on arrival, before
anything is read, so a refusal costs no Redis read and no result; its answer's size is unknown
then (the result is assembled or looked up after). The bytes one credential makes the publisher
write per second are still bounded, by the rate times the largest result it may read, and a
client that polls the status of a small stream is paced the same as one that polls a big one:
what a poller decides is how often it asks. Requests arrive on one event loop, so no lock.

Memory: a bucket is kept under its credential's digest (16 bytes); one that has refilled holds
nothing a fresh one would not, so it is dropped when the oldest are looked at (on every take);
past ``FANOUT_STATUS_READ_BUCKETS`` buckets of one kind the least recently used is dropped
(its credential may then make one burst more). Imports no redis or aiohttp.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Literal

RateKind = Literal["token", "key"]
"""Whose requests are paced: a read token's, or an API key's."""

RATE_SETTINGS: Final[dict[RateKind, tuple[str, str]]] = {
    "token": ("FANOUT_STATUS_READ_RATE_PER_TOKEN", "FANOUT_STATUS_READ_BURST_PER_TOKEN"),
    "key": ("FANOUT_STATUS_READ_RATE_PER_KEY", "FANOUT_STATUS_READ_BURST_PER_KEY"),
}
"""The settings of each kind's rate and burst, named in refusals."""
_SWEEP: Final = 2
"""Oldest buckets looked at per take: more than one, so the dropped outpace the new."""


class RateBuckets:
    """Token buckets of one kind of credential, keyed by the credential's digest.

    Args:
        rate: Requests per second refilled; 0 disables the pace (every take succeeds, nothing kept).
        burst: Requests a full bucket holds (``>= 1``).
        max_buckets: Buckets kept at most; past it the least recently used is dropped.
        clock: Monotonic seconds (``time.monotonic``; a test may pass its own).
    """

    def __init__(self, rate: float, burst: int, max_buckets: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        """Requests per second refilled (0: no pace)."""
        self.burst = burst
        """Requests a full bucket holds."""
        self.clock = clock
        """Monotonic seconds (a test may replace it, to step time exactly)."""
        self._max = max_buckets
        self._idle_s = burst / rate if rate else 0.0  # a bucket untouched this long is full again
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # digest -> (tokens, at)

    def __len__(self) -> int:
        """Return how many buckets are kept."""
        return len(self._buckets)

    def take(self, who: bytes) -> float:
        """Take one request from ``who``'s bucket; return 0.0, or the seconds until it holds one (refused).

        Args:
            who: The credential's digest.

        Returns:
            0.0 when the request is taken; otherwise the seconds (> 0) until one request is back,
            nothing taken.
        """
        if not self.rate:
            return 0.0
        now = self.clock()
        self._sweep(now)
        tokens, at = self._buckets.pop(who, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[who] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[who] = (tokens - 1.0, now)
        if len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return 0.0

    def _sweep(self, now: float) -> None:
        """Drop the oldest buckets that have refilled (each untouched for ``burst / rate`` seconds)."""
        for _ in range(_SWEEP):
            oldest = next(iter(self._buckets.values()), None)
            if oldest is None or now - oldest[1] < self._idle_s:
                return
            self._buckets.popitem(last=False)


def retry_after_s(wait_s: float) -> int:
    """Return the ``Retry-After`` of a wait: whole seconds, rounded up, at least 1 (RFC 9110 section 10.2.3)."""
    return max(1, math.ceil(wait_s))
