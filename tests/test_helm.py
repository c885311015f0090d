"""The Helm chart (``helm/fanout``), checked without helm or a YAML library.

What can drift is checked against the code: every ``FANOUT_*`` name in the chart is a
settings field, the ConfigMap's defaults load in both processes, container commands parse
with the ``fanout`` CLI, probe paths are publisher routes, the grace periods outlast the
drain, the uid is the image's. Templates are checked for balanced actions, defined
includes, existing ``.Values`` paths, and a YAML shape once their actions are blanked out.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from fanout_cli import build_parser
from publisher.api.routes import ROUTES
from publisher.settings import PublisherSettings
from schema.logs import LogSettings
from schema.settings import load_settings
from worker.runner import STOP_GRACE_S
from worker.settings import WorkerSettings, load_worker_settings
from worker.upstream import credentials_from_env

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "fanout"
TEMPLATES = sorted((CHART / "templates").iterdir())
MANIFESTS = [p for p in TEMPLATES if p.suffix == ".yaml"]
ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
KEY_LINE = re.compile(r"""^(?P<key>[A-Za-z0-9_./"-]+):(?: (?P<value>.*))?$""")
BLOCKS = ("if", "with", "range", "define", "block")


def actions(text: str) -> list[str]:
    """Bodies of every ``{{ }}`` action, trim markers and spaces removed."""
    return [m.group(1).removeprefix("-").removesuffix("-").strip() for m in ACTION.finditer(text)]


def strip_comment(value: str) -> str:
    """A scalar without its trailing `` # comment`` (values.yaml has no ``#`` inside values)."""
    return value.split(" #", 1)[0].strip()


def read_values() -> dict[tuple[str, ...], str]:
    """values.yaml in the block-style subset it is written in: key path -> raw scalar.

    Maps are nested ``key:`` lines indented by 2; lists (``- ``) are leaves (their items are
    not walked); flow collections only as ``{}`` or ``[]``. Anything else fails the test,
    so the file stays in a subset this reader understands.
    """
    paths: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    list_under: int | None = None
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        where = f"values.yaml:{number}"
        assert "\t" not in line, f"{where}: tab"
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"{where}: odd indentation"
        if list_under is not None and indent > list_under:
            continue
        list_under = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if body.startswith("- "):
            assert stack, f"{where}: list item at the top level"
            assert not paths[tuple(k for _, k in stack)], f"{where}: list item under a scalar"
            list_under = stack[-1][0]
            continue
        match = KEY_LINE.match(body)
        assert match, f"{where}: not a `key: value` line"
        value = strip_comment(match.group("value") or "")
        assert value.count('"') % 2 == 0, f"{where}: unbalanced quotes"
        assert not value.startswith(("{", "[")) or value in ("{}", "[]"), f"{where}: non-empty flow collection"
        assert not value.startswith(("|", ">", "&", "*", "!")), f"{where}: outside the checked subset"
        stack.append((indent, match.group("key")))
        paths[tuple(k for _, k in stack)] = value.strip('"')
    return paths


VALUES = read_values()


def test_values_yaml_nests_only_under_empty_keys() -> None:
    for path in VALUES:
        if len(path) > 1:
            assert VALUES[path[:-1]] == "", f"{'.'.join(path)} sits under a scalar"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_actions_balance(path: Path) -> None:
    text = path.read_text()
    assert text.count("{{") == text.count("}}") == len(actions(text))
    open_blocks: list[str] = []
    for body in actions(text):
        if body.startswith("/*"):
            assert body.endswith("*/"), body
            continue
        word = body.split(None, 1)[0]
        if word in BLOCKS:
            open_blocks.append(word)
        elif word == "else":
            assert open_blocks[-1:] in (["if"], ["with"], ["range"]), f"stray else in {path.name}"
        elif word == "end":
            assert open_blocks, f"end without a block in {path.name}"
            open_blocks.pop()
    assert not open_blocks, f"unclosed {open_blocks} in {path.name}"


def test_includes_name_defined_templates() -> None:
    defined = set(re.findall(r'define "([^"]+)"', (CHART / "templates" / "_helpers.tpl").read_text()))
    for path in TEMPLATES:
        text = path.read_text()
        for name in re.findall(r'(?:include|template) "([^"]+)"', text):
            assert name in defined, f"{path.name} includes undefined {name}"
        for name in re.findall(r'print \$\.Template\.BasePath "/([^"]+)"', text):
            assert (CHART / "templates" / name).is_file(), f"{path.name} includes missing {name}"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_values_references_exist(path: Path) -> None:
    text = path.read_text()
    aliases = dict(re.findall(r"(\$\w+) := \.Values((?:\.\w+)+)", text))
    references = re.findall(r"\.Values((?:\.\w+)+)", text)
    for alias, prefix in aliases.items():
        references += [prefix + rest for rest in re.findall(re.escape(alias) + r"((?:\.\w+)+)", text)]
    for reference in references:
        assert tuple(reference.strip(".").split(".")) in VALUES, f"{path.name}: .Values{reference} not in values.yaml"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_yaml_shaped_once_actions_are_blanked(path: Path) -> None:
    """Action-only lines go (their ``nindent`` must equal their own indentation); the rest
    must read as block YAML: even indentation, deeper only under ``key:`` or a list item."""
    lines: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.name}:{number}"
        body = line.strip()
        if ACTION.sub("", body).strip() == "" and body:
            for width in re.findall(r"nindent (\d+)", body):
                assert line.startswith(" " * int(width) + "{{"), f"{where}: nindent {width} at another indentation"
            continue
        body = ACTION.sub("X", body)
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert "\t" not in line, f"{where}: tab"
        assert indent % 2 == 0, f"{where}: odd indentation"
        item = body.removeprefix("- ")
        assert KEY_LINE.match(item) or body.startswith("- "), f"{where}: neither `key: value` nor a list item"
        if lines and indent > lines[-1][0]:
            previous_indent, previous = lines[-1]
            opens = previous.endswith(":") or (previous.startswith("- ") and indent == previous_indent + 2)
            assert opens, f"{where}: deeper than a line that opens nothing"
            assert indent <= previous_indent + 4, f"{where}: too deep"
        lines.append((indent, body))
    top = {body.split(":", 1)[0] for indent, body in lines if indent == 0}
    assert {"apiVersion", "kind", "metadata"} <= top, f"{path.name}: not a Kubernetes object"


