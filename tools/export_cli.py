"""``fanout export``: finished streams to NDJSON (a file or stdout) or Parquet, resumable, at-least-once.

See :mod:`tools.export` for the rows and the consumer-group protocol. NDJSON goes to
``--output FILE`` (appended; a line cut by a crash is removed before the rerun writes
again) or ``-`` (stdout). Parquet (``--format parquet``, needs the ``parquet`` extra:
``pip install 'fanout[parquet]'``) goes to a directory: each batch is one
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
import errno
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from infra.redis_client import REDIS_ERRORS, RedisClient, RedisOptions, cluster_mode_mismatch, connect
from schema import logs
from schema.cli import DEFAULT_REDIS_URL, CommandError, check_redis_url, redact_url
from schema.keys import Keys
from schema.settings import SettingsError, redis_cluster_from_env
from tools.export import Exporter, Row

READ_TIMEOUT_S: Final = 30.0
"""Read timeout of the export's Redis connection, seconds: above any ``XREADGROUP BLOCK`` it sends."""
_RELATIVE: Final = re.compile(r"([0-9]+)([smhd])")
_UNITS_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_encoder: Final = msgspec.json.Encoder()


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


def repair_tail(path: Path, step: int = 65536) -> None:
    """Cut a last line that a crash left without its newline (its batch was never acknowledged)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as file:
        end = file.seek(0, os.SEEK_END)
        file.seek(end - 1)
        if file.read(1) == b"\n":
            return
        keep, position = 0, end
        while position > 0:
            start = max(0, position - step)
            file.seek(start)
            cut = file.read(position - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            position = start
        file.truncate(keep)


class NdjsonSink:
    """One JSON object per line, to a file or to stdout (``-``).

    A regular file is appended to, its crash-cut last line removed first (:func:`repair_tail`),
    and fsynced at each commit. Anything else (``/dev/null``, a named pipe, a terminal) is
    only flushed: it cannot be seeked, truncated or fsynced (``fsync`` fails with ``EINVAL``).
    """

    def __init__(self, output: str) -> None:
        self.owned = output != "-"
        if not self.owned:
            self.file: IO[bytes] = sys.stdout.buffer
            self.sync = False
            return
        path = Path(output)
        if path.is_file():
            repair_tail(path)
        self.file = path.open("ab")
        self.sync = stat.S_ISREG(os.fstat(self.file.fileno()).st_mode)

    def write(self, rows: list[Row]) -> None:
        """Write the rows as lines."""
        self.file.write(b"".join(_encoder.encode(row) + b"\n" for row in rows))

    def commit(self) -> None:
        """Flush, and fsync a regular file."""
        self.file.flush()
        if self.sync:
            os.fsync(self.file.fileno())

    def close(self) -> None:
        """Close a file (stdout stays open); never raises.

        Whatever is still buffered here belongs to a batch whose write failed, which was
        never acknowledged: a second failure flushing it (``ENOSPC`` again) is dropped, as
        the first one was already reported.
        """
        if self.owned:
            with contextlib.suppress(OSError):
                self.file.close()


class ParquetSink:
    """Each committed batch as ``summaries/part-*.parquet`` and ``events/part-*.parquet`` under a directory."""

    def __init__(self, output: str) -> None:
        import pyarrow  # noqa: PLC0415 - optional extra
        import pyarrow.parquet  # noqa: PLC0415

        self.pa, self.pq = pyarrow, pyarrow.parquet
        self.root = Path(output)
        for part in ("summaries", "events"):
            (self.root / part).mkdir(parents=True, exist_ok=True)
        self.rows: list[Row] = []

    def write(self, rows: list[Row]) -> None:
        """Buffer the rows of the batch."""
        self.rows += rows

    def commit(self) -> None:
        """Write the batch's two files under temporary names, fsync, rename them into place."""
        name = f"part-{time.time_ns()}.parquet"
        summaries = [r for r in self.rows if r["kind"] == "summary"]
        expired = {r["stream_id"]: r["detail"] for r in self.rows if r["kind"] == "expired"}
        regenerated = {r["stream_id"]: r["detail"] for r in self.rows if r["kind"] == "regenerated"}
        summaries = [{**{k: v for k, v in r.items() if k != "kind"}, "expired_detail": expired.get(r["stream_id"]),
                      "regenerated_detail": regenerated.get(r["stream_id"])} for r in summaries]
        events = [{"stream_id": r["stream_id"], "seq": r["seq"], "event": bytes(r["event"]).decode()}
                  for r in self.rows if r["kind"] == "event"]
        self._write("summaries", name, summaries)
        self._write("events", name, events)
        self.rows = []

    def _write(self, part: str, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        final = self.root / part / name
        temp = final.with_suffix(".tmp")
        self.pq.write_table(self.pa.Table.from_pylist(rows), temp)
        with temp.open("rb") as file:
            os.fsync(file.fileno())
        temp.replace(final)

    def close(self) -> None:
        """Nothing is left open between batches."""


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


RETRY_HELPS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR, errno.ENOMEM,
                                errno.ETIMEDOUT, errno.ESTALE})
"""Errors of the output that a later run may not meet (a full disk, a flaky NFS mount)."""


def output_failure(output: str, exc: OSError) -> str:
    """Word a failed write of ``--output``: say "run again" only when running again can succeed.

    Args:
        output: The ``--output`` value.
        exc: What the write, flush, fsync or rename raised; its ``errno`` is checked
            against :data:`RETRY_HELPS`.
    """
    reason = exc.strerror or str(exc)
    if exc.errno in RETRY_HELPS:
        return f"writing {output} failed: {reason}; nothing acknowledged is lost: run again once that is fixed"
    return (f"writing {output} failed: {reason}; nothing acknowledged is lost, but a rerun to the same output "
            "fails the same way: choose another --output (a file, a pipe, a directory for parquet, or -)")


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
    except CommandError as exc:
        sys.stderr.write(f"fanout export: {exc}\n")
        return 2
    url = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    try:
        check_redis_url(url, source="--redis-url" if args.redis_url else "REDIS_URL")
    except CommandError as exc:
        sys.stderr.write(f"fanout export: {exc}\n")
        return 2
    if args.format == "parquet" and args.output == "-":
        sys.stderr.write("fanout export: --format parquet needs --output DIRECTORY\n")
        return 2
    try:
        parquet = args.format == "parquet"
        sink: NdjsonSink | ParquetSink = ParquetSink(args.output) if parquet else NdjsonSink(args.output)
    except ImportError:
        sys.stderr.write("fanout export: --format parquet needs pyarrow: pip install 'fanout[parquet]'\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"fanout export: cannot open {args.output}: {exc.strerror}\n")
        return 2
    keys = Keys(args.prefix or os.environ.get("FANOUT_REDIS_PREFIX") or "fanout")
    try:
        count = asyncio.run(_export(url, keys, sink, args, since_ms, cluster=cluster))
    except REDIS_ERRORS as exc:
        if mismatch := cluster_mode_mismatch(exc, cluster):
            sys.stderr.write(f"fanout export: cannot use Redis at {redact_url(url)}: {mismatch}; "
                             "nothing acknowledged is lost\n")
            return 1
        reason = str(exc).rstrip(". ")
        sys.stderr.write(f"fanout export: Redis at {redact_url(url)} failed: {reason}; "
                         "nothing acknowledged is lost, run again\n")
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
        task = asyncio.create_task(exporter.run(follow=args.follow, stop=stop))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # a signal: the current batch finishes or stays pending
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return exporter.exported
        stopped.cancel()
        count: int = task.result()
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
