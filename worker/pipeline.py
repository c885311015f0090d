"""Bytes in, contract events out: a framing decoder wired to a provider adapter.

One :class:`Pipeline` per upstream response. The adapter's framing picks the decoder:
``sse`` (:class:`~worker.sse.SSEDecoder`), ``json_array``
(:class:`~worker.jsonarray.JSONArrayDecoder`) or ``eventstream`` (Bedrock's binary
framing, :class:`~worker.bedrock_frames.BedrockBody`). The worker, ``fanout replay``,
the tests and the fuzzers all drive this same object. Pure: imports no asyncio, aiohttp, redis
or opentelemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from schema.contract import Event, Visibility
from schema.errors import FanoutError, UpstreamProtocolError
from worker.adapters.base import Adapter, Framing
from worker.bedrock_frames import BedrockBody, Operation
from worker.frames import AnyFrame
from worker.jsonarray import JSONArrayDecoder
from worker.normalizer import Normalizer
from worker.sse import SSEDecoder

DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
"""Default limit of one SSE frame or JSON-array element (``FANOUT_MAX_FRAME_BYTES``)."""


BEDROCK_OPERATIONS: Final[dict[str, Operation]] = {"anthropic": "invoke", "bedrock_converse": "converse"}
"""Provider API → the Bedrock operation whose ``eventstream`` body it reads
(InvokeModelWithResponseStream for Anthropic models, ConverseStream); a provider not
listed has no event-stream framing."""


def adapter_class(provider: str) -> type[Adapter]:
    """Return the adapter class for a provider API name.

    Raises:
        KeyError: Unknown provider.
    """
    from worker.adapters.registry import ADAPTERS  # noqa: PLC0415 - registry imports every adapter

    return ADAPTERS[provider]


class Pipeline:
    """Decoder + adapter for one upstream response.

    Args:
        adapter: The provider adapter (holding the stream's normalizer).
        max_frame_bytes: Limit of one frame or element; past it the stream ends
            ``failed``/``protocol``.
    """

    def __init__(self, adapter: Adapter, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.adapter = adapter
        self._sse: SSEDecoder | None = None
        self._array: JSONArrayDecoder | None = None
        self._bedrock: BedrockBody | None = None
        if adapter.framing == "json_array":
            self._array = JSONArrayDecoder(max_element_bytes=max_frame_bytes)
        elif adapter.framing == "eventstream":
            self._bedrock = BedrockBody(BEDROCK_OPERATIONS[adapter.provider], max_message_bytes=max_frame_bytes)
        else:
            self._sse = SSEDecoder(max_frame_bytes=max_frame_bytes)
        self.frames = 0
        """Frames decoded so far."""
        self.meaningful = 0
        """Frames that produced at least one event (progress, for the progress timeout)."""

    @property
    def terminal(self) -> Event | None:
        """The terminal event once emitted."""
        return self.adapter.terminal

    def start(self) -> list[Event]:
        """Return ``stream.start`` (unless already stored)."""
        return self.adapter.start()

    def feed(self, chunk: bytes) -> list[Event]:
        """Consume one network read; return the events it completed, in seq order."""
        if self.adapter.terminal is not None:
            return []
        try:
            frames = self._decode(chunk)
        except UpstreamProtocolError as exc:
            return self.adapter.fail(exc)
        return self._run(frames)

    def _decode(self, chunk: bytes) -> list[AnyFrame]:
        if self._sse is not None:
            return list(self._sse.feed(chunk))
        if self._bedrock is not None:
            return self._bedrock.feed(chunk)
        assert self._array is not None
        return list(self._array.feed(chunk))

    def _run(self, frames: list[AnyFrame]) -> list[Event]:
        events: list[Event] = []
        for frame in frames:
            self.frames += 1
            got = self.adapter.feed(frame)
            if got:
                self.meaningful += 1
                events.extend(got)
        return events

    def finish(self) -> list[Event]:
        """Handle a clean end of the body; return the final events (always a terminal)."""
        if self.adapter.terminal is not None:
            return []
        try:
            if self._sse is not None:
                end = self._sse.close()
                events, truncated = self._run(list(end.frames)), end.truncated
            elif self._bedrock is not None:
                events, truncated = [], self._bedrock.close().truncated
            else:
                assert self._array is not None
                arr = self._array.close()
                events, truncated = self._run(list(arr.frames)), arr.truncated or not arr.closed
        except UpstreamProtocolError as exc:
            return self.adapter.fail(exc)
        return events + self.adapter.finish(truncated=truncated)

    def fail(self, error: FanoutError) -> list[Event]:
        """End the stream for a failure outside the body; return the terminal event."""
        return self.adapter.fail(error)


def build_pipeline(
    *,
    provider: str,
    stream_id: str,
    model: str,
    clock: Callable[[], int],
    framing: Framing = "sse",
    metadata: dict[str, Any] | None = None,
    reasoning_visibility: Visibility = "public",
    stored_seq: int = 0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    epoch: str | None = None,
    endpoint: str | None = None,
    upstream_model: str | None = None,
) -> Pipeline:
    """Build the pipeline for one upstream response of ``provider``.

    ``epoch``, ``endpoint`` and ``upstream_model`` are the :class:`Normalizer`'s.

    Raises:
        KeyError: Unknown provider, or ``eventstream`` framing for a provider not in
            :data:`BEDROCK_OPERATIONS`.
    """
    norm = Normalizer(
        stream_id=stream_id, provider=provider, model=model, clock=clock, metadata=metadata,
        reasoning_visibility=reasoning_visibility, stored_seq=stored_seq, epoch=epoch,
        endpoint=endpoint, upstream_model=upstream_model,
    )
    return Pipeline(adapter_class(provider)(norm, framing=framing), max_frame_bytes=max_frame_bytes)
