"""One stream's checked event output: numbers each event, checks it against the state machine, holds it.

One job: the base of :class:`~worker.normalizer.Normalizer`. Each event is built with the
next ``seq`` and the injected clock's ``ts``, checked against :mod:`schema.states` (the
table the validator uses; a violation is our bug, :class:`~schema.errors.InternalError`),
held until :meth:`EventOutbox.take`, and the first terminal event is kept. After it,
every further operation is counted under ``after_terminal`` and ignored.

Pure: imports no asyncio, aiohttp, redis or opentelemetry, and nothing of the worker's
I/O shell; the clock is injected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from schema.contract import Event, StreamDone, StreamError
from schema.errors import InternalError
from schema.states import StreamMachine


class EventOutbox:
    """The ordered, checked events of one stream, waiting to be taken.

    Args:
        clock: Returns the current time in milliseconds since the Unix epoch.
        stored_seq: Events of this stream already stored (numbering continues after it;
            a stream with ``stream.start`` stored is already open).
    """

    def __init__(self, *, clock: Callable[[], int], stored_seq: int = 0) -> None:
        self.ignored: Counter[str] = Counter()
        """Provider events skipped, by name (``after_terminal`` for anything after the end)."""
        self.terminal: Event | None = None
        """The terminal event, once emitted."""
        self._clock = clock
        self._seq = stored_seq
        self._machine = StreamMachine()
        self._machine.state = "open" if stored_seq else "idle"
        self._machine.last_seq = stored_seq
        self._outbox: list[Event] = []

    def take(self) -> list[Event]:
        """Return and forget the events emitted since the last call, in seq order."""
        out, self._outbox = self._outbox, []
        return out

    def ignore(self, name: str) -> None:
        """Count one provider event skipped because this version does not use it."""
        self.ignored[name or "unnamed"] += 1

    def _emit(self, build: Callable[[int, int], Event]) -> None:
        """Build the next event from (seq, ts), check it and hold it.

        Raises:
            InternalError: The event would break the stream state machine (our bug).
        """
        event = build(self._seq + 1, self._clock())
        violation = self._machine.apply(event)
        if violation is not None:
            raise InternalError(f"normalizer would break {violation.rule}: {violation.message}")
        self._seq = event.seq
        self._outbox.append(event)
        if isinstance(event, StreamDone | StreamError):
            self.terminal = event

    def _ignored_after_end(self) -> bool:
        """Count and report an operation that arrived after the terminal event."""
        if self.terminal is not None:
            self.ignored["after_terminal"] += 1
            return True
        return False
