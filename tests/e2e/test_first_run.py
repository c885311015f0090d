"""What a new user runs from the README and the docs works as written.

The README's 60-second tour and the quickstart's "Trying the stack by hand" are run
as shell scripts, word for word but for the placeholders (`<port>`, `<printed key>`,
`<last id you saw>`), with the real ``curl`` against a real stack (publisher, worker,
``fanout upstream``, Redis). The Python examples of ``client/README.md`` and
``docs/client.md`` are run as written against the same stack, with its URL, key and a
recorded case as the model. ``fanout replay`` names every provider it accepts; ``fanout
export`` without pyarrow names the install command of a checkout; ``health`` names the
Redis it checks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.demo.stack import LocalStack
from tools.replay_cli import KINDS

ROOT = Path(__file__).resolve().parents[2]
TOUR_CASE = "slow-thinking_with_signature"
"""The model the tour submits; the stack below paces its slow cases quickly."""
TOUR_EVENTS = 10
"""Events of ``thinking_with_signature`` (``transcripts/anthropic``)."""

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="the tour runs curl, which is not on PATH")


@pytest.fixture(scope="module")
def stack(single_redis_url: str) -> Iterator[LocalStack]:
    with LocalStack(single_redis_url, workers=1, delay_ms=5, chunk_bytes=256, slow_delay_ms=20) as running:
        yield running


def shell_block(path: Path, containing: str) -> str:
    """Return the first ```sh block of ``path`` that holds ``containing``."""
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
    found = [block for block in blocks if containing in block]
    assert found, f"{path.name} has no sh block with {containing!r}"
    return found[0]


def python_block(path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, f"{path.name}: one python example expected"
    return str(blocks[0])


def commands(block: str) -> list[str]:
    """Split a shell block into its commands: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for raw in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def run_script(lines: list[str], stack: LocalStack, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lines`` in bash in ``cwd``, placeholders filled; ``.venv/bin/activate`` there puts this Python first."""
    (cwd / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    (cwd / ".venv" / "bin" / "activate").write_text(f'PATH="{Path(sys.executable).parent}:$PATH"\n')
    script = "set -e\n" + "\n".join(lines).replace("<port>", str(stack.publisher_port)).replace(
        "<printed key>", stack.api_key) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def sse_ids(text: str) -> list[str]:
    return [line.removeprefix("id: ") for line in text.splitlines() if line.startswith("id: ")]


def read_then_resume(block: str, stack: LocalStack, cwd: Path) -> tuple[list[str], list[str], list[str]]:
    """Run the block up to its first read, then its resume after the 4th id seen.

    Returns:
        (ids of the first read, ids of the resume, the commands after the resume).
    """
    lines = commands(block)
    reads = [i for i, line in enumerate(lines) if line.startswith("curl -N")]
    assert len(reads) >= 2, lines
    first, resume = reads[0], reads[1]
    assert "Last-Event-ID: <last id you saw>" in lines[resume], lines[resume]
    done = run_script(lines[: first + 1], stack, cwd)
    assert done.returncode == 0, done.stderr
    seen = sse_ids(done.stdout)
    setup = [line for line in lines[:first] if line.startswith((".", "export ", "STREAM_ID=", "TOKEN="))]
    again = run_script([*setup, lines[resume].replace("<last id you saw>", seen[3])], stack, cwd)
    assert again.returncode == 0, again.stderr
    return seen, sse_ids(again.stdout), [*setup, *lines[resume + 1:]]


@needs_curl
def test_the_readme_tour_submits_reads_and_resumes_as_written(stack: LocalStack, tmp_path: Path) -> None:
    block = shell_block(ROOT / "README.md", "Last-Event-ID")
    assert TOUR_CASE in block
    seen, resumed, _ = read_then_resume(block, stack, tmp_path)
    assert [int(i.split(".")[0]) for i in seen] == list(range(1, TOUR_EVENTS + 1))
    assert len({i.split(".")[1] for i in seen}) == 1, "one epoch"
    assert resumed == seen[4:], "the rest, each event once"


@needs_curl
def test_the_quickstart_by_hand_block_runs_as_written_and_ends_with_204(stack: LocalStack, tmp_path: Path) -> None:
    block = shell_block(ROOT / "docs" / "quickstart.md", "Last-Event-ID")
    seen, resumed, rest = read_then_resume(block, stack, tmp_path)
    assert resumed == seen[4:]
    assert f"Last-Event-ID: {TOUR_EVENTS}'" in rest[-1], "the page's 204 line names the case's last seq"
    done = run_script(rest, stack, tmp_path)
    assert (done.returncode, done.stdout) == (0, "204\n"), done.stderr


def run_example(path: Path, stack: LocalStack, provider: str, case: str, tmp_path: Path) -> str:
    """Run the page's Python example against ``stack`` with ``case`` as the model; return its output."""
    code = python_block(path)
    model = re.search(r'model="([^"]+)"', code)
    assert model, code
    assert re.search(rf'provider="{provider}"', code), code
    code = (code.replace("http://127.0.0.1:8080", stack.base_url).replace("<API key>", stack.api_key)
            .replace(model.group(0), f'model="{case}"'))
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_client_readme_example_prints_the_answer_as_it_arrives(stack: LocalStack, tmp_path: Path) -> None:
    out = run_example(ROOT / "client" / "README.md", stack, "anthropic", "thinking_with_signature", tmp_path)
    text, result = out.split("\n", 1)
    assert text == "2^10 = 1024 ครับ ✅", out  # the text block's deltas, not the reasoning's
    assert result.startswith("AssembledResult("), out
    assert "status='completed'" in result, out


def test_the_docs_client_example_prints_every_event_then_the_result(stack: LocalStack, tmp_path: Path) -> None:
    out = run_example(ROOT / "docs" / "client.md", stack, "openai_chat", "simple_text_greek_usage_chunk", tmp_path)
    lines = out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines[:-1]] == [str(seq) for seq in range(1, 13)], out
    assert lines[0].startswith("1 StreamStart("), out
    assert lines[-2].startswith("12 StreamDone("), out
    assert lines[-1].startswith("AssembledResult("), out
    assert "Καλημέρα" in lines[-1], out


def fanout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)


def test_replay_help_and_its_missing_provider_message_name_every_accepted_value(tmp_path: Path) -> None:
    help_text = " ".join(fanout("replay", "--help").stdout.split())
    body = tmp_path / "body.sse"
    body.write_text("data: {}\n\n")
    done = fanout("replay", str(body))
    assert done.returncode == 2, done.stderr
    for kind in KINDS:
        assert kind in help_text, kind
        assert kind in done.stderr, kind



def test_parquet_without_pyarrow_names_the_checkout_install_of_the_parquet_extra(tmp_path: Path) -> None:
    """It said ``pip install 'fanout[parquet]'``, which asks an index for a package named fanout."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(dep.startswith("pyarrow") for dep in extras["parquet"])
    hide_pyarrow = ("import runpy, sys; sys.modules['pyarrow'] = None; sys.argv = ['fanout', *sys.argv[1:]]; "
                    "runpy.run_module('fanout_cli', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide_pyarrow, "export", "--format", "parquet", "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "pip install -e '.[parquet]' in the fanout checkout" in done.stderr, done.stderr
    assert "fanout[parquet]" not in (ROOT / "docs" / "export.md").read_text(encoding="utf-8")


def test_health_help_says_where_the_redis_it_checks_comes_from() -> None:
    """``fanout health --url`` is an HTTP URL; the Redis checked is ``REDIS_URL``, which its help did not say."""
    for args in (("health", "--help"), ("--help",)):
        text = " ".join(fanout(*args).stdout.split())
        assert "Redis at REDIS_URL" in text, args
