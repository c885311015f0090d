"""The demo's catalogue: the recorded cases the demo stack's fake upstream replays, per provider.

``fanout upstream`` (:mod:`tools.upstream`) answers a model named after a case
with ``<root>/<provider dir>/<case>.sse``; this module lists those cases from the same
roots (``FANOUT_TRANSCRIPTS_DIR``, then ``transcripts/`` and ``tests/cases/transcripts/``)
through :func:`tools.upstream.case_names`, adds each case's description and
terminal from its directory's ``INDEX.md`` table when it has one, and gives the
provider-native request body the demo submits. Reads files only; no network, no Redis.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from schema.job import Provider
from tools.upstream import DEFAULT_ROOTS, case_names

SLOW_PREFIX: Final = "slow-"
"""Model prefix that makes the fake upstream pause ``--slow-delay-ms`` between provider events."""
_INDEX_ROW: Final = re.compile(r"^\|\s*`?([A-Za-z0-9_.-]+)\.sse`?\s*\|(.*)\|([^|]*)\|\s*$")


class DemoCase(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded case a demo job can name as its model."""

    case: str
    """The case name (the job's ``model``; ``slow-<case>`` paces it)."""
    about: str = ""
    """What the recording shows, from ``INDEX.md`` (Markdown source), or empty."""
    terminal: str = ""
    """How it ends, ``status / finish_reason or category`` from ``INDEX.md``, or empty."""


class DemoProvider(msgspec.Struct, frozen=True, kw_only=True):
    """A provider API and the cases its transcript directory holds."""

    provider: Provider
    """The job's ``provider``."""
    directory: str
    """The transcript directory the fake upstream answers it from."""
    cases: list[DemoCase]
    """Sorted by name; empty when the directory holds none."""


def provider_dirs(environ: Mapping[str, str]) -> dict[Provider, str]:
    """Return provider → transcript directory, as the worker and the fake upstream pair them.

    Gemini is ``gemini_sse`` unless ``FANOUT_GEMINI_FRAMING=json_array`` (then the worker
    asks without ``alt=sse`` and the upstream answers from ``gemini_json_array``).
    """
    gemini = "gemini_json_array" if environ.get("FANOUT_GEMINI_FRAMING") == "json_array" else "gemini_sse"
    return {"openai_chat": "openai_chat", "openai_responses": "openai_responses",
            "anthropic": "anthropic", "gemini": gemini}


def transcript_roots(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """Return the roots ``fanout upstream`` searches: ``FANOUT_TRANSCRIPTS_DIR`` first when set."""
    extra = environ.get("FANOUT_TRANSCRIPTS_DIR")
    return ((Path(extra),) if extra else ()) + DEFAULT_ROOTS


def catalogue(environ: Mapping[str, str]) -> list[DemoProvider]:
    """Return every provider with the cases the fake upstream would replay for it.

    Args:
        environ: The process environment (``FANOUT_TRANSCRIPTS_DIR``, ``FANOUT_GEMINI_FRAMING``).

    Returns:
        One entry per provider, in :func:`provider_dirs` order; a provider whose
        directory is missing everywhere has no cases.
    """
    roots = transcript_roots(environ)
    return [DemoProvider(provider=provider, directory=directory, cases=_cases(roots, directory))
            for provider, directory in provider_dirs(environ).items()]


def _cases(roots: tuple[Path, ...], directory: str) -> list[DemoCase]:
    index: dict[str, DemoCase] = {}
    for root in reversed(roots):  # earlier roots win, as in the upstream's lookup
        index.update(_index(root / directory / "INDEX.md"))
    return [index.get(name, DemoCase(case=name)) for name in case_names(roots, directory)]


def _index(path: Path) -> dict[str, DemoCase]:
    if not path.is_file():
        return {}
    rows = (_INDEX_ROW.match(line) for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return {m[1]: DemoCase(case=m[1], about=m[2].strip(), terminal=m[3].strip()) for m in rows if m}


def demo_request(provider: Provider) -> dict[str, Any]:
    """Return the smallest valid provider-native request body for a demo job of ``provider``."""
    prompt = "Replay the recorded demo answer."
    if provider == "openai_responses":
        return {"input": prompt}
    if provider == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if provider == "anthropic":
        return {"max_tokens": 1024, "messages": [{"role": "user", "content": prompt}]}
    return {"messages": [{"role": "user", "content": prompt}]}
