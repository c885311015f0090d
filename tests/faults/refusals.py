"""Transient Redis refusals made by real ``redis-server`` processes, to run streams through.

Each :class:`Refusal` turns one server into a state where it answers one error code, and
back: :meth:`Refusal.begin` returns once the server really answers that code (a probe
command on a connection of its own), :meth:`Refusal.end` once it takes writes again.
Both are blocking (redis-py's sync client, ``os.kill``): call them through
``asyncio.to_thread`` from a test whose event loop runs the worker.

=================  ==================================================================  =============
refusal            how                                                                 needs
=================  ==================================================================  =============
``NOREPLICAS``     ``min-replicas-to-write 1``, ``min-replicas-max-lag 1``; the replica  master and a
                   SIGSTOPped (``stop``) or the minimum raised above the replicas       replica
                   there are (``config``, immediate); SIGCONT / the minimum back
``BUSY``           ``busy-reply-threshold 100`` (ms); a read-only Lua busy loop         one node
                   (``#!lua flags=no-writes``, so ``SCRIPT KILL`` ends it) on a thread
``READONLY``       ``REPLICAOF`` a port nobody listens on (the data stays: a replica    one node
                   only flushes once it syncs), then ``REPLICAOF NO ONE``
``MASTERDOWN``     the same with ``replica-serve-stale-data no``: reads refused too     one node
``LOADING``        ``DEBUG RELOAD`` (``enable-debug-command yes``) of a ballast of      one node
                   :data:`BALLAST_KEYS` keys, ``key-load-delay`` per key; the server
                   answers ``LOADING`` while it loads (``loading-process-events-
                   interval-bytes`` small)
``CLUSTERDOWN``    ``CLUSTER DELSLOTS`` of an empty slot (full coverage required:       a cluster
                   the whole cluster fails), then ``CLUSTER ADDSLOTS``
``TRYAGAIN``       the running streams' slots ``MIGRATING`` to a second master         a 2-master
                   (``IMPORTING`` there): a script naming a missing key of such a      cluster
                   slot gets ``TRYAGAIN``; ``SETSLOT ... STABLE`` on both after
=================  ==================================================================  =============

Redis pages followed: replication (``min-replicas-to-write``), SCRIPT KILL and "Scripts
flags", REPLICAOF, redis.conf (``replica-serve-stale-data``, ``busy-reply-threshold``,
``key-load-delay``), DEBUG, CLUSTER DELSLOTS / ADDSLOTS / SETSLOT, Cluster specification
("Multi-key operations during resharding"). Every server counts the error replies it sent
(``INFO errorstats``, :func:`errors_sent`), so a test can prove the code was really sent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_servers import RedisClusterServers, RedisServer, free_port

GUARD_S = 15.0
"""Hang guard of one transition (a refusal starting or ending), seconds."""
BALLAST_KEYS = 20_000
"""Keys ``DEBUG RELOAD`` loads for :class:`Loading`."""
PROBE_KEY = "refusal-probe"
"""Key the probes write (in no stream's slot that matters: a test prefix never starts so)."""
BUSY_SCRIPT = """#!lua flags=no-writes
local t0 = redis.call('TIME')
local start = t0[1] * 1000000 + t0[2]
while true do
  local t = redis.call('TIME')
  if t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) then return 1 end
end
"""
"""A read-only busy loop of ARGV[1] microseconds (read-only: ``SCRIPT KILL`` may end it)."""


def probe_client(server: RedisServer, timeout_s: float = 5.0) -> redis.Redis:
    """A sync client of ``server`` that never retries: redis-py's default retries a ``LOADING`` reply until it ends."""
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


def errors_sent(server: RedisServer, code: str) -> int:
    """How many ``code`` error replies ``server`` sent since it started (``INFO errorstats``)."""
    with probe_client(server) as client:
        stats = client.info("errorstats")
    return int(stats.get(f"errorstat_{code}", {}).get("count", 0))


_CODE_OF_CLASS: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.BusyLoadingError, "LOADING"), (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"), (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"), (redis.exceptions.MovedError, "MOVED"),
)
"""redis-py classes that drop the code from the message (its ``_parsers/base.py``), most specific first."""


def _answer(server: RedisServer, *command: str | int) -> str:
    """Send one command on a fresh connection; return ``OK``, or the code of the error it got."""
    with probe_client(server) as client:
        try:
            client.execute_command(*command)
        except redis.exceptions.RedisError as exc:
            code = next((code for cls, code in _CODE_OF_CLASS if isinstance(exc, cls)), "")
            return code or str(exc).split(" ", 1)[0]
    return "OK"