def test_every_fanout_variable_is_a_settings_field() -> None:
    fields = {*WorkerSettings.__struct_fields__, *PublisherSettings.__struct_fields__, *LogSettings.__struct_fields__}
    helm_files = [p for p in (ROOT / "helm").rglob("*") if p.is_file()]
    names = {name for p in helm_files for name in re.findall(r"\bFANOUT_[A-Z0-9_]+\b", p.read_text())}
    assert {"FANOUT_DRAIN_S", "FANOUT_SHUTDOWN_WINDOW_S"} <= names
    unknown = {n for n in names if n.removeprefix("FANOUT_").lower() not in fields}
    assert not unknown, f"the chart sets variables no settings class reads: {sorted(unknown)}"


def configmap_defaults() -> dict[str, str]:
    """The ConfigMap's literal ``FANOUT_*`` keys with their values.yaml defaults."""
    text = (CHART / "templates" / "configmap.yaml").read_text()
    pairs = re.findall(r"^  (FANOUT_\w+): \{\{ \.Values((?:\.\w+)+) \| quote \}\}$", text, re.M)
    assert pairs
    return {name: VALUES[tuple(path.strip(".").split("."))] for name, path in pairs}


def test_default_configmap_loads_in_both_processes() -> None:
    env = configmap_defaults() | {"FANOUT_TOKEN_SECRET": "x" * 32}
    worker = load_worker_settings(env)
    publisher = load_settings(PublisherSettings, env)
    assert worker.drain_s == float(VALUES["worker", "drainSeconds"])
    assert worker.redis_prefix == publisher.redis_prefix == VALUES["redis", "prefix"]
    assert publisher.shutdown_window_s == float(VALUES["publisher", "shutdownWindowSeconds"])
    assert publisher.shutdown_grace_s == float(VALUES["publisher", "shutdownGraceSeconds"])


