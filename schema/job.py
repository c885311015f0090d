"""The generation job a publisher enqueues and a worker runs. Never holds credentials.

Pure: imports only msgspec and the contract.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Final

import msgspec

from schema.contract import PROVIDERS as PROVIDERS
from schema.contract import Provider as Provider
from schema.contract import Visibility

_CROCKFORD: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One generation to run.

    The request body is the provider-native one (``messages`` for Chat, ``input`` for
    Responses, ...); the worker adds the streaming switches and credentials itself.
    """

    stream_id: str
    """Target stream (``^[A-Za-z0-9_-]{1,128}$``)."""
    provider: Provider
    """Which provider API adapter and endpoint to use."""
    model: str
    """Model name as requested."""
    request: dict[str, Any]
    """The provider-native request body, ``stream`` and ``model`` left out (the worker sets them; the publisher
    refuses a ``request.model`` other than :attr:`model` and a ``request.stream`` other than ``true``)."""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    """Opaque caller metadata, copied onto ``stream.start``."""
    created_ms: int = 0
    """Submission time, milliseconds since the Unix epoch."""
    reasoning_visibility: Visibility = "public"
    """Visibility given to reasoning blocks of this stream."""
    endpoint: str = ""
    """The upstreams file's endpoint the job names (:mod:`schema.upstreams`); empty when its ``model``
    is a route or the provider's default endpoint serves it."""
    trace_context: dict[str, str] = msgspec.field(default_factory=dict)
    """W3C trace context of the submit request (``traceparent``, maybe ``tracestate``), so the
    worker's job span is its child; empty for jobs from older publishers or without tracing."""


job_encoder: Final = msgspec.json.Encoder()
job_decoder: Final = msgspec.json.Decoder(Job)


def new_stream_id(now_ms: int | None = None) -> str:
    """Return an unguessable, time-ordered id: ``st_`` + 10 Crockford chars of time + 16 random.

    The shape follows ULID (48-bit millisecond time, then 80 random bits).
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamp = "".join(_CROCKFORD[(ms >> (5 * i)) & 31] for i in range(9, -1, -1))
    rand = "".join(secrets.choice(_CROCKFORD) for _ in range(16))
    return f"st_{stamp}{rand}"
