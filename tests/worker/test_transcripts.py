"""Every transcript against its golden, the shared cases against their results, in any chunking."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from schema.contract import encode_event
from schema.reducer import reduce
from schema.validate import validate
from tests.compact import compact, expected_view
from worker.replay import replay_file

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "transcripts").glob("*/*.sse"))
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
