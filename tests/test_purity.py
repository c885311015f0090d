"""The pure core imports no I/O framework (STYLE.md, "Pure core, thin shell")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"asyncio", "aiohttp", "redis", "opentelemetry", "socket", "subprocess", "infra"}
PURE = [
    *sorted((ROOT / "schema").glob("*.py")),
    *(ROOT / "client" / "fanout_client" / f"{name}.py"
      for name in ("contract", "reducer", "errors", "sse", "text_view")),
    ROOT / "worker" / "frames.py",
    ROOT / "worker" / "sse.py",
    ROOT / "worker" / "sse_lines.py",
    ROOT / "worker" / "jsonarray.py",
    ROOT / "worker" / "eventstream.py",
    ROOT / "worker" / "eventstream_headers.py",
    ROOT / "worker" / "bedrock_frames.py",
    ROOT / "worker" / "jsonscan.py",
    ROOT / "worker" / "normalizer.py",
    ROOT / "worker" / "outbox.py",
    ROOT / "worker" / "blocks.py",
    ROOT / "worker" / "terminal.py",
    ROOT / "worker" / "error_policy.py",
    ROOT / "worker" / "routing.py",
    ROOT / "worker" / "pipeline.py",
    ROOT / "worker" / "jobentry.py",
    ROOT / "worker" / "summary.py",
    ROOT / "worker" / "platforms.py",
    ROOT / "worker" / "upstream_errors.py",
    ROOT / "tools" / "replay.py",
    *sorted((ROOT / "publisher" / "wire").glob("*.py")),
    ROOT / "publisher" / "history" / "entries.py",
    ROOT / "publisher" / "history" / "visibility.py",
    ROOT / "publisher" / "live" / "notification.py",
    ROOT / "publisher" / "api" / "tokens.py",
    *sorted((ROOT / "worker" / "adapters").glob("*.py")),
]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", [p for p in PURE if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_io(path: Path) -> None:
    assert _imports(path) & FORBIDDEN == set()
