"""Generates the JSON Schema of the contract from the Structs (``python -m schema.jsonschema``).

The committed copy is ``schema/contract.schema.json``; a test fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from schema.contract import CONTRACT_MINOR, CONTRACT_VERSION, Event
from schema.job import Job
from schema.reducer import AssembledResult
from schema.snapshot import StreamSnapshot

SCHEMA_PATH: Final = Path(__file__).with_name("contract.schema.json")
"""Where the committed schema lives."""


def build_schema() -> dict[str, Any]:
    """Return the JSON Schema (2020-12) for SSE data, stored events, the assembled result and the job.

    The root is what one SSE ``data:`` line of ``/events`` holds: a stored event or a
    ``stream.snapshot`` (contract 1.1); ``$defs.Event`` is a stored event alone.
    """
    (sse, event, result, job), components = msgspec.json.schema_components(
        (Event | StreamSnapshot, Event, AssembledResult, Job), ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://fanout.dev/schema/contract.v{CONTRACT_VERSION}.json",
        "title": f"fanout event contract v{CONTRACT_VERSION}.{CONTRACT_MINOR}",
        "description": "One SSE data object of a fanout stream: a stored event or a stream.snapshot; "
                       "see $defs for a stored event alone (Event), the assembled result and the job.",
        **sse,
        "$defs": {**components, "Event": event, "AssembledResultRoot": result, "JobRoot": job},
    }


def render() -> bytes:
    """Return the schema as the exact bytes committed (sorted keys, 2-space indent, final LF)."""
    return msgspec.json.format(msgspec.json.encode(build_schema(), order="sorted"), indent=2) + b"\n"


def main() -> int:
    """Write the schema file; print its path."""
    SCHEMA_PATH.write_bytes(render())
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
