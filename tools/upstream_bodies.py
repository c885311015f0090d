"""What ``fanout upstream`` says and keeps: provider-shaped error bodies, transcript lookup, request records.

The fake provider (:mod:`tools.upstream`) answers with the shapes each provider documents:
OpenAI's, Anthropic's and Gemini's error bodies per status (:func:`error_body`), the
"prompt too long" messages (:data:`CONTEXT_MESSAGES`), the seeded ``garbage`` body, and
the content type of each framing. Cases are ``<root>/<provider dir>/<case>.sse``
(:func:`find_case`, :func:`case_names`). Each request is recorded with secret header and
query values masked (:func:`record`; :func:`fingerprint` tells credentials apart without
holding them).
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from pathlib import Path
from typing import Any, Final

import msgspec
from aiohttp import web

ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS: Final = (ROOT / "transcripts", ROOT / "tests" / "cases" / "transcripts")
"""Transcript roots searched after ``--transcripts``."""

SECRET_HEADERS: Final = re.compile(r"(?i)authorization|api-key|apikey|token|secret|cookie|^key$")
GEMINI_STATUS: Final = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                         404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
                         504: "DEADLINE_EXCEEDED"}
ANTHROPIC_TYPE: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error",
                          503: "overloaded_error"}
CONTEXT_MESSAGES: Final = {
    "openai": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
    "anthropic": "prompt is too long: 210000 tokens > 200000 maximum",
    "gemini": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
}


GARBAGE_BYTES: Final = 4096
"""Length of the ``garbage`` model's body."""
GARBAGE_SEED: Final = 20260
"""Seed of the ``garbage`` body; its first byte is neither SSE nor a JSON array start."""


def garbage_body() -> bytes:
    """Return the ``garbage`` model's body: :data:`GARBAGE_BYTES` seeded random bytes."""
    return random.Random(GARBAGE_SEED).randbytes(GARBAGE_BYTES)  # noqa: S311 - test data, not a secret


def vendor_of(provider_dir: str) -> str:
    """Return ``openai``, ``gemini`` or ``anthropic``: whose error shapes a transcript directory answers with."""
    for vendor in ("openai", "gemini"):
        if provider_dir.startswith(vendor):
            return vendor
    return provider_dir


def error_body(provider_dir: str, status: int, message: str, *, code: str | None = None) -> bytes:
    """Return the provider's error body shape for ``status`` (OpenAI, Anthropic or Gemini)."""
    vendor = vendor_of(provider_dir)
    if vendor == "anthropic":
        error: dict[str, Any] = {"type": "error", "error": {"type": ANTHROPIC_TYPE.get(status, "api_error"),
                                                           "message": message}}
    elif vendor == "gemini":
        error = {"error": {"code": status, "message": message, "status": GEMINI_STATUS.get(status, "UNKNOWN")}}
        if provider_dir == "gemini_json_array":
            return msgspec.json.encode([error])
    else:
        kind = "server_error" if status >= 500 else "requests" if status == 429 else "invalid_request_error"
        code = code or ("rate_limit_exceeded" if status == 429 else None)
        error = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return msgspec.json.encode(error)


def record(request: web.Request, raw: bytes) -> dict[str, Any]:
    """Return what ``GET /_requests`` lists of one request: secret header and query values shown as ``***``."""
    headers = {name: ("***" if SECRET_HEADERS.search(name) else value) for name, value in request.headers.items()}
    query = {name: ("***" if SECRET_HEADERS.search(name) else value) for name, value in request.query.items()}
    auth = any(n.lower() in ("authorization", "x-api-key", "x-goog-api-key") for n in request.headers) or "key" in query
    try:
        body: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        body = None
    fingerprints = {name.lower(): fingerprint(value) for name, value in request.headers.items()
                    if SECRET_HEADERS.search(name)}
    return {"method": request.method, "path": request.path, "query": query, "headers": headers,
            "auth_present": auth, "auth_fingerprints": fingerprints, "body": body, "received_s": time.monotonic()}


def fingerprint(secret: str) -> str:
    """Return the first 12 hex digits of SHA-256 of a header value.

    Lets tests check which credential was sent without the recording ever holding it.
    """
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


def find_case(roots: tuple[Path, ...], provider_dir: str, case: str) -> Path | None:
    """Return ``<root>/<provider_dir>/<case>.sse`` of the first root holding it; ``None`` for none or a bad name."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", case) or ".." in case:
        return None
    return next((root / provider_dir / f"{case}.sse" for root in roots
                 if (root / provider_dir / f"{case}.sse").is_file()), None)


def case_names(roots: tuple[Path, ...], provider_dir: str) -> list[str]:
    """Return the cases this server answers for ``provider_dir``, sorted; empty when none.

    A case is ``<root>/<provider_dir>/<case>.sse`` in any root, named as :func:`find_case` accepts
    (``slow-``/``fail<N>-`` forms of each are answered too, and are not listed).
    """
    stems = {path.stem for root in roots for path in (root / provider_dir).glob("*.sse")}
    return sorted(stem for stem in stems if find_case(roots, provider_dir, stem) is not None)


def not_found_message(provider_dir: str, model: str) -> str:
    """Return the ``404`` message for a model that names no case: where the case list is."""
    return (f"The model '{model}' does not exist in fanout upstream: here a model names a recorded case, "
            f"transcripts/{provider_dir}/<case>.sse (the list: transcripts/{provider_dir}/INDEX.md); "
            "slow-<case> streams it slowly")


def content_type(provider_dir: str) -> str:
    """Return the response content type of a transcript directory's framing."""
    return "application/json" if provider_dir == "gemini_json_array" else "text/event-stream"
