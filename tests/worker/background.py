"""Helpers of the background-mode tests: an upstreams file with a background endpoint, goldens, comparisons.

The endpoint ``bg`` speaks ``openai_responses`` to the fake provider (:mod:`tools.fake_background`)
with ``background = true``; a job names it and a recorded case as its model.
"""

from __future__ import annotations

from typing import Any

from schema.contract import Event
from tests.worker.support import strip_volatile
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS

TEXT = "simple_text_mixed_scripts"
"""A text answer (14 events)."""
TOOL = "function_call_fragmented_json"
"""A tool call whose arguments arrive in fragments (14 events)."""
MIXED = "several_blocks_reasoning_text_and_call"
"""Reasoning, text and a tool call (18 events)."""


def background_toml(base: str, *, background: bool = True) -> str:
    """Return an upstreams file with the endpoint ``bg`` (OpenAI Responses on the fake at ``base``)."""
    flag = "true" if background else "false"
    return (f'[endpoints.bg]\napi = "openai_responses"\nurl = "{base}/v1"\nauth = "none"\n'
            f"background = {flag}\n")


def comparable(events: list[Event]) -> list[dict[str, Any]]:
    """Events without what differs between runs: ``ts``, ids, the epoch, the response id and the endpoint."""
    out = strip_volatile(events)
    for item in out:
        item.pop("response_id", None)
        item.pop("endpoint", None)
        item.pop("model", None) if item["type"] == "stream.done" else None
    return out


def golden(case: str) -> list[dict[str, Any]]:
    """The case's transcript normalized offline (:func:`tools.replay.replay_file`), comparable."""
    events, _ = replay_file(DEFAULT_ROOTS[0] / "openai_responses" / f"{case}.sse")
    return comparable(events)
