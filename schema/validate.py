"""The validator of the five invariants of CONTRACT.md, run over a stream's events.

Pure: imports only the contract and the state machine.
"""

from __future__ import annotations

from collections.abc import Iterable

from schema.contract import Event
from schema.states import StreamMachine, Violation


def validate(events: Iterable[Event], *, allow_seq_gaps: bool = False) -> list[Violation]:
    """Return every invariant the events break, in order; empty when the stream is sound.

    Args:
        events: One stream's events in stored order; any prefix of a stream is valid
            input (a running stream has no terminal event yet).
        allow_seq_gaps: Accept holes in ``seq`` (a public projection without internal
            blocks) while still requiring it to increase.

    Returns:
        The violations, each naming its rule (see :class:`schema.states.Violation`).
    """
    machine = StreamMachine(allow_seq_gaps=allow_seq_gaps)
    found: list[Violation] = []
    for event in events:
        violation = machine.apply(event)
        if violation is not None:
            found.append(violation)
    return found