def test_worker_gets_every_provider_key_the_code_reads() -> None:
    text = (CHART / "templates" / "worker-deployment.yaml").read_text()
    names = re.findall(r'"([A-Z]+_API_KEY)"', text)
    credentials = credentials_from_env(dict.fromkeys(names, "k"))
    assert all(credentials.key(vendor) for vendor in ("openai", "anthropic", "gemini")), names


def container_commands() -> list[list[str]]:
    """Every ``args:`` and ``command:`` flow list of the Deployments, actions as ``"1"``."""
    found = []
    for name in ("worker-deployment.yaml", "publisher-deployment.yaml"):
        for flow in re.findall(r"(?:args|command): (\[.*\])", (CHART / "templates" / name).read_text()):
            found.append(json.loads(ACTION.sub('"1"', flow)))
    return found


def test_container_commands_parse_with_the_cli() -> None:
    commands = container_commands()
    roles = {c[0] if c[0] != "fanout" else c[1] for c in commands if c[0] != "sleep"}
    assert roles == {"worker", "publisher", "health"}
    for command in commands:
        if command[0] == "sleep":
            continue
        argv = command[1:] if command[0] == "fanout" else command
        assert build_parser(argv).parse_args(argv).command == argv[0]


def test_probe_paths_are_publisher_routes() -> None:
    text = (CHART / "templates" / "publisher-deployment.yaml").read_text()
    paths = re.findall(r"path: (/\S+)", text)
    assert set(paths) == {"/readyz", "/healthz"}
    routes = {path for method, path, _ in ROUTES if method == "GET"}
    assert set(paths) <= routes


def test_grace_periods_outlast_the_drain_and_the_shutdown_window_and_grace() -> None:
    worker = (CHART / "templates" / "worker-deployment.yaml").read_text()
    margin = re.search(r"terminationGracePeriodSeconds: \{\{ add \(ceil \$worker\.drainSeconds\) (\d+) \}\}", worker)
    assert margin, "worker grace period is not drainSeconds plus a margin"
    assert int(margin.group(1)) > STOP_GRACE_S
    publisher = (CHART / "templates" / "publisher-deployment.yaml").read_text()
    assert re.search(
        r"terminationGracePeriodSeconds: \{\{ add \(ceil \$publisher\.preStopSleepSeconds\) "
        r"\(ceil \$publisher\.shutdownWindowSeconds\) \(ceil \$publisher\.shutdownGraceSeconds\) [1-9]\d* \}\}",
        publisher,
    )
    assert "preStop:" in publisher


def test_pods_run_as_the_image_user_without_privileges() -> None:
    uid = re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid
    assert VALUES["podSecurityContext", "runAsNonRoot"] == "true"
    assert VALUES["podSecurityContext", "runAsUser"] == uid.group(1)
    assert VALUES["securityContext", "readOnlyRootFilesystem"] == "true"
    assert VALUES["securityContext", "allowPrivilegeEscalation"] == "false"
    assert re.search(r"^    drop:\n      - ALL$", (CHART / "values.yaml").read_text(), re.M)
    for name in ("worker-deployment.yaml", "publisher-deployment.yaml"):
        text = (CHART / "templates" / name).read_text()
        assert "toYaml .Values.podSecurityContext" in text
        assert "toYaml .Values.securityContext" in text


def test_ingress_defaults_disable_buffering_for_sse() -> None:
    prefix = ("publisher", "ingress", "annotations")
    annotations = {path[-1]: value for path, value in VALUES.items() if path[:-1] == prefix}
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600


def test_chart_metadata() -> None:
    chart = dict(line.split(": ", 1) for line in (CHART / "Chart.yaml").read_text().splitlines() if ": " in line)
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "fanout"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"].strip('"') == version
