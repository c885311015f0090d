"""The wheel the Dockerfile installs carries everything the services need, and the image is sound.

No Docker engine runs here; ``make image-check`` (root, ``scripts/image_check.sh``) builds
and runs the image with buildah and podman. These tests, which need neither, check what it
depends on: the files it copies exist, the wheel (``pip install .`` in the build stage)
holds the packages, the CLI module, the JSON Schema and the demo page, and the final stage
is non-root with the ``fanout`` entry point and a health check.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("fanout-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_packages_cli_schema_and_demo_page(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for required in ("fanout_cli.py", "schema/contract.py", "schema/contract.schema.json", "fanout_client/contract.py",
                     "worker/normalizer.py", "worker/adapters/anthropic.py", "publisher/app.py",
                     "tools/demo/static/demo.html", "publisher/api/openapi.json"):
        assert required in names, required
    assert not any(name.startswith("tests/") for name in names)


def test_wheel_serves_the_repository_openapi_json(wheel: zipfile.ZipFile) -> None:
    assert wheel.read("publisher/api/openapi.json") == (ROOT / "openapi.json").read_bytes()


def test_wheel_holds_every_demo_asset_and_the_vendored_licenses(wheel: zipfile.ZipFile) -> None:
    from tools.demo.routes import ASSETS

    names = set(wheel.namelist())
    for path in ASSETS.values():
        assert path.relative_to(ROOT).as_posix() in names, path
    for license_file in ("marked.LICENSE", "dompurify.LICENSE", "dompurify.LICENSE-MPL", "README.md"):
        assert f"tools/demo/static/vendor/{license_file}" in names, license_file


def test_vendored_libraries_are_the_npm_files_their_readme_names() -> None:
    vendor = ROOT / "tools" / "demo" / "static" / "vendor"
    readme = (vendor / "README.md").read_text(encoding="utf-8")
    for name, banner, version in (("marked.umd.js", "marked v", "18.2.1"), ("purify.min.js", "DOMPurify ", "3.5.0")):
        data = (vendor / name).read_bytes()
        assert f"`{name}` `{hashlib.sha256(data).hexdigest()}`" in readme, f"{name} changed without its README row"
        assert f"{banner}{version}".encode() in data[:400], name
        assert f"| {version} |" in readme


def test_wheel_declares_the_fanout_console_script(wheel: zipfile.ZipFile) -> None:
    entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "fanout = fanout_cli:main" in wheel.read(entry_points).decode()


def test_every_path_the_dockerfile_copies_exists() -> None:
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY") and "--from=" not in line:
            sources = [s for s in line.split()[1:-1] if not s.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), source


def test_image_is_multi_stage_non_root_with_entrypoint_and_healthcheck() -> None:
    stages = re.findall(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)
    assert len(stages) >= 2
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    assert "gcc" not in final, "build tools must stay in the build stage"
    assert re.search(r"^USER fanout$", final, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["fanout"]' in final
    assert 'HEALTHCHECK' in final
    assert '"fanout", "health"' in final


def test_health_subcommand_and_roles_parse() -> None:
    from fanout_cli import build_parser

    for argv in (["worker", "--concurrency", "4"], ["publisher", "--host", "0.0.0.0", "--port", "8080"], ["health"]):
        args = build_parser(argv).parse_args(argv)
        assert args.command == argv[0]
