"""The demo's terminal output: a live progress view while streams run, and the summary table."""

from __future__ import annotations

import time
from typing import TextIO

import msgspec

from schema.contract import Event, StreamDone, StreamError, StreamStart
from schema.job import Provider


class CaseRun(msgspec.Struct, kw_only=True):
    """One demo stream: what was submitted and everything its reader received."""

    provider: Provider
    directory: str
    case: str
    stream_id: str = ""
    events: list[Event] = msgspec.field(default_factory=list)
    first_delta_ts: int | None = None
    resumed_at: int | None = None
    wall_s: float = 0.0
    differences: list[str] = msgspec.field(default_factory=list)

    @property
    def status(self) -> str:
        """Terminal status, or ``running``."""
        last = self.events[-1] if self.events else None
        return last.status if isinstance(last, StreamDone | StreamError) else "running"

    @property
    def ttfd_ms(self) -> int | None:
        """Milliseconds from ``stream.start`` to the first ``block.delta`` (worker clock)."""
        start = self.events[0] if self.events else None
        if not isinstance(start, StreamStart) or self.first_delta_ts is None:
            return None
        return self.first_delta_ts - start.ts

    @property
    def duration_ms(self) -> int | None:
        """Milliseconds from ``stream.start`` to the terminal event (worker clock)."""
        if len(self.events) < 2 or self.status == "running":
            return None
        return self.events[-1].ts - self.events[0].ts


class ProgressView:
    """Prints one line per stream update: seq, events and status, as events arrive.

    On a terminal it redraws one line per stream in place; elsewhere (CI logs, pipes)
    it prints a line when a stream starts, resumes or ends, so logs stay short.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.runs: list[CaseRun] = []
        self._label_width = 0
        self._last_draw = 0.0

    def start(self, runs: list[CaseRun]) -> None:
        """Show the submitted streams."""
        self.runs = runs
        # the longest provider/case, so every bar starts in one column
        self._label_width = max((len(_label(run)) for run in runs), default=0)
        self.out.write(f"following {len(runs)} streams over SSE\n")
        if self.tty:
            self.out.write("\n" * len(runs))
        self._draw(force=True)

    def _line(self, run: CaseRun) -> str:
        bar = "#" * min(30, len(run.events))
        return f"{_label(run):<{self._label_width}} {bar:<30} {len(run.events):>4} ev  {run.status}"

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.tty or (not force and now - self._last_draw < 0.05):
            return
        self._last_draw = now
        self.out.write(f"\x1b[{len(self.runs)}F")
        for run in self.runs:
            self.out.write("\x1b[2K" + self._line(run) + "\n")
        self.out.flush()

    def update(self, run: CaseRun) -> None:
        """Record that ``run`` received an event."""
        if self.tty:
            self._draw()
        elif run.status != "running":
            self.out.write(f"  done  {self._line(run)}\n")

    def note(self, run: CaseRun, text: str) -> None:
        """Print a remark about one stream (a drop and resume)."""
        if self.tty:
            self._draw(force=True)
        self.out.write(f"  note  {run.directory}/{run.case}: {text}\n")
        if self.tty:
            self.out.write("\n" * len(self.runs))

    def finish(self) -> None:
        """Draw the final state of every stream."""
        self._draw(force=True)
        self.out.flush()


def _label(run: CaseRun) -> str:
    return f"{run.directory}/{run.case}"


def summary_table(runs: list[CaseRun]) -> str:
    """Render the summary: stream, provider, case, status, events, time to first delta, duration, match."""
    head = ("stream", "provider", "case", "status", "events", "ttfd ms", "duration ms", "golden")
    rows = [head]
    for run in runs:
        match = "match" if not run.differences else "DIFF"
        if run.resumed_at is not None:
            match += f" (resumed @{run.resumed_at})"
        rows.append((run.stream_id, run.provider, run.case, run.status, str(len(run.events)),
                     _num(run.ttfd_ms), _num(run.duration_ms), match))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)
