"""Every transcript against its golden, the shared cases against their results, in any chunking."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import msgspec
import pytest

from schema.contract import encode_event
from schema.reducer import reduce
from schema.validate import validate
from tests.compact import compact, expected_view
from tools.replay import replay_file, replay_reads

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted([*(ROOT / "transcripts").glob("*/*.sse"), *(ROOT / "transcripts").glob("*/*.eventstream")])
CASES = sorted((ROOT / "tests" / "cases" / "transcripts").glob("*/*.sse"))


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def _jsonl(events: list[object]) -> str:
    return "".join(encode_event(e).decode() + "\n" for e in events)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=_ids(TRANSCRIPTS))
def test_transcript_matches_golden(path: Path, regen: bool) -> None:
    events, _ = replay_file(path)
    golden = path.with_suffix(".events.jsonl")
    if regen:
        golden.write_text(_jsonl(events), encoding="utf-8")
    assert golden.exists(), f"no golden for {path.name}; run pytest --regen and review the diff"
    assert _jsonl(events) == golden.read_text(encoding="utf-8")
    assert validate(events) == []


@pytest.mark.parametrize("path", TRANSCRIPTS + CASES, ids=_ids(TRANSCRIPTS) + _ids(CASES))
def test_one_byte_and_random_reads_give_identical_events(path: Path) -> None:
    whole, _ = replay_file(path)
    one, _ = replay_file(path, sizes=[1])
    rng = random.Random(path.name)
    sliced, _ = replay_file(path, sizes=[rng.randint(1, 97) for _ in range(50)])
    assert one == whole
    assert sliced == whole


@pytest.mark.parametrize("path", CASES, ids=_ids(CASES))
def test_shared_case_assembles_to_expected_result(path: Path) -> None:
    case = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    events, _ = replay_file(path)
    assert validate(events) == []
    got = compact(reduce(events))
    assert got == expected_view(case, got), case.get("note")
    assert msgspec.json.decode(encode_event(events[-1]))["type"] in ("stream.done", "stream.error")


SSE_PATHS = [p for p in TRANSCRIPTS + CASES if p.suffix == ".sse" and p.parent.name != "gemini_json_array"]


@pytest.mark.parametrize("path", SSE_PATHS, ids=_ids(SSE_PATHS))
def test_comments_inserted_at_every_event_boundary_change_nothing(path: Path) -> None:
    """The insertion property, deterministically over every SSE transcript: a keep-alive
    comment before the first event and after every blank line changes no event."""
    body = path.read_bytes()
    noisy = b": keep-alive\n\n" + re.sub(rb"(\r\n\r\n|\n\n|\r\r)", rb"\1: keep-alive\n\n", body)
    events, _ = replay_file(path)
    noisy_events, _ = replay_reads([noisy], provider=events[0].provider,  # type: ignore[attr-defined]
                                   framing="sse")
    assert noisy_events == events
