"""The ``fanout`` console script: one entry point, one subcommand per job.

``replay`` (offline normalization of a recorded body), ``worker``, ``publisher``,
``upstream`` (a local server replaying transcripts as a provider would), ``submit``,
``tail``, ``status``, ``cancel``, ``token``, ``demo``, ``health`` and ``upstreams``. Each
subcommand's module is imported only when it runs.

No user mistake prints a traceback: :func:`main` turns :class:`schema.cli.CommandError`
and the foreign errors a user can cause (a file that cannot be read, a port in use, an
unknown host, Ctrl-C) into one line ``fanout <command>: <what is wrong and what to do>``
on stderr and the exit statuses of :mod:`schema.cli`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fanout_client.cli import quiet_broken_pipe
from fanout_client.errors import EXIT_BROKEN_PIPE
from schema.cli import EXIT_INTERRUPTED, EXIT_USAGE, CommandError

DESCRIPTION = "fanout: normalize LLM provider streams into one ordered, resumable event stream."
BAD_INPUT = "bad input: a flag, a variable, a file, a port already in use (the message says which)"
EXIT_STATUSES: dict[str, dict[int, str]] = {
    "fanout": {0: "success", 1: "refused: the publisher said no, a replayed body broke an invariant, unhealthy",
               2: BAD_INPUT, 3: "a followed stream ended in stream.error (failed, interrupted, cancelled)",
               4: "a service does not answer: the publisher (FANOUT_URL) or Redis (REDIS_URL)"},
    "replay": {0: "the events pass the contract validator", 1: "the events break a contract invariant (on stderr)",
               2: BAD_INPUT},
    "worker": {0: "stopped by SIGTERM or SIGINT after draining", 1: "Redis answers but cannot serve (cluster mode?)",
               2: BAD_INPUT,
               4: "Redis does not answer at REDIS_URL (or --redis-url)"},
    "publisher": {0: "stopped by SIGTERM or SIGINT", 1: "Redis answers but cannot serve (cluster mode?)",
                  2: BAD_INPUT},
    "upstream": {0: "stopped by SIGTERM or SIGINT", 2: BAD_INPUT},
    "submit": {0: "submitted (with --follow: the stream ended completed or incomplete)",
               1: "the publisher refused the call", 2: BAD_INPUT,
               3: "the followed stream ended in stream.error (failed, interrupted, cancelled)",
               4: "the publisher does not answer at FANOUT_URL (or --url)"},
    "tail": {0: "the stream ended completed or incomplete", 1: "the publisher refused the call", 2: BAD_INPUT,
             3: "the stream ended in stream.error (failed, interrupted, cancelled)",
             4: "the publisher does not answer at FANOUT_URL (or --url)"},
    "status": {0: "printed the stream's status", 1: "the publisher refused the call", 2: BAD_INPUT,
               4: "the publisher does not answer at FANOUT_URL (or --url)"},
    "cancel": {0: "the stream is being cancelled", 1: "the publisher refused the call, or the stream already ended",
               2: BAD_INPUT, 4: "the publisher does not answer at FANOUT_URL (or --url)"},
    "token": {0: "printed a fresh read token", 1: "the publisher refused the call", 2: BAD_INPUT,
              4: "the publisher does not answer at FANOUT_URL (or --url)"},
    "demo": {0: "every stream matched its golden result", 1: "a stream did not match, or the demo timed out",
             2: BAD_INPUT, 4: "Redis does not answer at REDIS_URL (unset it for an embedded one)"},
    "export": {0: "caught up (with --follow: stopped by SIGTERM or SIGINT)",
               1: "Redis or the output failed; nothing acknowledged is lost (the message says if a rerun helps)",
               2: BAD_INPUT},
    "health": {0: "healthy", 1: "unhealthy (the reason is printed)", 2: BAD_INPUT},
    "upstreams": {0: "listed",
                  2: "bad input: the upstreams file (FANOUT_UPSTREAMS_FILE) cannot be read or has a mistake"},
}
"""Command → exit status → meaning (docs/client.md, "Exit statuses"); 130 is Ctrl-C."""

COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("tools.replay_cli", "normalize a recorded provider body offline and print the events"),
    "worker": ("worker.main", "run a worker: take jobs from Redis, call providers, append events"),
    "publisher": ("publisher.main", "run the HTTP edge: submit jobs and serve streams over SSE"),
    "upstream": ("tools.upstream", "serve transcripts/ as a fake provider for demos and tests"),
    "submit": ("fanout_client.cli", "submit a job over HTTP and optionally follow its stream"),
    "tail": ("fanout_client.cli", "follow a stream over SSE with automatic resume"),
    "status": ("fanout_client.cli_manage", "print a stream's state and its assembled result so far"),
    "cancel": ("fanout_client.cli_manage", "cancel a running stream (API key)"),
    "token": ("fanout_client.cli_manage", "mint a fresh read token for a stream (API key)"),
    "demo": ("tools.demo.run", "run the whole stack locally on recorded transcripts"),
    "export": ("tools.export_cli", "write finished streams (summaries and events) to NDJSON or Parquet, resumably"),
    "health": ("tools.health",
               "exit 0 when Redis at REDIS_URL (and FANOUT_HEALTH_URL, if set) answer: the container check"),
    "upstreams": ("tools.upstreams_cli",
                  "list the endpoints and routes of FANOUT_UPSTREAMS_FILE (or today's variables), no secrets"),
}
"""Subcommand → (module defining ``add_arguments(parser)`` and ``run(args) -> int``, help)."""


def exit_epilog(command: str) -> str:
    """Return the ``exit status:`` section of a command's help text."""
    codes = {**EXIT_STATUSES[command], EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
             EXIT_BROKEN_PIPE: "standard output was closed early (| head): stopped quietly"}
    return "exit status:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in codes.items())


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks and appends each option's default to its help.

    The default is left out when it says nothing (``None``, ``False``, empty) or when the
    help already speaks of it (the word ``default``, or ``(env VARIABLE ...)``).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        silent = default in (None, False, argparse.SUPPRESS) or default == [] or not action.option_strings
        if silent or "default" in text.lower() or "(env " in text:
            return action.help
        return f"{text} (default: %(default)s)"


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Return the parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(prog="fanout", description=DESCRIPTION, epilog=exit_epilog("fanout"),
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                             epilog=exit_epilog(name), formatter_class=HelpFormatter)
        cmd.set_defaults(module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(cmd, name)
    return parser


def _demo_plugin(app: Any) -> None:
    """Install the publisher's ``demo`` plug-in; :mod:`tools.demo.routes` is imported only then."""
    from tools.demo.routes import install  # noqa: PLC0415 - the product never imports tools; only this hand-over

    install(app)


PLUGINS: dict[str, Callable[[Any], None]] = {"demo": _demo_plugin}
"""What ``fanout publisher`` hands the publisher as plug-ins (:data:`publisher.api.routes.Plugins`)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fanout`` command line; return the process exit code (:data:`EXIT_STATUSES`)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(args_list).parse_args(args_list)
    args.plugins = PLUGINS
    try:
        code: int = importlib.import_module(args.module).run(args)
        sys.stdout.flush()  # a closed pipe shows here, not as "Exception ignored" at exit
    except CommandError as exc:
        return _fail(args, exc.message, exc.exit_status)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:  # stdout's reader left (``fanout tail ... | head``): stop quietly
        return quiet_broken_pipe()
    except OSError as exc:
        return _fail(args, _os_error_message(args, exc), EXIT_USAGE)
    return code


def _fail(args: argparse.Namespace, message: str, status: int) -> int:
    sys.stderr.write(f"fanout {args.command}: {message}\n")
    return status


def _os_error_message(args: argparse.Namespace, exc: OSError) -> str:
    """Word an ``OSError`` a user caused: a file that cannot be read, a port that cannot be bound.

    Anything else is not a user mistake and is raised again (a bug shows its traceback).
    """
    listen = f"{getattr(args, 'host', '?')}:{getattr(args, 'port', '?')}"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {listen}: the address is already in use; stop what holds it or choose " \
               "another --port (0 picks a free one)"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return f"cannot listen on {listen}: no such local address; use --host 127.0.0.1, 0.0.0.0 or an " \
               "address of this machine"
    if exc.errno == errno.EACCES and exc.filename is None:
        return f"cannot listen on {listen}: permission denied (ports below 1024 need privileges); " \
               "choose a --port above 1024"
    if exc.filename is not None:
        return f"cannot read {exc.filename}: {exc.strerror or exc}"
    raise exc


if __name__ == "__main__":
    raise SystemExit(main())
