"""Where the client commands talk to, and how they word a refusal: what went wrong and what to fix.

:class:`Target` is where a command talks to and where each setting came from
(:func:`target_of`: the flags, then ``FANOUT_URL``/``FANOUT_API_KEY``, then :data:`DEFAULT_URL`);
:func:`refusal` turns what the client raised (:mod:`fanout_client.errors`) into one
:class:`~fanout_client.errors.CommandError` line that names the option or variable to
check (``--url``/``FANOUT_URL``, ``--api-key``/``FANOUT_API_KEY``, ``--token``/``FANOUT_TOKEN``,
``--last-event-id``) and the exit status (4 unreachable, 2 a bad position, else 1).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from fanout_client.answers import NOT_A_ROUTE, base_url_problem
from fanout_client.errors import (
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CommandError,
    HistoryResetError,
    PublisherUnreachableError,
    StreamUnavailableError,
)

Credential = Literal["api key", "token", "none"]
"""What a failing call sent: the API key, a read token, or nothing."""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """Where the command talks to, and where each setting came from (for messages)."""

    url: str
    """The publisher's root URL."""
    url_source: str
    """``--url``, ``FANOUT_URL`` or ``the default``."""
    api_key: str | None
    """The API key, if any."""
    command: str = "submit"
    """The subcommand, for messages."""


DEFAULT_URL: Final = "http://127.0.0.1:8080"
"""Publisher address when neither ``--url`` nor ``FANOUT_URL`` is given."""


def target_of(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Target:
    """Resolve the URL and API key from the flags, then the environment, then the default.

    Raises:
        CommandError: The URL is not an ``http(s)://`` URL (exit 2), naming where it came from.
    """
    env = os.environ if environ is None else environ
    url, source = (args.url, "--url") if args.url else (env.get("FANOUT_URL"), "FANOUT_URL")
    if not url:
        url, source = DEFAULT_URL, "the default URL (set FANOUT_URL or --url to change it)"
    problem = base_url_problem(url)
    if problem is not None:
        raise CommandError(f"{source}: {problem}")
    return Target(url=url, url_source=source, api_key=args.api_key or env.get("FANOUT_API_KEY") or None,
                  command=args.command)


def refusal(exc: StreamUnavailableError, target: Target, credential: Credential,
            stream_id: str | None) -> CommandError:
    """Word a refusal with what to do: which variable or option to check, how to get a token.

    Args:
        exc: What the client raised.
        target: Where the command talked to.
        credential: What the failing call sent: the API key, a read token, or nothing.
        stream_id: The stream of a read call (``None`` for submit).

    Returns:
        The error to raise: exit 4 when unreachable, else 1.
    """
    if isinstance(exc, PublisherUnreachableError):
        return CommandError(f"{exc.message}; is the publisher running? The URL comes from {target.url_source}",
                            exit_status=EXIT_UNREACHABLE)
    if NOT_A_ROUTE in exc.message:
        return CommandError(f"{exc.message}; the URL comes from {target.url_source}", exit_status=EXIT_REFUSED)
    if exc.status == 401:
        return CommandError(_unauthorized(exc, target, credential, stream_id), exit_status=EXIT_REFUSED)
    if isinstance(exc, HistoryResetError):
        return CommandError(f"{exc.message}; read the stream again without --last-event-id", exit_status=EXIT_REFUSED)
    if exc.status == 400 and "position" in str(exc.problem.get("type", "")):
        return CommandError(f"{exc.message} (check --last-event-id)", exit_status=EXIT_USAGE)
    if exc.status == 404 and stream_id is not None:
        return CommandError(f"{exc.message} (check the id: submit prints it as stream_id)", exit_status=EXIT_REFUSED)
    return CommandError(exc.message, exit_status=EXIT_REFUSED)


def _unauthorized(exc: StreamUnavailableError, target: Target, credential: Credential, stream_id: str | None) -> str:
    if credential == "none":
        read = " (tail also takes the stream's read token: --token or FANOUT_TOKEN)" if stream_id else ""
        return f"no credential was sent: set FANOUT_API_KEY or --api-key{read}"
    if credential == "token":
        what = "expired" if str(exc.problem.get("type", "")).endswith("token-expired") else "is invalid"
        return (f"the read token {what}: mint a new one with POST /v1/streams/{stream_id}/tokens and an API key, "
                "or leave out --token and FANOUT_TOKEN to read with FANOUT_API_KEY")
    if target.api_key and target.api_key.startswith("v1."):
        return "FANOUT_API_KEY (or --api-key) holds a read token; pass read tokens with --token, API keys here"
    return "the publisher refused the API key: check FANOUT_API_KEY or --api-key; it must be one of the " \
           "publisher's FANOUT_API_KEYS"