def owned_key(server: RedisServer) -> str:
    """A key whose slot ``server`` serves (any key on a single node)."""
    with probe_client(server) as client:
        if not client.info("cluster").get("cluster_enabled"):
            return PROBE_KEY
        for n in range(10_000):
            key = f"{PROBE_KEY}-{n}"
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            if any(lo <= slot <= hi and int(owner[1]) == server.port
                   for lo, hi, owner, *_ in client.execute_command("CLUSTER", "SLOTS")):
                return key
    raise AssertionError("no key of this node's slots found")


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"refusal: {what} not reached within {GUARD_S} s")
        time.sleep(0.02)


class Refusal:
    """One way of making a server answer :attr:`code`; :meth:`begin`, then :meth:`end`."""

    code = ""
    server: RedisServer
    probe: tuple[str | int, ...] = ("SET", PROBE_KEY, "1")
    """The command that gets :attr:`code` while the refusal lasts, and no error before and after."""

    def begin(self) -> None:
        """Start refusing; return once :attr:`probe` answers :attr:`code`."""
        self._start()
        _wait(lambda: _answer(self.server, *self.probe) == self.code, f"{self.code} starting")

    def end(self) -> None:
        """Stop refusing; return once :attr:`probe` is answered without an error."""
        self._stop()
        _wait(lambda: _answer(self.server, *self.probe) == "OK", f"{self.code} ending")

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError


class NoReplicas(Refusal):
    """``NOREPLICAS`` on ``master`` (module table); ``mode`` ``stop`` freezes the replica, ``config`` is immediate."""

    code = "NOREPLICAS"

    def __init__(self, master: RedisServer, replica: RedisServer, mode: Literal["stop", "config"] = "stop") -> None:
        self.server, self.replica, self.mode = master, replica, mode

    @staticmethod
    def attach(master: RedisServer, replica: RedisServer) -> None:
        """Make ``replica`` a replica of ``master`` and require one good replica per write (lag 1 s)."""
        with probe_client(replica) as client:
            client.replicaof("127.0.0.1", master.port)
        with probe_client(master) as client:
            _wait(lambda: client.info("replication").get("connected_slaves") == 1, "replica attached")
            client.config_set("min-replicas-max-lag", 1)
            client.config_set("min-replicas-to-write", 1)
        _wait(lambda: _answer(master, "SET", PROBE_KEY, "1") == "OK", "the replica in sync")

    def _start(self) -> None:
        if self.mode == "config":
            with probe_client(self.server) as client:
                client.config_set("min-replicas-to-write", 2)
        else:
            assert self.replica.proc is not None
            os.kill(self.replica.proc.pid, signal.SIGSTOP)

    def _stop(self) -> None:
        if self.mode == "config":
            with probe_client(self.server) as client:
                client.config_set("min-replicas-to-write", 1)
        else:
            assert self.replica.proc is not None
            os.kill(self.replica.proc.pid, signal.SIGCONT)


class Busy(Refusal):
    """``BUSY``: a read-only script busy for up to :attr:`max_s` on a thread; :meth:`end` kills it."""

    code = "BUSY"
    probe = ("PING",)

    def __init__(self, server: RedisServer, max_s: float = 10.0) -> None:
        self.server, self.max_s = server, max_s
        self._thread: threading.Thread | None = None
        with probe_client(server) as client:
            client.config_set("busy-reply-threshold", 100)

    def _run(self) -> None:
        with contextlib.suppress(redis.exceptions.ResponseError), \
                probe_client(self.server, self.max_s + GUARD_S) as client:
            client.eval(BUSY_SCRIPT, 0, int(self.max_s * 1_000_000))  # ends "Script killed by user"

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="busy-script", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        _wait(lambda: _answer(self.server, "SCRIPT", "KILL") in ("OK", "NOTBUSY"), "SCRIPT KILL")
        assert self._thread is not None
        self._thread.join(GUARD_S)


class ReadOnly(Refusal):
    """``READONLY``: ``server`` becomes a replica of a port nobody listens on, then a master again."""

    code = "READONLY"
    stale_data = "yes"

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def _start(self) -> None:
        with probe_client(self.server) as client:
            client.config_set("replica-serve-stale-data", self.stale_data)
            client.replicaof("127.0.0.1", free_port(cluster=False))

    def _stop(self) -> None:
        with probe_client(self.server) as client:
            client.replicaof("NO", "ONE")
            client.config_set("replica-serve-stale-data", "yes")


