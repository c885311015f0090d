"""RFC 9457 problem details: the one error shape of every publisher route.

Each problem has a stable ``type`` URI (:data:`PROBLEM_BASE` + slug, listed in
:data:`PROBLEM_TYPES` and in ``openapi.json``), a ``title`` that never varies for a
type, the HTTP ``status``, a ``detail`` for this occurrence and, for invalid input, an
``errors`` list naming each bad field. Bodies are ``application/problem+json``.

Follows RFC 9457, "Problem Details for HTTP APIs".
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from aiohttp import web

from schema.errors import ClientError

PROBLEM_BASE: Final = "https://fanout.dev/problems/"
"""Prefix of every problem ``type`` URI."""
PROBLEM_CONTENT_TYPE: Final = "application/problem+json"

PROBLEM_TYPES: Final[dict[str, tuple[int, str]]] = {
    "invalid-body": (400, "Request body is not a JSON object"),
    "invalid-field": (400, "Invalid field"),
    "invalid-position": (400, "Invalid stream position"),
    "unauthorized": (401, "Missing or unknown credentials"),
    "invalid-token": (401, "Invalid read token"),
    "token-expired": (401, "Read token expired"),
    "forbidden": (403, "Credentials do not cover this stream"),
    "cross-origin": (403, "Request from another origin"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "stream-id-conflict": (409, "Stream id already used with another body"),
    "already-terminal": (409, "Stream already ended"),
    "history-expired": (410, "Stream history expired"),
    "history-trimmed": (410, "Stream history no longer covers the position"),
    "position-ahead": (410, "Position is ahead of the stored stream"),
    "history-reset": (410, "Stream was written again as another generation"),
    "body-too-large": (413, "Request body too large"),
    "too-many-requests": (429, "Too many requests for one credential"),
    "internal": (500, "Internal error"),
    "too-many-connections": (503, "Too many open event streams"),
    "redis-unavailable": (503, "Storage unavailable"),
    "shutting-down": (503, "Publisher shutting down"),
}
"""Slug → (HTTP status, fixed title) of every problem type the publisher sends."""

NO_ROUTE: Final = ("no such route: the API's routes are /v1/streams... under the publisher's root URL "
                   "(the description: GET /openapi.json)")
"""``detail`` of the ``404`` for a path no route matches (often a base URL that already ends in ``/v1``)."""

_encoder: Final = msgspec.json.Encoder()


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    """One bad field of a request (an item of the problem's ``errors`` list)."""

    field: str
    """Name of the field (``request``, ``stream_id``, ...)."""
    detail: str
    """What is wrong with it."""


class ProblemError(ClientError):
    """An error answered as a problem document; raise it from any handler.

    Args:
        slug: Key of :data:`PROBLEM_TYPES`; decides ``type``, ``title`` and ``status``.
        detail: Human-readable explanation of this occurrence; never holds secrets.
        errors: The bad fields, for ``invalid-field``.
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
        extensions: Extra members of the problem object (``first_seq``, ...).
    """

    def __init__(
        self,
        slug: str,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.slug = slug
        self.status = PROBLEM_TYPES[slug][0]
        self.detail = detail
        self.errors = errors or []
        self.headers = headers or {}
        self.extensions = extensions or {}

    def body(self) -> dict[str, Any]:
        """Return the problem object (``type``, ``title``, ``status``, ``detail``, ...)."""
        out: dict[str, Any] = dict(self.extensions)  # never overrides the members below
        out.update(type=PROBLEM_BASE + self.slug, title=PROBLEM_TYPES[self.slug][1], status=self.status,
                   detail=self.detail)
        if self.errors:
            out["errors"] = msgspec.to_builtins(self.errors)
        return out

    def response(self) -> web.Response:
        """Return the ``application/problem+json`` response for this problem."""
        return problem_response(self.body(), self.status, self.headers)


def problem_response(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> web.Response:
    """Return a problem document response.

    Args:
        body: The problem object; must hold at least ``type``, ``title`` and ``status``.
        status: HTTP status code, equal to ``body["status"]``.
        headers: Extra response headers.
    """
    return web.Response(
        body=_encoder.encode(body),
        status=status,
        headers={"Content-Type": PROBLEM_CONTENT_TYPE, **(headers or {})},
    )


def from_http_exception(exc: web.HTTPException) -> web.Response:
    """Turn one of aiohttp's own HTTP errors (no route, wrong method) into a problem.

    Statuses without a slug of their own use ``about:blank`` with the reason phrase as
    title, as RFC 9457 section 4.2.1 allows.
    """
    slugs = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}
    slug = slugs.get(exc.status)
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    if slug == "not-found":
        return ProblemError(slug, NO_ROUTE, headers=headers).response()
    if slug is not None:
        return ProblemError(slug, exc.reason or PROBLEM_TYPES[slug][1], headers=headers).response()
    body = {"type": "about:blank", "title": exc.reason, "status": exc.status, "detail": exc.reason}
    return problem_response(body, exc.status, headers)
