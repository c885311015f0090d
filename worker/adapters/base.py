"""The adapter protocol every provider module implements, and its shared plumbing.

An adapter is one object per upstream response: :meth:`Adapter.feed` takes one frame
and returns contract events, :meth:`Adapter.finish` is called at the end of the body
and :meth:`Adapter.fail` on a transport failure. Subclasses implement ``_feed`` (and
usually ``_finish``) by calling the :class:`~worker.normalizer.Normalizer`, which emits
the events and the single terminal. Dispatch inside an adapter goes through a dict
of handlers; names not in it go to :meth:`Normalizer.ignore`.

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Literal

import msgspec

from schema.contract import Event, FinishReason
from schema.errors import FanoutError, UpstreamProtocolError
from worker.frames import AnyFrame, ErrorFrame, Frame, SSEFrame
from worker.normalizer import Normalizer

Framing = Literal["sse", "json_array", "eventstream"]

EMPTY_DATA: Final = "empty_data"
"""Ignored-counter name of an SSE event whose data is empty or only whitespace."""

_json: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def parse_object(text: str) -> dict[str, Any]:
    """Parse one provider payload that must be a JSON object.

    Raises:
        UpstreamProtocolError: Not JSON, JSON nested past the decoder's recursion limit,
            or JSON that is not an object. The caller ends the stream ``failed``/``protocol``.
    """
    try:
        value = _json.decode(text)
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"upstream sent malformed JSON: {exc}") from exc
    except RecursionError as exc:
        raise UpstreamProtocolError("upstream sent JSON nested too deeply") from exc
    if not isinstance(value, dict):
        raise UpstreamProtocolError("upstream sent a JSON payload that is not an object")
    return value


class Adapter:
    """Base of the provider adapters; one instance per upstream response.

    Args:
        normalizer: The stream's normalizer (owns seq, blocks and the terminal event).
        framing: How the body is framed (only Gemini offers ``json_array``; Bedrock
            answers in ``eventstream``: the Anthropic adapter for InvokeModelWithResponseStream,
            ``bedrock_converse`` for ConverseStream).
    """

    provider: ClassVar[str] = ""
    """Provider API name (``openai_chat``, ...)."""

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        self.norm = normalizer
        self.framing: Framing = framing
        self.seen_finish: FinishReason | None = None
        """A finish reason the provider sent before its terminal signal; carried by a
        ``stream.error`` when the body then ends or breaks (CONTRACT.md)."""

    @property
    def ignored(self) -> Counter[str]:
        """Counts of provider events ignored (unknown, or after the terminal event), by name."""
        return self.norm.ignored

    @property
    def terminal(self) -> Event | None:
        """The terminal event once emitted."""
        return self.norm.terminal

    def start(self) -> list[Event]:
        """Return ``stream.start`` (unless already stored); call once before feeding."""
        self.norm.start()
        return self.norm.take()

    def feed(self, frame: AnyFrame) -> list[Event]:
        """Consume one frame and return the events it completes (often empty).

        A malformed payload or an impossible sequence ends the stream
        ``failed``/``protocol``; frames after the terminal event are counted and ignored.
        Never raises for upstream input.
        """
        if self.norm.terminal is not None:
            self.norm.ignored["after_terminal"] += 1
            return []
        if isinstance(frame, ErrorFrame):
            self.norm.fail(category=frame.category, message=frame.message, retryable=frame.retryable,
                           provider_code=frame.provider_code, finish_reason=self.finish_seen())
            return self.norm.take()
        if isinstance(frame, SSEFrame) and not frame.data.strip():
            self.norm.ignore(EMPTY_DATA)
            return []
        try:
            self._feed(frame)
        except UpstreamProtocolError as exc:
            self.norm.fail(category="protocol", message=exc.message, finish_reason=self.finish_seen())
        return self.norm.take()

    def finish(self, *, truncated: bool = False) -> list[Event]:
        """Handle the end of the body and return the final events.

        Args:
            truncated: The body ended inside a frame (the framing decoder discarded an
                unterminated event or element), so the end was not clean.

        Returns:
            The remaining events; the terminal is ``interrupted``/``transport`` when no
            terminal signal was proven.
        """
        if self.norm.terminal is None:
            self._finish(truncated=truncated)
        if self.norm.terminal is None:
            self.norm.fail(category="transport", message="upstream closed the connection before the response ended",
                           finish_reason=self.finish_seen())
        return self.norm.take()

    def fail(self, error: FanoutError) -> list[Event]:
        """End the stream for a failure outside the body (transport, timeout, cancel, protocol).

        The status follows the error's category (``transport``/``timeout`` →
        ``interrupted``, ``cancelled`` → ``cancelled``, else ``failed``).
        """
        if self.norm.terminal is None:
            code = getattr(error, "provider_code", None)
            self.norm.fail(category=error.category, message=error.message, retryable=error.retryable,
                           provider_code=code if isinstance(code, str) else None, finish_reason=self.finish_seen())
        return self.norm.take()

    def finish_seen(self) -> FinishReason | None:
        """Return the finish reason the provider sent before its terminal signal, if any.

        Carried by a ``stream.error`` that an :class:`~worker.frames.ErrorFrame` ends;
        adapters that track their own stop reason override it.
        """
        return self.seen_finish

    def _dispatch(self, handlers: Mapping[str, Callable[[dict[str, Any]], None]], name: str,
                  payload: dict[str, Any]) -> None:
        """Call the handler registered for ``name``; an unknown name is counted and skipped."""
        handler = handlers.get(name)
        if handler is None:
            self.norm.ignore(name)
            return
        handler(payload)

    def _feed(self, frame: Frame) -> None:
        raise NotImplementedError

    def _finish(self, *, truncated: bool) -> None:
        """Prove a terminal at the end of the body, if the provider allows it; the default proves nothing."""
