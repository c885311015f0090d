"""``fanout submit`` and ``fanout tail``: the consumer client on the command line.

``submit`` posts a job and prints the publisher's answer (or, with ``--follow``, the
events as they arrive); ``tail`` follows a stream with automatic resume and prints
its events as JSON lines, or the assembled result with ``--result``. The publisher's
address comes from ``--url`` or ``FANOUT_URL``; the API key from ``--api-key`` or
``FANOUT_API_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from publisher.client import FanoutClient, StreamUnavailableError
from schema.contract import encode_event
from schema.job import PROVIDERS
from schema.reducer import Assembler, result_to_builtins

DEFAULT_URL = "http://127.0.0.1:8080"
"""Publisher address when neither ``--url`` nor ``FANOUT_URL`` is given."""


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the options of ``submit`` or ``tail``."""
    parser.add_argument("--url", default=os.environ.get("FANOUT_URL", DEFAULT_URL), help="publisher root URL")
    parser.add_argument("--api-key", default=os.environ.get("FANOUT_API_KEY"), help="bearer API key")
    if command == "submit":
        parser.add_argument("--provider", required=True, choices=PROVIDERS)
        parser.add_argument("--model", required=True)
        parser.add_argument("--request", required=True, help="provider-native request body: JSON file, or - for stdin")
        parser.add_argument("--stream-id", help="choose the stream id (makes the call idempotent)")
        parser.add_argument("--metadata", help="JSON object copied onto stream.start")
        parser.add_argument("--follow", action="store_true", help="print the events until the stream ends")
    else:
        parser.add_argument("stream_id")
        parser.add_argument("--token", default=os.environ.get("FANOUT_TOKEN"), help="read token (else the API key)")
        parser.add_argument("--last-event-id", type=int, default=None, help="the last seq already held")
        parser.add_argument("--result", action="store_true", help="print only the assembled result at the end")


def run(args: argparse.Namespace) -> int:
    """Run ``submit`` or ``tail``.

    Exit status: 0 when the call succeeded (and a followed stream ended ``completed`` or
    ``incomplete``), 1 when the publisher refused the call, 2 on bad input, 3 when a
    followed stream ended in ``stream.error`` (failed, interrupted or cancelled).
    """
    try:
        if args.command == "submit":
            return asyncio.run(_submit(args))
        return asyncio.run(_tail(args, args.stream_id, args.token, args.last_event_id, args.result))
    except StreamUnavailableError as exc:
        sys.stderr.write(f"fanout {args.command}: {exc.message}\n")
        return 1
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"fanout {args.command}: {exc}\n")
        return 2


def _read_json(source: str) -> dict[str, Any]:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("the request must be a JSON object")
    return value


async def _submit(args: argparse.Namespace) -> int:
    request = _read_json(args.request)
    metadata = json.loads(args.metadata) if args.metadata else None
    async with FanoutClient(args.url, api_key=args.api_key) as client:
        sub = await client.submit(provider=args.provider, model=args.model, request=request,
                                  stream_id=args.stream_id, metadata=metadata)
    sys.stdout.write(msgspec.json.encode(sub).decode() + "\n")
    if not args.follow:
        return 0
    return await _tail(args, sub.stream_id, sub.token, None, False)


async def _tail(args: argparse.Namespace, stream_id: str, token: str | None, last: int | None, result: bool) -> int:
    assembler = Assembler(stream_id)
    async with FanoutClient(args.url, api_key=args.api_key) as client:
        async for event in client.events(stream_id, token=token, last_event_id=last):
            assembler.apply(event)
            if not result:
                sys.stdout.write(encode_event(event).decode() + "\n")
                sys.stdout.flush()
    final = assembler.result()
    if result:
        out = msgspec.json.encode(result_to_builtins(final))
        sys.stdout.write(msgspec.json.format(out, indent=2).decode() + "\n")
    return 3 if final.status in ("failed", "interrupted", "cancelled") else 0
