"""``fanout upstreams``: list the endpoints and routes this environment configures, without secrets.

Reads what a worker or publisher started here would read (:func:`schema.upstreams.load_upstreams`:
``FANOUT_UPSTREAMS_FILE``, or today's ``FANOUT_*_BASE_URL`` variables) and prints each
endpoint (name, APIs, platform, auth kind, URL, where its secret is: a variable's name or a
file's path, never the value) and each route (public model, endpoints in order, the model
sent to each). ``--json`` prints the same as one JSON object. A mistake in the file is exit 2
with the worker's message (file, table, key); a listing never reads a secret.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from schema.cli import CommandError, redact_url
from schema.settings import SettingsError
from schema.upstreams import Endpoint, Upstreams
from schema.upstreams_file import load_upstreams


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``upstreams`` options."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    """Print the endpoints and routes; return 0.

    Raises:
        CommandError: The upstreams file cannot be read or has a mistake (exit 2).
    """
    try:
        upstreams = load_upstreams(os.environ)
    except SettingsError as exc:
        raise CommandError(str(exc)) from exc
    listing = describe(upstreams)
    if args.json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    else:
        sys.stdout.write(render(listing))
    return 0


def _secret_source(endpoint: Endpoint) -> str:
    if endpoint.secret_file:
        return f"file {endpoint.secret_file}"
    if endpoint.secret_env:
        return f"env {endpoint.secret_env}"
    if endpoint.auth == "aws":
        return "AWS credential chain (or env AWS_BEARER_TOKEN_BEDROCK)"
    return "Application Default Credentials" if endpoint.auth == "google" else "-"


def describe(upstreams: Upstreams) -> dict[str, Any]:
    """Return the listing as JSON-ready data: ``source``, ``endpoints`` and ``routes`` (no secret values)."""
    endpoints = [{"name": e.name, "apis": list(e.apis), "platform": e.platform, "auth": e.auth,
                  "url": redact_url(e.url), "secret": _secret_source(e), "region": e.region}
                 for e in upstreams.endpoints.values()]
    routes = [{"model": r.name, "endpoints": [{"endpoint": name, "model": r.model_for(name)} for name in r.endpoints]}
              for r in upstreams.models.values()]
    defaults = [{"provider": api, "endpoint": name} for api, name in upstreams.defaults.items()]
    return {"source": upstreams.source or None, "endpoints": endpoints, "routes": routes, "defaults": defaults}


def render(listing: dict[str, Any]) -> str:
    """Return the listing as aligned text tables."""
    source = listing["source"] or "no FANOUT_UPSTREAMS_FILE: endpoints from FANOUT_*_BASE_URL and the API key variables"
    lines = [f"upstreams: {source}", "", "endpoints:"]
    rows = [(e["name"], "/".join(e["apis"]), e["platform"], e["auth"], e["url"], e["secret"])
            for e in listing["endpoints"]]
    lines += _table(("NAME", "APIS", "PLATFORM", "AUTH", "URL", "SECRET FROM"), rows)
    if listing["routes"]:
        lines += ["", "routes (model: endpoints in order, model sent):"]
        lines += [f"  {r['model']}: " + ", ".join(f"{e['endpoint']} ({e['model']})" for e in r["endpoints"])
                  for r in listing["routes"]]
    if listing["defaults"]:
        lines += ["", "a job naming no endpoint goes to:"]
        lines += [f"  {d['provider']}: {d['endpoint']}" for d in listing["defaults"]]
    return "\n".join(lines) + "\n"


def _table(header: tuple[str, ...], rows: Sequence[tuple[Any, ...]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    return ["  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in (header, *rows)]
