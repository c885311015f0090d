"""The analytics summary of a finished stream: the flat fields XADDed to ``P:done``. Pure.

Written by :meth:`worker.appender.Appender.write_summary` right after the terminal event is
stored (``P:done`` is in another slot than the stream's keys, so not by the append script).
"""

from __future__ import annotations

from schema.contract import StreamDone, StreamError


def summary_fields(
    terminal: StreamDone | StreamError,
    *,
    provider: str,
    model: str,
    started_ms: int,
    first_delta_ms: int | None,
    epoch: str = "",
) -> list[str]:
    """Return the flat field/value list XADDed to ``P:done`` for a finished stream.

    Fields: ``stream_id provider model status finish_reason error_category input_tokens
    output_tokens cached_input_tokens reasoning_tokens events ttfd_ms duration_ms
    ended_ms epoch``; unknown values are empty strings. ``epoch`` names the generation
    that finished (contract 1.1; empty for a stream started before it), so a consumer
    that meets the same ``stream_id`` twice with two epochs knows it was regenerated. ``events`` is the terminal's seq;
    ``ttfd_ms`` (first ``block.delta``) and ``duration_ms`` (terminal) are measured from
    ``started_ms``, the stream's first claim.
    """
    usage = terminal.usage
    fields: dict[str, object] = {
        "stream_id": terminal.stream_id, "provider": provider, "model": model,
        "status": terminal.status, "finish_reason": terminal.finish_reason,
        "error_category": terminal.error.category if isinstance(terminal, StreamError) else None,
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        "cached_input_tokens": usage.cached_input_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "events": terminal.seq,
        "ttfd_ms": first_delta_ms - started_ms if first_delta_ms is not None and started_ms else None,
        "duration_ms": terminal.ts - started_ms if started_ms else None,
        "ended_ms": terminal.ts,
        "epoch": epoch or None,
    }
    return [part for name, value in fields.items() for part in (name, "" if value is None else str(value))]
