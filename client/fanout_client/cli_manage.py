"""``fanout status``, ``fanout cancel`` and ``fanout token``: one stream, one call each.

``status`` prints ``GET /v1/streams/{id}`` (the stream's state and its assembled result
so far) as indented JSON; it reads with the stream's token (``--token``,
``FANOUT_TOKEN``) or the API key. ``cancel`` asks the worker to stop the stream (API
key); a stream that already ended is said so (exit 1). ``token`` mints a fresh read
token (API key; ``--scope internal`` for a reader of internal reasoning) and prints the
answer, or only the token with ``--bare`` (``export FANOUT_TOKEN=$(fanout token ID --bare)``).
The publisher's address and the API key come from the same flags and variables as
``submit`` and ``tail`` (:func:`fanout_client.refusals.target_of`); refusals are one line saying what to do
(:mod:`fanout_client.refusals`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, Final

import msgspec

from fanout_client.admin import cancel_stream, mint_token
from fanout_client.client import FanoutClient
from fanout_client.errors import EXIT_OK, EXIT_REFUSED, CommandError, StreamUnavailableError
from fanout_client.refusals import Credential, Target, refusal, target_of

COMMANDS: Final = {
    "status": "print a stream's state and its assembled result so far (GET /v1/streams/{id})",
    "cancel": "cancel a running stream (POST /v1/streams/{id}/cancel, API key)",
    "token": "mint a fresh read token for a stream (POST /v1/streams/{id}/tokens, API key)",
}
"""Command → help text."""
SCOPES: Final = ("public", "internal")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the options of ``status``, ``cancel`` or ``token``."""
    parser.add_argument("stream_id", help="the stream's id (submit prints it)")
    parser.add_argument("--url", help="the publisher's root URL, without /v1 (env FANOUT_URL; default "
                                      "http://127.0.0.1:8080)")
    parser.add_argument("--api-key", help="bearer API key, one of the publisher's FANOUT_API_KEYS "
                                          "(env FANOUT_API_KEY; default: none)")
    if command == "status":
        parser.add_argument("--token", help="the stream's read token (env FANOUT_TOKEN; default: read with the "
                                            "API key)")
    if command == "token":
        parser.add_argument("--scope", choices=SCOPES, default="public",
                            help="public, or internal for a reader allowed internal reasoning")
        parser.add_argument("--bare", action="store_true", help="print only the token (for export FANOUT_TOKEN=...)")


def run(args: argparse.Namespace) -> int:
    """Run ``status``, ``cancel`` or ``token``; exit 0, 1 (refused), 2 (bad input) or 4 (unreachable).

    Raises:
        CommandError: Each refusal, worded with what to do (:func:`fanout_client.cli.refusal`).
    """
    target = target_of(args)
    return asyncio.run(_run(args, target))


async def _run(args: argparse.Namespace, target: Target) -> int:
    token = (getattr(args, "token", None) or os.environ.get("FANOUT_TOKEN") or None) if args.command == "status" \
        else None
    credential: Credential = "token" if token else "api key" if target.api_key else "none"
    async with FanoutClient(target.url, api_key=target.api_key) as client:
        try:
            answer = await _call(client, args, token)
        except StreamUnavailableError as exc:
            ended = exc.problem.get("stream_status") if exc.status == 409 else None
            if ended:
                raise CommandError(f"stream {args.stream_id} already ended ({ended}): nothing to cancel",
                                   exit_status=EXIT_REFUSED) from exc
            raise refusal(exc, target, credential, args.stream_id) from exc
    if args.command == "token" and args.bare:
        sys.stdout.write(f"{answer['token']}\n")
    else:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(answer), indent=2).decode() + "\n")
    return EXIT_OK


async def _call(client: FanoutClient, args: argparse.Namespace, token: str | None) -> dict[str, Any]:
    if args.command == "status":
        return await client.status(args.stream_id, token)
    if args.command == "cancel":
        return await cancel_stream(client, args.stream_id)
    return await mint_token(client, args.stream_id, args.scope)
