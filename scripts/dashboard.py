"""Write the chart's Grafana dashboard, ``helm/fanout/dashboards/fanout.json``.

Every metric name and PromQL query of the dashboard is in :data:`PANELS` below, and only
there: rename a metric here, run ``python scripts/dashboard.py``, commit both files
(``tests/test_helm_render.py`` fails while the JSON and this table disagree). Names are the
OpenTelemetry instruments as the Prometheus exporter renders them (dots become
underscores, the unit becomes a suffix, counters end in ``_total``).

Source followed: Grafana's dashboard JSON model (``panels``, ``targets``, ``gridPos``,
``templating``), schema version 39.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "helm" / "fanout" / "dashboards" / "fanout.json"
RATE = "$__rate_interval"
QUANTILES = ("0.5", "0.95", "0.99")


def _quantiles(histogram: str) -> list[tuple[str, str]]:
    """p50/p95/p99 of a histogram's ``_bucket`` series over all pods."""
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{RATE}])))", f"p{float(q) * 100:g}")
        for q in QUANTILES
    ]


PANELS: list[dict[str, Any]] = [
    {"title": "Streams ended by status", "unit": "ops", "stack": True, "queries": [
        (f"sum by (status) (rate(fanout_streams_ended_total[{RATE}]))", "{{status}}")]},
    {"title": "Failed streams by category", "unit": "ops", "stack": True, "queries": [
        (f'sum by (category) (rate(fanout_streams_ended_total{{status=~"failed|interrupted"}}[{RATE}]))',
         "{{category}}")]},
    {"title": "Time to first delta", "unit": "s", "queries": _quantiles("fanout_time_to_first_delta_seconds")},
    {"title": "Delivery latency (stored to sent)", "unit": "s",
     "queries": _quantiles("fanout_delivery_latency_seconds")},
    {"title": "SSE readers open", "unit": "short", "stack": True, "queries": [
        ("sum by (pod) (fanout_sse_readers)", "{{pod}}")]},
    {"title": "Jobs pending per shard", "unit": "short", "queries": [
        ("max by (shard) (fanout_jobs_pending)", "shard {{shard}}")]},
    {"title": "Redis errors by kind", "unit": "ops", "stack": True, "queries": [
        (f"sum by (kind) (rate(fanout_redis_errors_total[{RATE}]))", "{{kind}}")]},
]
"""Panel title, unit (Grafana unit id), stacked or not, and its (PromQL, legend) queries."""


def panel(index: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One time-series panel, two per row of the 24-column grid, 8 units high."""
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": spec["title"],
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {
            "defaults": {
                "unit": spec["unit"],
                "custom": {"stacking": {"mode": "normal" if spec.get("stack") else "none"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
            for n, (expr, legend) in enumerate(spec["queries"])
        ],
    }


def dashboard() -> dict[str, Any]:
    """Return the whole dashboard: a Prometheus datasource variable and the panels of :data:`PANELS`."""
    return {
        "uid": "fanout",
        "title": "fanout",
        "tags": ["fanout"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
        ]},
        "panels": [panel(i, spec) for i, spec in enumerate(PANELS)],
    }


def render() -> str:
    """Return the dashboard file's exact text (sorted keys, two-space indent, final newline)."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    """Write :data:`OUT`; with ``--check``, exit 1 when it differs instead of writing."""
    text = render()
    if "--check" in sys.argv[1:]:
        same = OUT.is_file() and OUT.read_text() == text
        if not same:
            sys.stderr.write(f"{OUT} is stale: run python scripts/dashboard.py\n")
        return 0 if same else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
