"""``fanout submit`` and ``fanout tail``: the consumer client on the command line.

``submit`` posts a job and prints the publisher's answer (or, with ``--follow``, the
events as they arrive); ``tail`` follows a stream with automatic resume and prints
its events, or the whole stream's assembled result with ``--result``. Events print as
JSON lines when standard output is a pipe or a file, as readable text on a terminal
(:mod:`fanout_client.text_view`); ``--format`` chooses.
The publisher's address comes from ``--url``, else ``FANOUT_URL``, else
:data:`DEFAULT_URL`; the API key from ``--api-key`` or ``FANOUT_API_KEY``; the read
token of ``tail`` from ``--token`` or ``FANOUT_TOKEN``.

Every refusal is one line that names the option or variable to fix
(:class:`fanout_client.errors.CommandError`); exit statuses are those of :mod:`fanout_client.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from fanout_client import cli_manage
from fanout_client.client import FanoutClient
from fanout_client.contract import PROVIDERS, encode_event, parse_event_id
from fanout_client.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STREAM_ERROR,
    CommandError,
    StreamUnavailableError,
)
from fanout_client.reducer import Assembler, result_to_builtins
from fanout_client.refusals import DEFAULT_URL, Credential, Target, refusal, target_of
from fanout_client.snapshot import StreamSnapshot, assembler_from
from fanout_client.text_view import OUTPUT_FORMATS, RULE, OutputFormat, TextView, chosen_format

ERROR_STATUSES: Final = ("failed", "interrupted", "cancelled")
"""Stream statuses of a ``stream.error`` end (exit 3)."""

def _seq(text: str) -> str:
    try:
        parse_event_id(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an event id: a seq (a whole number >= 0) or <seq>.<epoch> as "
                                         f"SSE ids are (got {text!r})") from None
    return text


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the options of ``submit`` or ``tail``."""
    parser.add_argument("--url", help=f"the publisher's root URL, without /v1 (env FANOUT_URL; default {DEFAULT_URL})")
    parser.add_argument("--api-key", help="bearer API key, one of the publisher's FANOUT_API_KEYS "
                                          "(env FANOUT_API_KEY; default: none)")
    if command == "submit":
        parser.add_argument("--provider", required=True, choices=PROVIDERS, metavar="PROVIDER",
                            help="provider API the worker calls: openai_chat (and compatible servers), "
                                 "openai_responses, anthropic or gemini")
        parser.add_argument("--model", required=True,
                            help="the provider's model name; against fanout demo or fanout upstream, a recorded "
                                 "case (transcripts/<dir>/INDEX.md lists them; slow-<case> streams slowly)")
        parser.add_argument("--request", required=True, metavar="FILE|-|JSON",
                            help="the provider-native request body: a JSON file, - for stdin, or the JSON object "
                                 "itself when the value starts with {")
        parser.add_argument("--endpoint", help="an endpoint of the workers' upstreams file (fanout upstreams "
                                               "lists them; default: the model's route, or the provider's endpoint)")
        parser.add_argument("--stream-id", help="choose the stream id (makes the call idempotent)")
        parser.add_argument("--metadata", metavar="JSON",
                            help="a JSON object copied onto stream.start, e.g. '{\"user\": \"u1\"}'")
        parser.add_argument("--follow", action="store_true", help="print the events until the stream ends")
    else:
        parser.add_argument("stream_id", help="the stream's id (submit prints it)")
        parser.add_argument("--token", help="the stream's read token (env FANOUT_TOKEN; default: read with the "
                                            "API key)")
        parser.add_argument("--last-event-id", type=_seq, metavar="ID",
                            help="the id of the last event already held (SEQ or SEQ.EPOCH, as SSE ids are): "
                                 "print only the events after it")
        parser.add_argument("--result", action="store_true",
                            help="print only the whole stream's assembled result once it ended (with "
                                 "--last-event-id too: it waits from there, then the result comes from "
                                 "GET /v1/streams/{id})")
    _add_format(parser)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=OUTPUT_FORMATS, default="auto",
                        help="how events print: json (one JSON line each), text (the answer as text, blocks "
                             "labelled), auto (default: text on a terminal, json when piped)")


def run(args: argparse.Namespace) -> int:
    """Run ``submit`` or ``tail``.

    Exit status: 0 when the call succeeded (and a followed stream ended ``completed`` or
    ``incomplete``), 1 when the publisher refused the call, 2 on bad input, 3 when a
    followed stream ended in ``stream.error`` (failed, interrupted or cancelled), 4 when
    the publisher cannot be reached.

    Raises:
        CommandError: Each of those refusals, worded with what to do.
    """
    target = target_of(args)
    if args.command == "submit":
        return asyncio.run(_submit(args, target))
    token = args.token or os.environ.get("FANOUT_TOKEN") or None
    return asyncio.run(_tail(target, args.stream_id, token, args.last_event_id, result_only=args.result,
                             fmt=args.format))


