"""Where ``fanout export`` writes: NDJSON (a file or stdout) or Parquet (a directory), each batch made durable.

A sink takes the rows of one batch (:class:`tools.export.Row`) with ``write``, makes them
durable with ``commit`` (the exporter acknowledges the batch only after it) and is closed
with ``close``. NDJSON to a regular file is appended (a last line a crash cut short is
removed first) and fsynced; to anything else (stdout, ``/dev/null``, a pipe) only flushed.
Parquet writes each batch as two files renamed into place once complete.
:func:`output_failure` words a failed write for the user.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from tools.export import Row

_encoder: Final = msgspec.json.Encoder()


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
