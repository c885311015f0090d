"""The fanout contract: event Structs, validator, reducer, job, Redis layout.

Everything worker and publisher must agree on lives here. Pure: imports no asyncio,
aiohttp, redis or opentelemetry.

Must not import :mod:`infra`, :mod:`worker`, :mod:`publisher` or :mod:`tools`.
"""

from schema.contract import (
    CONTRACT_VERSION,
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    ErrorInfo,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    ToolInfo,
    Usage,
    decode_event,
    encode_event,
    is_terminal,
)
from schema.job import Job, new_stream_id
from schema.reducer import AssembledResult, Assembler, reduce
from schema.states import StreamMachine, Violation
from schema.validate import validate

__all__ = [
    "CONTRACT_VERSION",
    "AssembledResult",
    "Assembler",
    "BlockDelta",
    "BlockRef",
    "BlockStart",
    "BlockStop",
    "Delta",
    "ErrorInfo",
    "Event",
    "Job",
    "StreamDone",
    "StreamError",
    "StreamMachine",
    "StreamStart",
    "ToolInfo",
    "Usage",
    "Violation",
    "decode_event",
    "encode_event",
    "is_terminal",
    "new_stream_id",
    "reduce",
    "validate",
]
