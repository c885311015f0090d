"""A jobs-stream entry → the job to run, or why it cannot run. Pure: imports only msgspec and ``schema``.

A job that does not decode (not JSON, a provider this worker does not know, a field of
the wrong type, JSON nested past the decoder's recursion limit) is never run. When its
``stream_id`` can still be read and is valid, the worker ends that stream
``failed``/``invalid_request``, so its readers are not left waiting for a stream that will
never start (a publisher of a newer version may accept a provider this worker lacks). An
entry that names no valid stream is only acked and logged.
"""

from __future__ import annotations

import re
from typing import Any, Final, cast

import msgspec

from schema.contract import STREAM_ID_PATTERN
from schema.job import Job, Provider, job_decoder

STREAM_ID: Final = re.compile(STREAM_ID_PATTERN)
MAX_STUB_TEXT: Final = 256
"""Longest provider or model name copied from an invalid job onto its ``stream.start``."""


class _Head(msgspec.Struct):
    """The fields of an invalid job still needed to end its stream; other fields are skipped."""

    stream_id: str
    provider: Any = ""
    model: Any = ""


_head_decoder: Final = msgspec.json.Decoder(_Head)


def _text(value: Any) -> str:
    return value[:MAX_STUB_TEXT] if isinstance(value, str) else ""


def _stub(raw: bytes) -> Job | None:
    """Return a job that only names the stream, provider and model of ``raw``, if readable."""
    try:
        head = _head_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not STREAM_ID.fullmatch(head.stream_id):
        return None
    # Not one of PROVIDERS when that is what made the job invalid: it is only copied onto
    # stream.start (an open set in the contract), never used to pick an adapter.
    provider = cast(Provider, _text(head.provider))
    return Job(stream_id=head.stream_id, provider=provider, model=_text(head.model), request={})


def decode_entry(raw: bytes | None) -> tuple[Job | None, str | None]:
    """Decode the Job JSON of one jobs-stream entry.

    Args:
        raw: Field ``j`` of the entry, or ``None`` when missing.

    Returns:
        ``(job, None)`` for a job to run; ``(stub, problem)`` for an invalid job whose
        stream id is valid (end that stream with ``problem``); ``(None, problem)`` for an
        entry to ack and drop.
    """
    try:
        job = job_decoder.decode(raw or b"")
    except msgspec.DecodeError as exc:
        return _stub(raw or b""), f"the job is invalid: {exc}"
    except RecursionError:
        return _stub(raw or b""), "the job is invalid: JSON nested too deeply"
    if not STREAM_ID.fullmatch(job.stream_id):
        return None, "the job's stream_id does not match " + STREAM_ID_PATTERN
    return job, None
