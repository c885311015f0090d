"""Contract events as readable text, for ``fanout submit --follow`` and ``fanout tail`` on a terminal.

:class:`TextView` turns each event into the text to print: the answer's text as it
arrives, a ``[kind]`` header when another block starts speaking (reasoning, a tool call
with its name and call id, a refusal), and one closing line with the terminal status,
finish reason or error, and usage. Signature deltas (opaque provider state) are not
shown. Pure: imports only the contract; no I/O.
"""

from __future__ import annotations

from typing import Final, Literal

from fanout_client.contract import (
    BlockDelta,
    BlockStart,
    BlockStop,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    Usage,
)

OutputFormat = Literal["auto", "json", "text"]
OUTPUT_FORMATS: Final[tuple[OutputFormat, ...]] = ("auto", "json", "text")
"""``--format`` values: ``auto`` is text on a terminal, JSON lines otherwise."""
RULE: Final = "──"
"""Marks the lines the view adds itself (start and end), apart from model text."""


def chosen_format(requested: OutputFormat, *, tty: bool) -> Literal["json", "text"]:
    """Resolve ``auto``: text when standard output is a terminal, else JSON lines (pipes, files)."""
    if requested == "auto":
        return "text" if tty else "json"
    return requested


class TextView:
    """Renders one stream's events as text; feed the events in order.

    The result of :meth:`render` may be empty (a ``block.start`` says nothing until the
    block speaks); concatenated, the outputs read as the answer with labelled blocks.
    """

    def __init__(self) -> None:
        self._labels: dict[int, str] = {}
        self._speaking: int | None = None
        self._line_open = False

    def render(self, event: Event) -> str:
        """Return the text ``event`` adds (possibly empty)."""
        if isinstance(event, StreamStart):
            return self._line(f"{RULE} {event.stream_id} · {event.provider} {event.model}\n")
        if isinstance(event, BlockStart):
            tool = f" {event.tool.name} ({event.tool.call_id})" if event.tool else ""
            self._labels[event.block.index] = f"[{event.block.kind.replace('_', ' ')}{tool}]"
            return ""
        if isinstance(event, BlockDelta):
            return self._delta(event)
        if isinstance(event, BlockStop):
            return ""
        if isinstance(event, StreamDone):
            reason = f" · finish_reason {event.finish_reason}" if event.finish_reason else ""
            return self._line(f"{RULE} {event.status}{reason}{_usage(event.usage)}\n")
        if isinstance(event, StreamError):
            error = event.error
            retry = ", retryable" if error.retryable else ""
            return self._line(f"{RULE} {event.status} ({error.category}{retry}): {error.message}"
                              f"{_usage(event.usage)}\n")
        return ""  # a type this client does not know: ignored, as the contract asks

    def _delta(self, event: BlockDelta) -> str:
        if event.delta.kind == "signature" or not event.delta.text:
            return ""
        index = event.block.index
        head = ""
        if index != self._speaking:
            label = self._labels.get(index, f"[{event.block.kind}]")
            first_text = self._speaking is None and event.block.kind == "text"
            head = "" if first_text else self._line(f"{label}\n")
            self._speaking = index
        self._line_open = not event.delta.text.endswith("\n")
        return head + event.delta.text

    def _line(self, text: str) -> str:
        """Return ``text`` on a line of its own (after a newline when model text left one open)."""
        prefix = "\n" if self._line_open else ""
        self._line_open = False
        return prefix + text


def _usage(usage: Usage | None) -> str:
    if usage is None:
        return ""
    parts = [f"{name} {value}" for name, value in (("in", usage.input_tokens), ("out", usage.output_tokens),
                                                   ("cached", usage.cached_input_tokens),
                                                   ("reasoning", usage.reasoning_tokens)) if value is not None]
    return f" · tokens {', '.join(parts)}" if parts else ""
