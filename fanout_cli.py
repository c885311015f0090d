"""The ``fanout`` console script: one entry point, one subcommand per job.

``replay`` (offline normalization of a recorded body), ``worker``, ``publisher``,
``upstream`` (a local server replaying transcripts as a provider would), ``submit``,
``tail``, ``demo`` and ``health``. Each subcommand's module is imported only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("worker.replay_cli", "normalize a recorded provider body offline and print the events"),
    "worker": ("worker.main", "run a worker: take jobs from Redis, call providers, append events"),
    "publisher": ("publisher.main", "run the HTTP edge: submit jobs and serve streams over SSE"),
    "upstream": ("worker.upstream_server", "serve transcripts/ as a fake provider for demos and tests"),
    "submit": ("publisher.client_cli", "submit a job over HTTP and optionally follow its stream"),
    "tail": ("publisher.client_cli", "follow a stream over SSE with automatic resume"),
    "demo": ("publisher.demo", "run the whole stack locally on recorded transcripts"),
    "export": ("worker.export_cli", "write finished streams (summaries and events) to NDJSON or Parquet, resumably"),
    "health": ("worker.health_cli", "exit 0 when Redis (and FANOUT_HEALTH_URL, if set) answer: the container check"),
}
"""Subcommand → (module defining ``add_arguments(parser)`` and ``run(args) -> int``, help)."""


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Return the parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(prog="fanout", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(cmd, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fanout`` command line; return the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(args_list).parse_args(args_list)
    code: int = importlib.import_module(args.module).run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
