"""The Python client installs cleanly on its own: one package, two dependencies, nothing of the server.

``client/`` is the ``fanout-client`` distribution. Its wheel holds only ``fanout_client``;
its metadata requires ``aiohttp`` and ``msgspec`` only; no module of it imports
``schema``, ``worker`` or ``publisher``. A fresh virtual environment with only that wheel
(and its two dependencies) submits a job to a real publisher and follows it to the end,
and runs ``fanout-client --help``, while ``import schema`` fails there.
"""

from __future__ import annotations

import ast
import email
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.publisher.conftest import StartApp
from tests.publisher.helpers import API_KEY, StreamWriter, text_stream

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
SERVER_PACKAGES = {"schema", "worker", "publisher", "fanout_cli"}


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("client-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(CLIENT)],
                   check=True, capture_output=True, timeout=300)
    (path,) = out.glob("fanout_client-*.whl")
    return path


def test_client_wheel_holds_only_fanout_client_and_requires_aiohttp_and_msgspec(client_wheel: Path) -> None:
    with zipfile.ZipFile(client_wheel) as wheel:
        names = wheel.namelist()
        metadata = email.message_from_bytes(wheel.read(next(n for n in names if n.endswith("/METADATA"))))
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"fanout_client"}
    requires = sorted(re.split(r"[<>=!~; ]", req, maxsplit=1)[0] for req in metadata.get_all("Requires-Dist"))
    assert requires == ["aiohttp", "msgspec"]
    assert "fanout_client/py.typed" in names


@pytest.mark.parametrize("path", sorted((CLIENT / "fanout_client").glob("*.py")), ids=lambda p: p.name)
def test_client_module_imports_nothing_of_the_server(path: Path) -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported & SERVER_PACKAGES == set()


@pytest.fixture(scope="module")
def client_venv(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding only the client wheel and what it requires."""
    where = tmp_path_factory.mktemp("client-venv") / "venv"
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(client_wheel)],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip(f"the package index cannot serve the client's dependencies here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    return python


def test_fresh_environment_has_no_server_packages(client_venv: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('schema', 'worker', 'publisher') if u.find_spec(m)])"
    done = subprocess.run([str(client_venv), "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                          cwd="/")
    assert done.stdout.strip() == "[]"
    helped = subprocess.run([str(client_venv.parent / "fanout-client"), "--help"], capture_output=True, text=True,
                            timeout=60, check=False, cwd="/")
    assert helped.returncode == 0
    assert "submit" in helped.stdout
    assert "tail" in helped.stdout


SCRIPT = """
import asyncio, sys
from fanout_client import FanoutClient

async def main(url, key, sid):
    async with FanoutClient(url, api_key=key) as client:
        seqs = [event.seq async for event in client.events(sid)]
        result = await client.result(sid)
    print(seqs, result.status, result.blocks[0].text)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_client_alone_follows_a_stream_from_a_real_publisher(
    client_venv: Path, start_app: StartApp, redis_client: object, keys: object, sid: str,
) -> None:
    import asyncio

    server = await start_app()
    writer = StreamWriter(redis_client, keys, sid)  # type: ignore[arg-type]
    await writer.meta()
    await writer.append(*text_stream(sid, 2))
    proc = await asyncio.create_subprocess_exec(str(client_venv), "-c", SCRIPT, server.base_url, API_KEY, sid,
                                                cwd="/", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "[1, 2, 3, 4, 5, 6] completed t0 t1"
