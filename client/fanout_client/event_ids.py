"""SSE event ids of contract 1.1 ("Generations"): ``<seq>`` or ``<seq>.<epoch>``, made and parsed.

Follows CONTRACT.md "Amendments (contract 1.1)" and WHATWG HTML "9.2 Server-sent events"
(``id`` / ``Last-Event-ID``). Pure; :mod:`fanout_client.contract` re-exports every name.
"""

from __future__ import annotations

import re
from typing import Final

EPOCH_PATTERN: Final = r"^[0-9a-z]{1,32}$"
"""Every ``epoch`` matches this pattern: lowercase letters and digits, no ``.`` (contract 1.1)."""

_EPOCH: Final = re.compile(EPOCH_PATTERN.strip("^$"))


def event_id(seq: int, epoch: str | None) -> str:
    """Return the SSE ``id`` of event ``seq`` of generation ``epoch``: ``<seq>.<epoch>``, or ``<seq>`` without one."""
    return f"{seq}.{epoch}" if epoch else str(seq)


def parse_event_id(text: str) -> tuple[int, str | None]:
    """Split an SSE ``id`` / ``Last-Event-ID`` into ``(seq, epoch or None)``.

    Args:
        text: ``<seq>`` or ``<seq>.<epoch>`` (contract 1.1, "Generations").

    Raises:
        ValueError: Anything else (the seq is not ASCII digits, or the epoch is malformed).
    """
    head, dot, tail = text.partition(".")
    if not (head.isascii() and head.isdigit()) or len(head) > 64:
        raise ValueError(f"not an event id: {text!r}")
    if dot and _EPOCH.fullmatch(tail) is None:
        raise ValueError(f"not an event id: {text!r}")
    return int(head), tail if dot else None
