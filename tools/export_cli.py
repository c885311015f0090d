"""``fanout export``: finished streams to NDJSON (a file or stdout) or Parquet, resumable, at-least-once.

See :mod:`tools.export` for the rows and the consumer-group protocol. NDJSON goes to
``--output FILE`` (appended; a line cut by a crash is removed before the rerun writes
again) or ``-`` (stdout). Parquet (``--format parquet``, needs the ``parquet`` extra:
``pip install -e '.[parquet]'`` in a checkout) goes to a directory: each batch is one
``summaries/part-*.parquet`` and one ``events/part-*.parquet``, each renamed into place
once complete. Exit status: 0 caught up (or stopped by SIGINT/SIGTERM with ``--follow``),
1 Redis or the output failed (nothing acknowledged is lost; the message says whether a rerun
can help), 2 bad arguments. ``--output`` may also be ``/dev/null`` or a named pipe: it is then
flushed, not fsynced.
Its log lines (a summary trimmed away while pending) go to stderr in the shared format
(:mod:`schema.logs`), apart from the progress bar and the one-line results.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import re
import signal
import sys
import time
from typing import Final

from infra.redis_client import REDIS_ERRORS, RedisClient, RedisOptions, cluster_mode_mismatch, connect
from schema import logs
from schema.cli import DEFAULT_REDIS_URL, CommandError, check_redis_url, redact_url
from schema.keys import Keys
from schema.settings import SettingsError, redis_cluster_from_env
from tools.export import Exporter
from tools.export_sinks import NdjsonSink, ParquetSink, output_failure, repair_tail

__all__ = ["NdjsonSink", "ParquetSink", "add_arguments", "output_failure", "parse_since", "repair_tail", "run"]

READ_TIMEOUT_S: Final = 30.0
"""Read timeout of the export's Redis connection, seconds: above any ``XREADGROUP BLOCK`` it sends."""
_RELATIVE: Final = re.compile(r"([0-9]+)([smhd])")
_UNITS_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now_ms: int | None = None) -> int:
    """Return ``--since`` as ms since the epoch.

    Accepts ms since the epoch (``1764500000000``), an ISO 8601 time
    (``2026-12-01T09:00:00Z``; UTC when it names no zone), or ``2h``/``30m``/``7d`` ago.

    Raises:
        ValueError: None of those forms.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if text.isdigit():
        return int(text)
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now - int(relative[1]) * _UNITS_S[relative[2]] * 1000
    stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return int(stamp.timestamp() * 1000)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``export`` options."""
    parser.add_argument("--output", "-o", default="-", help="NDJSON file (appended) or - for stdout; "
                        "a directory for parquet")
    parser.add_argument("--format", choices=["ndjson", "parquet"], default="ndjson", help="output format")
    parser.add_argument("--since", default=None, help="only streams finished since: ms since the epoch, "
                        "an ISO 8601 time, or 2h / 30m / 7d ago")
    parser.add_argument("--group", default="export", help="consumer group on P:done: its position is the checkpoint")
    parser.add_argument("--follow", action="store_true", help="keep exporting streams as they finish")
    parser.add_argument("--redis-url", default=None, help=f"Redis URL (env REDIS_URL; default {DEFAULT_REDIS_URL})")
    parser.add_argument("--prefix", default=None, help="key prefix (env FANOUT_REDIS_PREFIX; default fanout)")
    parser.add_argument("--batch", type=_positive, default=100, help="summaries per read and per durable write")


