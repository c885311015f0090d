"""``stream.snapshot`` (contract 1.1): a stream's assembled state as of one seq, sent instead of its history.

A reader that asks for it (``GET /v1/streams/{id}/events?snapshot=1`` with no position)
gets one ``stream.snapshot`` SSE message first: the assembled result (the reducer's
output, :class:`fanout_client.reducer.AssembledResult`) of every event up to ``seq`` the
reader may see, with the SSE ``id`` of event ``seq`` (``<seq>.<epoch>``). The events after
``seq`` follow as usual, so ``Last-Event-ID`` continues exactly from there. A snapshot is
never stored and never numbered on its own; old readers ignore it (an unknown type).
:func:`assembler_from` turns one into an :class:`~fanout_client.reducer.Assembler` that the
following events continue. Pure: imports only the contract, the reducer and msgspec.
"""

from __future__ import annotations

from typing import Final

import msgspec

from fanout_client.contract import (
    BlockRef,
    BlockStart,
    ErrorStatus,
    Event,
    StreamDone,
    StreamError,
    ToolInfo,
    decode_event,
    is_terminal,
)
from fanout_client.reducer import AssembledBlock, AssembledResult, Assembler, ReasoningBlock, ToolCallBlock

SNAPSHOT_TYPE: Final = "stream.snapshot"
"""The snapshot's ``type`` and SSE ``event`` name."""


class StreamSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=SNAPSHOT_TYPE):
    """The assembled state of a stream as of one seq (contract 1.1, never stored)."""

    stream_id: str
    """The stream."""
    seq: int
    """The last seq the state reflects (0: nothing stored yet); the SSE ``id`` names it."""
    ts: int
    """Emit time of the last event the result includes, ms since the Unix epoch (0: none)."""
    result: AssembledResult
    """The reducer's output over every event up to ``seq`` the reader may see."""


_decoder: Final = msgspec.json.Decoder(StreamSnapshot)
_encoder: Final = msgspec.json.Encoder()


def decode_snapshot(data: bytes | str) -> StreamSnapshot:
    """Parse the ``data`` of a ``stream.snapshot`` SSE message.

    Raises:
        msgspec.ValidationError: Missing or ill-typed fields, or another ``type``.
        msgspec.DecodeError: Not JSON.
    """
    return _decoder.decode(data)


def encode_snapshot(snapshot: StreamSnapshot) -> bytes:
    """Serialize one snapshot to compact JSON (one line): ``type`` first, then the envelope, then ``result``."""
    return _encoder.encode(snapshot)


def snapshot_json(stream_id: str, seq: int, ts: int, result_json: bytes) -> bytes:
    """Return the JSON of a snapshot around an already encoded result, byte-equal to :func:`encode_snapshot`.

    Args:
        stream_id: The stream (``^[A-Za-z0-9_-]{1,128}$``: nothing to escape).
        seq: The seq reflected.
        ts: The last included event's ``ts``, ms.
        result_json: ``msgspec.json.encode`` of the :class:`AssembledResult`.
    """
    head = b'{"type":"%s","stream_id":%s,"seq":%d,"ts":%d,"result":' % (
        SNAPSHOT_TYPE.encode(), _encoder.encode(stream_id), seq, ts)
    return head + result_json + b"}"


def decode_message(event_type: str, data: str | None) -> Event | StreamSnapshot | None:
    """Return the event or snapshot an SSE message of ``/events`` carries.

    Args:
        event_type: The message's ``event`` field.
        data: Its ``data`` (``None``: the message had none).

    Returns:
        ``None`` for a ``stream.gap``, a message without data, or an unknown event type.

    Raises:
        msgspec.ValidationError: A known type with missing or ill-typed fields.
        msgspec.DecodeError: The data is not JSON.
    """
    if data is None or event_type == "stream.gap":
        return None
    if event_type == SNAPSHOT_TYPE:
        return decode_snapshot(data)
    return decode_event(data)


def ends(item: Event | StreamSnapshot) -> bool:
    """Return True for a terminal event or the snapshot of a finished stream (nothing follows either)."""
    return item.result.status != "running" if isinstance(item, StreamSnapshot) else is_terminal(item)


def assembler_from(snapshot: StreamSnapshot) -> Assembler:
    """Return an :class:`Assembler` holding the snapshot's state, to apply the events after ``seq`` to.

    Its :meth:`~fanout_client.reducer.Assembler.result` equals ``snapshot.result`` until an
    event is applied, and afterwards the result of the whole stream up to that event.
    """
    result = snapshot.result
    assembler = Assembler(snapshot.stream_id)
    for block in result.blocks:
        assembler.seed_block(_start_of(snapshot.stream_id, block), _text_of(block), block.signature,
                             closed=isinstance(block, ToolCallBlock) and block.closed)
    assembler.seed_end(_end_of(snapshot), result.model)
    return assembler


def _start_of(stream_id: str, block: AssembledBlock) -> BlockStart:
    kind = block.__struct_config__.tag
    ref = BlockRef(id=f"b{block.index}", index=block.index, kind=kind)  # type: ignore[arg-type]
    if isinstance(block, ToolCallBlock):
        return BlockStart(stream_id=stream_id, seq=0, ts=0, block=ref,
                          tool=ToolInfo(call_id=block.call_id, name=block.name))
    if isinstance(block, ReasoningBlock):
        return BlockStart(stream_id=stream_id, seq=0, ts=0, block=ref, visibility=block.visibility,
                          redacted=block.redacted)
    return BlockStart(stream_id=stream_id, seq=0, ts=0, block=ref)


def _text_of(block: AssembledBlock) -> str:
    return block.arguments_text if isinstance(block, ToolCallBlock) else block.text


def _end_of(snapshot: StreamSnapshot) -> StreamDone | StreamError | None:
    """Return the terminal event a finished snapshot's result came from (its fields as the result kept them)."""
    result = snapshot.result
    endpoint = result.endpoint if result.endpoint is not None else msgspec.UNSET
    if result.status in ("completed", "incomplete"):
        return StreamDone(stream_id=snapshot.stream_id, seq=snapshot.seq, ts=snapshot.ts, status=result.status,
                          finish_reason=result.finish_reason, provider_finish_reason=result.provider_finish_reason,
                          usage=result.usage, response_id=result.response_id, model=result.model, endpoint=endpoint)
    if result.status in ("failed", "interrupted", "cancelled") and result.error is not None:
        status: ErrorStatus = result.status
        return StreamError(stream_id=snapshot.stream_id, seq=snapshot.seq, ts=snapshot.ts, status=status,
                           error=result.error, usage=result.usage, finish_reason=result.finish_reason,
                           endpoint=endpoint)
    return None