class MasterDown(ReadOnly):
    """``MASTERDOWN``: :class:`ReadOnly` with ``replica-serve-stale-data no`` (reads refused too)."""

    code = "MASTERDOWN"
    stale_data = "no"
    probe = ("GET", PROBE_KEY)


class Loading(Refusal):
    """``LOADING``: ``DEBUG RELOAD`` of :data:`BALLAST_KEYS` keys taking about ``load_s`` (a thread waits for it)."""

    code = "LOADING"
    probe = ("PING",)

    def __init__(self, server: RedisServer, load_s: float = 1.5) -> None:
        self.server = server
        self._thread: threading.Thread | None = None
        with probe_client(server) as client:
            client.execute_command("DEBUG", "POPULATE", BALLAST_KEYS, "ballast")
            client.config_set("key-load-delay", max(1, int(load_s * 1_000_000 / BALLAST_KEYS)))
            client.config_set("loading-process-events-interval-bytes", 1024)

    def _reload(self) -> None:
        try:
            with probe_client(self.server, GUARD_S) as client:
                client.execute_command("DEBUG", "RELOAD")
        except redis.exceptions.RedisError as exc:  # seen by begin(), which then waits in vain: say why
            self.failed = exc

    def _start(self) -> None:
        self.failed: redis.exceptions.RedisError | None = None
        with probe_client(self.server) as client:  # DEBUG RELOAD saves first: not while a save for a replica runs
            _wait(lambda: not client.info("persistence").get("rdb_bgsave_in_progress"), "no save running")
        self._thread = threading.Thread(target=self._reload, name="debug-reload", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        assert self._thread is not None
        self._thread.join(GUARD_S)  # the load ends by itself
        assert self.failed is None, f"DEBUG RELOAD failed: {self.failed}"


class ClusterDown(Refusal):
    """``CLUSTERDOWN``: a slot holding no key is taken from the first master, then given back."""

    code = "CLUSTERDOWN"

    def __init__(self, cluster: RedisClusterServers) -> None:
        self.cluster, self.server = cluster, cluster.nodes[0]
        self.probe = ("SET", owned_key(self.server), "1")
        self.slot = -1

    def _start(self) -> None:
        with probe_client(self.server) as client:
            owned = [(lo, hi) for lo, hi, owner, *_ in client.execute_command("CLUSTER", "SLOTS")
                     if int(owner[1]) == self.server.port]
            self.slot = next(s for lo, hi in owned for s in range(lo, hi + 1)
                             if not client.execute_command("CLUSTER", "COUNTKEYSINSLOT", s))
            client.execute_command("CLUSTER", "DELSLOTS", self.slot)

    def _stop(self) -> None:
        with probe_client(self.server) as client:
            client.execute_command("CLUSTER", "ADDSLOTS", self.slot)


class TryAgain(Refusal):
    """``TRYAGAIN``: the slots of ``keys_of_slots`` ``MIGRATING`` from their master to another (``IMPORTING`` there).

    The probe is a script naming the first key (which must exist) and a missing key of its slot.
    """

    code = "TRYAGAIN"

    def __init__(self, cluster: RedisClusterServers, keys_of_slots: list[str]) -> None:
        masters = cluster.nodes[: cluster.masters]
        with probe_client(masters[0]) as client:
            slots = sorted({int(client.execute_command("CLUSTER", "KEYSLOT", key)) for key in keys_of_slots})
            first = int(client.execute_command("CLUSTER", "KEYSLOT", keys_of_slots[0]))
            owners = {slot: _owner(client, slot) for slot in slots}
        by_port = {node.port: node for node in masters}
        self.moves = [(slot, by_port[port], next(n for n in masters if n.port != port))
                      for slot, port in owners.items()]
        self.server = by_port[owners[first]]
        self.probe = ("EVAL", "return redis.call('EXISTS', KEYS[1], KEYS[2])", 2, keys_of_slots[0],
                      f"{keys_of_slots[0]}-absent")

    def _start(self) -> None:
        for slot, source, target in self.moves:
            with probe_client(source) as src, probe_client(target) as dst:
                dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _my_id(src))
                src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _my_id(dst))

    def _stop(self) -> None:
        for slot, source, target in self.moves:
            with probe_client(source) as src, probe_client(target) as dst:
                src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
                dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def _owner(client: redis.Redis, slot: int) -> int:
    """Port of the master serving ``slot``."""
    return next(int(owner[1]) for lo, hi, owner, *_ in client.execute_command("CLUSTER", "SLOTS") if lo <= slot <= hi)


def _my_id(client: redis.Redis) -> str:
    return str(client.execute_command("CLUSTER", "MYID").decode())