def _positive(text: str) -> int:
    """``--batch``: a whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return int(text)


MAX_SINCE_MS: Final = 2**63 - 1
"""Largest ``--since`` (a Redis stream id's millisecond part is a 64-bit number)."""


def _inputs(args: argparse.Namespace) -> tuple[bool, int]:
    """Return ``FANOUT_REDIS_CLUSTER`` and ``--since`` in ms since the epoch (0 when not given).

    Raises:
        CommandError: A malformed ``FANOUT_REDIS_CLUSTER``, an empty ``--group``, or a
            ``--since`` that is not a time.
    """
    try:
        cluster = redis_cluster_from_env(os.environ)
    except SettingsError as exc:
        raise CommandError(str(exc)) from exc
    if not args.group.strip():
        raise CommandError("--group must name a consumer group, e.g. --group export")
    try:
        since_ms = parse_since(args.since) if args.since else 0
        if not 0 <= since_ms <= MAX_SINCE_MS:
            raise ValueError(args.since)
    except (ValueError, OverflowError):
        raise CommandError(f"--since {args.since!r} is not a time: use ms since the epoch, an ISO 8601 time "
                           "such as 2026-12-01T09:00:00Z, or 2h / 30m / 7d") from None
    return cluster, since_ms


def run(args: argparse.Namespace) -> int:
    """Run the export; return the exit status of the module docstring."""
    logs.configure_from_env(os.environ)
    try:
        cluster, since_ms = _inputs(args)
        url = _redis_url(args)
        sink = _open_sink(args)
    except CommandError as exc:
        sys.stderr.write(f"fanout export: {exc}\n")
        return 2
    keys = Keys(args.prefix or os.environ.get("FANOUT_REDIS_PREFIX") or "fanout")
    try:
        count = asyncio.run(_export(url, keys, sink, args, since_ms, cluster=cluster))
    except REDIS_ERRORS as exc:
        sys.stderr.write(f"fanout export: {_redis_failure(url, exc, cluster=cluster)}\n")
        return 1
    except BrokenPipeError:
        if args.output == "-":  # stdout's reader left (| head): fanout_cli stops quietly
            raise
        sys.stderr.write(f"fanout export: writing {args.output} failed: its reader left; nothing acknowledged "
                         "is lost: run again with a reader on the pipe\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"fanout export: {output_failure(args.output, exc)}\n")
        return 1
    finally:
        sink.close()
    where = "stdout" if args.output == "-" else args.output
    sys.stderr.write(f"fanout export: {count} streams exported to {where}\n")
    return 0


def _redis_url(args: argparse.Namespace) -> str:
    """Return ``--redis-url``, else ``REDIS_URL``, else the default.

    Raises:
        CommandError: It is not a Redis URL.
    """
    url: str = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    check_redis_url(url, source="--redis-url" if args.redis_url else "REDIS_URL")
    return url


def _open_sink(args: argparse.Namespace) -> NdjsonSink | ParquetSink:
    """Open ``--output`` in ``--format``.

    Raises:
        CommandError: Parquet to stdout, Parquet without pyarrow, or an output that cannot be opened.
    """
    if args.format == "parquet" and args.output == "-":
        raise CommandError("--format parquet needs --output DIRECTORY")
    try:
        return ParquetSink(args.output) if args.format == "parquet" else NdjsonSink(args.output)
    except ImportError:
        raise CommandError("--format parquet needs pyarrow, the parquet extra: pip install -e '.[parquet]' "
                           "in the fanout checkout") from None
    except OSError as exc:
        raise CommandError(f"cannot open {args.output}: {exc.strerror}") from None


def _redis_failure(url: str, exc: Exception, *, cluster: bool) -> str:
    """Word a Redis failure of the export (nothing acknowledged is lost either way)."""
    if mismatch := cluster_mode_mismatch(exc, cluster):
        return f"cannot use Redis at {redact_url(url)}: {mismatch}; nothing acknowledged is lost"
    from infra.redis_faults import refuses_the_url  # noqa: PLC0415 - only when wording a failure
    from schema.cli import redis_refused  # noqa: PLC0415

    if refuses_the_url(exc):  # a wrong password or database: running again cannot help
        return f"{redis_refused(url, exc, source='REDIS_URL or --redis-url').message}; nothing acknowledged is lost"
    reason = str(exc).rstrip(". ")
    return f"Redis at {redact_url(url)} failed: {reason}; nothing acknowledged is lost, run again"


async def _export(url: str, keys: Keys, sink: NdjsonSink | ParquetSink, args: argparse.Namespace,
                  since_ms: int, *, cluster: bool) -> int:
    from tqdm import tqdm  # noqa: PLC0415 - only for a terminal

    client = connect(url, RedisOptions(cluster=cluster, client_name=f"fanout-export:{keys.prefix}",
                                       socket_timeout_s=READ_TIMEOUT_S))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bar = tqdm(unit=" streams", file=sys.stderr, disable=not sys.stderr.isatty(), desc="export")
    try:
        exporter = Exporter(client, keys, sink, group=args.group, since_ms=since_ms, batch=max(1, args.batch),
                            on_progress=bar.update)
        if not args.follow and not await client.exists(keys.done):  # a typo'd prefix must not create a key
            sys.stderr.write(f"fanout export: no stream has finished under prefix {keys.prefix!r} "
                             f"({keys.done} does not exist; check FANOUT_REDIS_PREFIX or --prefix)\n")
            return 0
        await exporter.ensure_group()
        bar.total = await exporter.lag()
        count = await _until_stopped(exporter, follow=args.follow, stop=stop)
        if count == 0 and not args.follow:
            await _explain_nothing(client, keys, args.group)
        return count
    finally:
        bar.close()
        await client.aclose()


async def _explain_nothing(client: RedisClient, keys: Keys, group: str) -> None:
    """Say why a run exported nothing when ``P:done`` holds summaries: the group has delivered them all.

    A consumer group's position is the export's checkpoint, so a second run with the same
    ``--group`` starts where the first ended; without this line its ``0 streams exported``
    reads like a failure (the README's second example).
    """
    finished = int(await client.xlen(keys.done))
    if finished == 0:
        sys.stderr.write(f"fanout export: no stream has finished yet under prefix {keys.prefix!r}\n")
        return
    sys.stderr.write(f"fanout export: consumer group {group!r} has already delivered all {finished} finished "
                     f"streams in {keys.done} (its position is the checkpoint; new streams are exported as they "
                     f"finish): to export them again use another group, e.g. --group {group}-2 (with --since "
                     "to choose a window), or keep following with --follow\n")


async def _until_stopped(exporter: Exporter, *, follow: bool, stop: asyncio.Event) -> int:
    """Run the export until it is done or ``stop`` is set; return how many streams it exported.

    On a signal the current batch finishes or stays pending (unacknowledged), never half-written.
    """
    task = asyncio.create_task(exporter.run(follow=follow, stop=stop))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():  # a signal: the current batch finishes or stays pending
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return exporter.exported
    stopped.cancel()
    return task.result()
