"""The compact form of an assembled result used by ../shared/cases/transcripts/*.json."""

from __future__ import annotations

from typing import Any

import msgspec

from schema.reducer import AssembledResult


def compact(result: AssembledResult) -> dict[str, Any]:
    """Return the case-file view of ``result`` (status, finish, category, blocks, usage)."""
    blocks: list[dict[str, Any]] = []
    for block in msgspec.to_builtins(result.blocks):
        kind = block["kind"]
        if kind in ("text", "refusal"):
            blocks.append({"kind": kind, "text": block["text"]})
        elif kind == "reasoning":
            blocks.append({"kind": kind, "text": block["text"], "signature": block["signature"],
                           "redacted": block["redacted"]})
        else:
            entry = {"kind": kind, "call_id": block["call_id"], "name": block["name"],
                     "arguments": block["arguments"]}
            if block["arguments"] is None:
                entry["partial"] = True
            blocks.append(entry)
    return {
        "status": result.status,
        "finish_reason": result.finish_reason,
        "error_category": result.error.category if result.error else None,
        "blocks": blocks,
        "usage": msgspec.to_builtins(result.usage) if result.usage else None,
    }


def expected_view(case: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Return the case's expectation, with generated call ids (``null``) taken from ``got``."""
    want = {k: case.get(k) for k in ("status", "finish_reason", "error_category", "blocks", "usage")}
    blocks = []
    for i, raw in enumerate(want["blocks"] or []):
        block = dict(raw)
        if block.get("kind") == "tool_call" and block.get("call_id") is None and i < len(got["blocks"]):
            block["call_id"] = got["blocks"][i].get("call_id")
        blocks.append(block)
    want["blocks"] = blocks
    return want
