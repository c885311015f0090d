"""Print the chart's manifests, as ``helm template`` would, without a helm binary.

    .venv/bin/python scripts/helm_template.py [-f my-values.yaml ...] [--name fanout] [--namespace default]

Renders ``helm/fanout`` with Helm v4 in-process (``helm-python-sdk``, in the ``dev``
extra: Helm's Go SDK as a library), the way ``tests/test_helm_render.py`` does. Values
files are merged left to right over the chart's ``values.yaml`` (a later file wins, maps
merge key by key). Exit 1 with Helm's message when rendering fails (e.g. no Redis given);
exit 2 when a values file cannot be read or is not a YAML map.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "fanout"


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``over`` merged in: maps key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_values(path: Path) -> dict[str, Any]:
    """Return the map of one values file; ``ValueError`` naming the file when it cannot be used."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; write it first: it sets at least redis.url (or "
                         "redis.existingSecret) and secrets.tokenSecret (or secrets.existingSecret), "
                         "see helm/README.md") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a values file must be a YAML map (key: value), not a {type(loaded).__name__}")
    return loaded


def render(values: dict[str, Any], *, name: str = "fanout", namespace: str = "default") -> str:
    """Return the rendered manifests (NOTES.txt left out), YAML documents separated by ``---``."""
    manifests = helm.Chart.load(CHART).render(values, name=name, namespace=namespace)
    return "".join(f"---\n# Source: {path}\n{text.strip()}\n" for path, text in sorted(manifests.items())
                   if path.endswith(".yaml") and text.strip())


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, render, print; return the exit status."""
    parser = argparse.ArgumentParser(description="Render helm/fanout without a helm binary.")
    parser.add_argument("-f", "--values", action="append", default=[], type=Path, help="a values file (repeatable)")
    parser.add_argument("--name", default="fanout", help="release name (default fanout)")
    parser.add_argument("--namespace", default="default", help="namespace (default default)")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for path in args.values:
        try:
            values = merge(values, read_values(path))
        except ValueError as exc:
            print(f"helm_template: {exc}", file=sys.stderr)
            return 2
    helm.disable_logging()
    try:
        sys.stdout.write(render(values, name=args.name, namespace=args.namespace))
    except helm.HelmError as exc:
        print(f"helm_template: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
