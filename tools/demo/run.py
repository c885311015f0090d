"""``fanout demo`` (and ``make demo``): the whole stack on one machine, on recorded transcripts.

Starts Redis (``REDIS_URL``, else an embedded server), ``fanout upstream`` replaying
``transcripts/`` as the four providers would, two ``fanout worker`` processes and one
``fanout publisher``; submits one job per demo case over ``POST /v1/streams``; follows
every stream over SSE with a live progress view; drops one reader mid-stream and
resumes it with ``Last-Event-ID``; prints a summary table; and exits 0 only when every
stream's assembled result equals the one its transcript's golden events assemble to.
Every process it started is stopped on the way out. With ``--keep-running`` it first
prints the publisher URL, an API key, the demo page (where a person starts, drops and
resumes streams), the Redis URL and the key prefix, and leaves the stack up afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import time
from typing import Final

from infra.redis_client import REDIS_ERRORS, RedisOptions, connect, primary_clients
from infra.redis_faults import refuses_the_url
from schema import logs
from schema.cli import CommandError, above, at_least, check_redis_url, redact_url, redis_refused, redis_unreachable
from schema.settings import SettingsError, redis_cluster_from_env
from tools.demo.stack import LocalStack
from tools.demo.streams import run_streams
from tools.embedded_redis import redis_url

QUICK_STOP: Final = {"FANOUT_SHUTDOWN_WINDOW_S": "1", "FANOUT_DRAIN_S": "1"}
"""Defaults for the demo's processes (a variable you set wins): Ctrl-C stops the stack in about
a second, not after the production drain (25 s) and SSE close window (10 s)."""


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``demo`` options."""
    parser.add_argument("--keep-running", action="store_true",
                        help="print the URLs, API key, Redis URL and key prefix first; leave the stack up after")
    parser.add_argument("--delay-ms", type=at_least(int, 0), default=40,
                        help="upstream pause between chunks (ms, >= 0)")
    parser.add_argument("--chunk-bytes", type=at_least(int, 1), default=96, help="upstream chunk size (bytes, >= 1)")
    parser.add_argument("--timeout-s", type=above(0.0), default=120.0,
                        help="give up on the demo after this long (seconds, > 0)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 only when every stream matched its golden result (130 when interrupted).

    SIGTERM is handled like Ctrl-C: every process the demo started is stopped.

    Raises:
        CommandError: ``FANOUT_LOG_LEVEL`` or ``FANOUT_LOG_FORMAT`` is malformed (exit 2):
            checked here, as every process of the stack reads them (:mod:`schema.logs`);
            ``REDIS_URL`` is set but not a Redis URL (exit 2) or does not answer (exit 4).
    """
    logs.configure_from_env(os.environ)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args)
    except KeyboardInterrupt:
        sys.stdout.write("demo interrupted; stopped every process it started\n")
        return 130


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


REDIS_CHECK_TIMEOUT_S: Final = 5.0
"""How long the demo waits for ``REDIS_URL`` to answer a PING before it starts anything."""


def check_redis(url: str) -> None:
    """Refuse a ``REDIS_URL`` that is wrong (exit 2) or does not answer (exit 4), before the stack starts.

    Wrong: not a Redis URL, or a user, password or database that Redis refuses.

    Raises:
        CommandError: The URL's scheme is wrong, Redis refused what it says, or Redis did
            not answer within :data:`REDIS_CHECK_TIMEOUT_S`.
    """
    check_redis_url(url)
    try:
        cluster = redis_cluster_from_env(os.environ)
    except SettingsError as exc:
        raise CommandError(str(exc)) from exc

    async def ping() -> None:
        options = RedisOptions(cluster=cluster, socket_timeout_s=REDIS_CHECK_TIMEOUT_S,
                               connect_timeout_s=REDIS_CHECK_TIMEOUT_S, retries=0)
        client = connect(url, options)
        try:
            async with asyncio.timeout(REDIS_CHECK_TIMEOUT_S * 2):
                await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(ping())
    except (*REDIS_ERRORS, OSError, TimeoutError) as exc:
        if refuses_the_url(exc):
            raise redis_refused(url, exc) from exc
        if isinstance(exc, TimeoutError) and not str(exc):
            exc = TimeoutError(f"no answer within {REDIS_CHECK_TIMEOUT_S:g} s")
        error = redis_unreachable(url, exc)
        raise CommandError(f"{error.message}, or unset REDIS_URL for an embedded one",
                           exit_status=error.exit_status) from exc


def _run(args: argparse.Namespace) -> int:
    try:
        redis_cluster_from_env(os.environ)  # the worker and publisher it starts would refuse it later
    except SettingsError as exc:
        raise CommandError(str(exc)) from exc
    if os.environ.get("REDIS_URL"):
        check_redis(os.environ["REDIS_URL"])
    with redis_url() as url:
        source = "REDIS_URL" if os.environ.get("REDIS_URL") else "embedded server"
        shown = f"{redact_url(url)} (REDIS_URL)" if source == "REDIS_URL" else source
        sys.stdout.write(f"redis: {shown}\n")
        prefix = os.environ.get("FANOUT_REDIS_PREFIX") or None  # empty: the stack picks a random one
        stack = LocalStack(url, delay_ms=args.delay_ms, chunk_bytes=args.chunk_bytes, prefix=prefix,
                           env={name: os.environ.get(name, value) for name, value in QUICK_STOP.items()})
        try:
            return _run_stack(args, stack, url, source)
        finally:
            if prefix is None and source == "REDIS_URL":  # the demo's own keys, in the user's Redis
                forget_prefix(url, stack.prefix)


def forget_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix:`` (SCAN on each primary) and say how many; failures are reported, not raised.

    The demo runs under a fresh random prefix; without this, a run against your own
    ``REDIS_URL`` would leave its jobs streams, shard list and finished-streams stream
    behind (they have no TTL). A prefix you chose (``FANOUT_REDIS_PREFIX``) is never touched.
    """
    async def forget() -> int:
        client = connect(url, RedisOptions(cluster=redis_cluster_from_env(os.environ)))
        deleted = 0
        try:
            for node in await primary_clients(client):
                try:
                    async for key in node.scan_iter(match=f"{_glob_literal(prefix)}:*", count=500):
                        deleted += int(await client.delete(key))
                finally:
                    await node.aclose()
        finally:
            await client.aclose()
        return deleted

    try:
        deleted = asyncio.run(forget())
    except (*REDIS_ERRORS, OSError) as exc:
        sys.stdout.write(f"could not remove the demo's keys (prefix {prefix}): {exc}\n")
        return
    sys.stdout.write(f"removed the demo's {deleted} keys (prefix {prefix}) from REDIS_URL\n")


def _glob_literal(text: str) -> str:
    """Return ``text`` as a SCAN ``MATCH`` pattern that matches only itself (glob characters escaped)."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def _run_stack(args: argparse.Namespace, stack: LocalStack, url: str, source: str) -> int:
    """Start ``stack``, run the demo on it, and stop it (after Ctrl-C with ``--keep-running``)."""
    with stack:
        try:
            return _demo_on(args, stack, url, source)
        except KeyboardInterrupt:
            sys.stdout.write("stopping every process the demo started ...\n")
            sys.stdout.flush()
            raise


def _demo_on(args: argparse.Namespace, stack: LocalStack, url: str, source: str) -> int:
    """Run the demo streams on the started ``stack``; with ``--keep-running`` wait for Ctrl-C after."""
    sys.stdout.write(f"started upstream, 2 workers and a publisher ({stack.base_url})\n")
    stack.keep_logs = stack.keep_logs or args.keep_running
    kept = "kept" if args.keep_running else "removed when the demo ends well, kept when not"
    sys.stdout.write(f"processes (logs {kept}):\n{stack.where()}\n")
    if args.keep_running:
        sys.stdout.write(announcement(stack, url, source) + "\n")
        sys.stdout.flush()
    try:
        code = _run_streams(stack, args.timeout_s)
    except TimeoutError:
        stack.keep_logs = True
        sys.stdout.write(f"demo timed out after {args.timeout_s} s; process logs in {stack.logdir}\n")
        return 1
    if args.keep_running:
        try:  # Ctrl-C or SIGTERM: the normal way to stop
            sys.stdout.write(f"\nthe stack is still running: {stack.base_url}/demo "
                             "(Ctrl-C or SIGTERM stops it)\n")
            sys.stdout.flush()
            while stack.alive():
                time.sleep(1)
        except KeyboardInterrupt:
            sys.stdout.write("stopping every process the demo started ...\n")
            sys.stdout.flush()
    return code


def _run_streams(stack: LocalStack, timeout_s: float) -> int:
    """Run :func:`~tools.demo.streams.run_streams` in a loop; SIGTERM cancels it, raises ``KeyboardInterrupt``.

    The process-wide SIGTERM handler (:func:`_interrupt`) raises ``KeyboardInterrupt`` at
    whatever bytecode runs. Inside the loop that may be a callback of aiohttp's C HTTP
    parser, which catches ``BaseException`` and turns it into a payload error on that one
    response: the client then resumes with ``Last-Event-ID`` and the demo runs on, SIGTERM
    lost (seen once in CI, the streams read to their end). While the loop runs, SIGTERM is
    taken by the loop instead
    (``loop.add_signal_handler``) and cancels the streams' task, as ``asyncio.run`` does
    for SIGINT, so the HTTP session closes in order before the stack stops.

    Raises:
        KeyboardInterrupt: SIGTERM or SIGINT arrived.
        TimeoutError: the streams took longer than ``timeout_s`` seconds.
    """
    terminated = False

    async def main() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await asyncio.wait_for(run_streams(stack), timeout=timeout_s)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _interrupt)  # removing it set the default (exit) again

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise


def announcement(stack: LocalStack, url: str, source: str) -> str:
    """Return what a person needs to use the running stack: URLs, API key, Redis and key prefix.

    Printed before the demo streams start. The Redis URL's password, if any, is masked
    (it is the one in ``REDIS_URL``).
    """
    shown = redact_url(url)
    attach = f"redis-cli -s {url.removeprefix('unix://')}" if url.startswith("unix://") else f"redis-cli -u {shown}"
    if shutil.which("redis-cli") is None:
        attach = "(with any Redis client; redis-cli is not on PATH)"
    return (f"\nstack running (Ctrl-C or SIGTERM stops it)\n"
            f"  publisher:  {stack.base_url}\n"
            f"  API key:    {stack.api_key}\n"
            f"  demo page:  {stack.base_url}/demo  (pick a recorded case, start it, drop and resume it)\n"
            f"  redis:      {shown}  ({source})\n"
            f"  key prefix: {stack.prefix}  (events: {stack.prefix}:{{<stream_id>}}:events, "
            f"finished streams: {stack.prefix}:done)\n"
            f"  consumer:   {attach} XREAD BLOCK 0 STREAMS '{stack.prefix}:done' '$'\n"
            f"  in another shell: export FANOUT_URL={stack.base_url} FANOUT_API_KEY={stack.api_key} "
            f"REDIS_URL={shown} FANOUT_REDIS_PREFIX={stack.prefix}\n"
            "  models: any case name in transcripts/<provider dir>/ (prefix slow- to pace it)\n")
