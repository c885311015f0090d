"""The normalizer's terminal decisions: which finish a stop becomes, whether an end stands, a failure's error.

One job: the pure rules behind the one terminal event that
:class:`~worker.normalizer.Normalizer` emits. :func:`derive_finish` applies PROVIDERS.md
7.8 to a provider's ``stop``; :func:`end_problem` says why a provider's proved end cannot
be ``stream.done`` (CONTRACT.md, terminal states: a block still open, or tool arguments
that do not parse at a ``completed`` end); :func:`failure` gives a ``stream.error``'s
status and :class:`~schema.contract.ErrorInfo` from its category
(:mod:`worker.error_policy`).

Pure: imports no asyncio, aiohttp, redis or opentelemetry, and nothing of the worker's
I/O shell.
"""

from __future__ import annotations

from collections.abc import Iterable

from schema.contract import BlockKind, DoneStatus, ErrorCategory, ErrorInfo, ErrorStatus, FinishReason
from schema.reducer import parse_arguments
from worker.blocks import Block
from worker.error_policy import RETRYABLE, STATUS_OF_CATEGORY, safe_message


def derive_finish(reason: FinishReason | None, kinds: Iterable[BlockKind]) -> FinishReason | None:
    """Apply PROVIDERS.md 7.8 to a provider's ``stop``, given the kinds of the blocks started.

    ``stop`` with tool calls becomes ``tool_calls``; ``stop`` whose only output is a
    refusal (reasoning aside) becomes ``refusal``; any other reason is returned as is.
    """
    if reason != "stop":
        return reason
    started = set(kinds)
    if "tool_call" in started:
        return "tool_calls"
    if started - {"reasoning"} == {"refusal"}:
        return "refusal"
    return reason


def end_problem(status: DoneStatus, *, open_blocks: bool, started: Iterable[Block]) -> str | None:
    """Return why a provider's end cannot be ``stream.done`` (it ends ``failed``/``protocol``), else ``None``.

    Args:
        status: The status the provider's end proves.
        open_blocks: Whether a block (held ones included) is still open.
        started: The blocks started publicly; a ``completed`` end needs every tool
            call's arguments to parse as a JSON object.
    """
    if open_blocks:
        return "upstream ended the response with a block still open"
    if status == "completed" and any(
        b.kind == "tool_call" and parse_arguments("".join(b.json_text)) is None for b in started
    ):
        return "tool call arguments are not a JSON object"
    return None


def failure(
    category: ErrorCategory, message: str, *, provider_code: str | None, retryable: bool | None,
    status: ErrorStatus | None,
) -> tuple[ErrorStatus, ErrorInfo]:
    """Return the status and error of a ``stream.error``.

    ``status`` defaults from the category (``transport``/``timeout``/``worker_lost``
    → ``interrupted``, ``cancelled`` → ``cancelled``, else ``failed``), ``retryable``
    from :data:`~worker.error_policy.RETRYABLE`; the message is masked and cut
    (:func:`~worker.error_policy.safe_message`).
    """
    info = ErrorInfo(
        category=category,
        retryable=RETRYABLE[category] if retryable is None else retryable,
        provider_code=provider_code,
        message=safe_message(message),
    )
    return status or STATUS_OF_CATEGORY.get(category, "failed"), info
