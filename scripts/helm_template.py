"""Print the chart's manifests, as ``helm template`` would, without a helm binary.

    .venv/bin/python scripts/helm_template.py [-f my-values.yaml ...] [--name fanout] [--namespace default]

Renders ``helm/fanout`` with Helm v4 in-process (``helm-python-sdk``, in the ``dev``
extra: Helm's Go SDK as a library), the way ``tests/test_helm_render.py`` does. Values
files are merged left to right over the chart's ``values.yaml`` (a later file wins, maps
merge key by key). Exit 1 with Helm's message when rendering fails (e.g. no Redis given).
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
        values = merge(values, yaml.safe_load(path.read_text()) or {})
    helm.disable_logging()
    try:
        sys.stdout.write(render(values, name=args.name, namespace=args.namespace))
    except helm.HelmError as exc:
        print(f"helm_template: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
