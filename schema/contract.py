"""The event contract (CONTRACT.md), re-exported from :mod:`fanout_client.contract`.

The Structs live in the client distribution (``client/``), so an app that installs only
``fanout-client`` gets the same types the worker writes and the publisher serves; the
server keeps importing them as ``schema.contract``. Pure.
"""

from fanout_client.contract import (
    CONTRACT_MINOR as CONTRACT_MINOR,
)
from fanout_client.contract import (
    CONTRACT_VERSION as CONTRACT_VERSION,
)
from fanout_client.contract import (
    EPOCH_PATTERN as EPOCH_PATTERN,
)
from fanout_client.contract import (
    EVENT_TYPES as EVENT_TYPES,
)
from fanout_client.contract import (
    PROVIDERS as PROVIDERS,
)
from fanout_client.contract import (
    STREAM_ID_PATTERN as STREAM_ID_PATTERN,
)
from fanout_client.contract import (
    TERMINAL_TYPES as TERMINAL_TYPES,
)
from fanout_client.contract import (
    BlockDelta as BlockDelta,
)
from fanout_client.contract import (
    BlockKind as BlockKind,
)
from fanout_client.contract import (
    BlockRef as BlockRef,
)
from fanout_client.contract import (
    BlockStart as BlockStart,
)
from fanout_client.contract import (
    BlockStop as BlockStop,
)
from fanout_client.contract import (
    Delta as Delta,
)
from fanout_client.contract import (
    DeltaKind as DeltaKind,
)
from fanout_client.contract import (
    DoneStatus as DoneStatus,
)
from fanout_client.contract import (
    ErrorCategory as ErrorCategory,
)
from fanout_client.contract import (
    ErrorInfo as ErrorInfo,
)
from fanout_client.contract import (
    ErrorStatus as ErrorStatus,
)
from fanout_client.contract import (
    Event as Event,
)
from fanout_client.contract import (
    FinishReason as FinishReason,
)
from fanout_client.contract import (
    Provider as Provider,
)
from fanout_client.contract import (
    StreamDone as StreamDone,
)
from fanout_client.contract import (
    StreamError as StreamError,
)
from fanout_client.contract import (
    StreamStart as StreamStart,
)
from fanout_client.contract import (
    TerminalStatus as TerminalStatus,
)
from fanout_client.contract import (
    ToolInfo as ToolInfo,
)
from fanout_client.contract import (
    Usage as Usage,
)
from fanout_client.contract import (
    Visibility as Visibility,
)
from fanout_client.contract import (
    decode_event as decode_event,
)
from fanout_client.contract import (
    encode_event as encode_event,
)
from fanout_client.contract import (
    event_id as event_id,
)
from fanout_client.contract import (
    is_terminal as is_terminal,
)
from fanout_client.contract import (
    parse_event_id as parse_event_id,
)
from fanout_client.contract import (
    terminal_status as terminal_status,
)
from fanout_client.contract import (
    to_builtins as to_builtins,
)