def _json_object(text: str, where: str, example: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{where} is not JSON ({exc}); it must be one JSON object, e.g. {example}") from exc
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")
        raise CommandError(f"{where} must be a JSON object, e.g. {example}; got a JSON {kind}")
    return value


def read_request(source: str) -> dict[str, Any]:
    """Return the ``--request`` body: inline JSON (starts with ``{``), ``-`` for stdin, else a file.

    Raises:
        CommandError: The file cannot be read, or the text is not one JSON object (exit 2).
    """
    example = "'{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'"
    if source.lstrip().startswith(("{", "[", '"')) or source.strip() in ("null", "true", "false"):
        return _json_object(source, "--request", example)  # JSON, if not an object: said so
    if source == "-":
        return _json_object(sys.stdin.read(), "--request - (stdin)", example)
    how = "give a JSON file, - for stdin, or the JSON object itself ('{...}')"
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CommandError(f"--request {source}: no such file; {how}") from exc
    except IsADirectoryError as exc:
        raise CommandError(f"--request {source}: is a directory; {how}") from exc
    except UnicodeDecodeError as exc:
        raise CommandError(f"--request {source}: not UTF-8 text ({exc.reason}); {how}") from exc
    except OSError as exc:
        raise CommandError(f"--request {source}: cannot read it ({exc.strerror or exc}); {how}") from exc
    return _json_object(text, f"--request {source}", example)


async def _submit(args: argparse.Namespace, target: Target) -> int:
    request = read_request(args.request)
    metadata = _json_object(args.metadata, "--metadata", "'{\"user\": \"u1\"}'") if args.metadata else None
    async with FanoutClient(target.url, api_key=target.api_key) as client:
        try:
            sub = await client.submit(provider=args.provider, model=args.model, request=request,
                                      stream_id=args.stream_id, metadata=metadata, endpoint=args.endpoint)
        except StreamUnavailableError as exc:
            raise refusal(exc, target, "api key" if target.api_key else "none", None) from exc
    text = args.follow and chosen_format(args.format, tty=sys.stdout.isatty()) == "text"
    sys.stdout.write(f"{RULE} submitted {sub.stream_id}\n" if text else msgspec.json.encode(sub).decode() + "\n")
    sys.stdout.flush()
    if not args.follow:
        return EXIT_OK
    return await _tail(target, sub.stream_id, sub.token, None, result_only=False, fmt=args.format)


async def _tail(target: Target, stream_id: str, token: str | None, last: str | None, *, result_only: bool,
                fmt: OutputFormat = "auto") -> int:
    credential: Credential = "token" if token else "api key" if target.api_key else "none"
    assembler = Assembler(stream_id)
    snapshot = result_only and last is None  # only the state is printed: read a snapshot, not the history
    view = TextView() if chosen_format(fmt, tty=sys.stdout.isatty()) == "text" else None
    async with FanoutClient(target.url, api_key=target.api_key) as client:
        try:
            async for event in client.events(stream_id, token=token, last_event_id=last, snapshot=snapshot):
                if isinstance(event, StreamSnapshot):
                    assembler = assembler_from(event)
                    continue
                assembler.apply(event)
                if not result_only:
                    sys.stdout.write(view.render(event) if view else encode_event(event).decode() + "\n")
                    sys.stdout.flush()
            result = result_to_builtins(assembler.result())
            if last is not None:  # the events seen are not the whole stream: ask for its result
                result = await _whole_result(client, target.command, stream_id, token)
        except StreamUnavailableError as exc:
            raise refusal(exc, target, credential, stream_id) from exc
    if result_only:
        out = msgspec.json.encode(result)
        sys.stdout.write(msgspec.json.format(out, indent=2).decode() + "\n")
    return _exit_status(target.command, stream_id, result)


async def _whole_result(client: FanoutClient, command: str, stream_id: str, token: str | None) -> dict[str, Any]:
    """Return the result of every stored event, from ``GET /v1/streams/{id}`` (not only those printed)."""
    status = await client.status(stream_id, token)
    result = status.get("result")
    if not isinstance(result, dict):
        raise CommandError(f"stream {stream_id} has expired: its events are gone, so there is no result "
                           f"(it ended {status.get('status')})", exit_status=EXIT_REFUSED)
    if not status.get("history_complete", True):
        sys.stderr.write(f"fanout {command}: stream {stream_id}'s stored history is not whole (trimmed, "
                         "lost or expired events): the result lacks some of its blocks\n")
    return result


def _exit_status(command: str, stream_id: str, result: dict[str, Any]) -> int:
    if result.get("status") not in ERROR_STATUSES:
        return EXIT_OK
    error = result.get("error") or {}
    sys.stderr.write(f"fanout {command}: stream {stream_id} ended {result['status']} ({error.get('category')}): "
                     f"{error.get('message')}\n")
    return EXIT_STREAM_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """``fanout-client submit|tail|status|cancel|token``: the same commands without the server installed.

    Returns:
        The exit status of :func:`run`; a :class:`CommandError` is printed as one line.
    """
    parser = argparse.ArgumentParser(prog="fanout-client", description="submit jobs to a fanout publisher and "
                                     "follow their streams with automatic resume")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (("submit", "submit a job over HTTP and optionally follow its stream"),
                            ("tail", "follow a stream over SSE with automatic resume")):
        add_arguments(sub.add_parser(name, help=help_text, description=help_text), name)
    for name, help_text in cli_manage.COMMANDS.items():
        cli_manage.add_arguments(sub.add_parser(name, help=help_text, description=help_text), name)
    args = parser.parse_args(argv)
    try:
        code = cli_manage.run(args) if args.command in cli_manage.COMMANDS else run(args)
        sys.stdout.flush()  # a closed pipe shows here, not as "Exception ignored" at exit
    except CommandError as exc:
        sys.stderr.write(f"fanout-client {args.command}: {exc.message}\n")
        return exc.exit_status
    except KeyboardInterrupt:
        sys.stderr.write(f"fanout-client {args.command}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader left (| head): stop quietly
        return quiet_broken_pipe()
    return code


def quiet_broken_pipe() -> int:
    """Point standard output at ``/dev/null`` after its reader left; return ``EXIT_BROKEN_PIPE``.

    Without it the interpreter's final flush of ``sys.stdout`` raises ``BrokenPipeError``
    again and prints "Exception ignored".
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE
