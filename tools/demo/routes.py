"""The demo page's routes, registered only when ``FANOUT_DEMO_PAGE=1`` (off by default).

=====================  ==================================================================
route                  answer
=====================  ==================================================================
``GET /demo``          the page (``static/demo.html``), under a strict Content-Security-Policy
``GET /demo/assets/*`` its script, style sheet and vendored libraries (a fixed list)
``GET /demo/cases``    the recorded cases the demo stack's fake upstream replays, per provider
``POST /demo/streams`` submits a job for one of those cases on the page's behalf
=====================  ==================================================================

``POST /demo/streams`` is how the page starts a stream without holding an API key: it
takes ``{"provider", "case", "slow"}``, accepts only a listed case (the job's model is the
case name, ``slow-<case>`` when ``slow``) and answers like ``POST /v1/streams``: 201 with
``stream_id`` and a public read ``token``. It refuses requests whose ``Origin`` is not the
publisher's own (403), so other sites cannot submit through a visitor's browser. Demo mode
lets anyone who reaches the publisher submit these jobs: enable it only for the local demo
stack (``fanout demo`` does), never beside real provider credentials.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Final

import msgspec
from aiohttp import web

from publisher.api.limits import read_body
from publisher.api.problems import FieldError, ProblemError
from publisher.api.submit import accept_submission
from publisher.api.validation import Submission, decode_body
from publisher.state import SETTINGS
from schema.job import PROVIDERS, Provider
from tools.demo.cases import SLOW_PREFIX, catalogue, demo_request, provider_dirs, transcript_roots

STATIC: Final = Path(__file__).with_name("static")
DEMO_PAGE: Final = STATIC / "demo.html"
"""The page: a form that starts a stream, native EventSource, blocks by index, Drop and resume."""
ASSETS: Final[dict[str, Path]] = {
    "demo.js": STATIC / "demo.js",
    "compare.js": STATIC / "compare.js",
    "demo.css": STATIC / "demo.css",
    "marked.umd.js": STATIC / "vendor" / "marked.umd.js",
    "purify.min.js": STATIC / "vendor" / "purify.min.js",
}
"""Files served under ``/demo/assets/``; any other name is a 404."""
PAGE_CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                   "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""No inline script or style, nothing from another origin: a second guard behind the sanitizer."""
_FIELD: Final = re.compile(r"\$\.(\w+)|field `(\w+)`")
_NO_CACHE: Final = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


class DemoStart(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /demo/streams``."""

    provider: Provider
    """The job's provider API."""
    case: str
    """A case listed by ``GET /demo/cases`` for that provider."""
    slow: bool = False
    """Pace the upstream (``slow-<case>``), time enough to drop and resume by hand."""


async def demo_page(request: web.Request) -> web.StreamResponse:
    """Serve the page (``GET /demo``, optionally ``?stream_id=...&token=...`` to follow one stream)."""
    headers = {**_NO_CACHE, "Content-Type": "text/html; charset=utf-8", "Content-Security-Policy": PAGE_CSP}
    return web.FileResponse(DEMO_PAGE, headers=headers)


async def demo_asset(request: web.Request) -> web.StreamResponse:
    """Serve one file of :data:`ASSETS`.

    Raises:
        ProblemError: 404 for any other name.
    """
    path = ASSETS.get(request.match_info["name"])
    if path is None:
        raise ProblemError("not-found", f"no demo asset {request.match_info['name']!r}")
    return web.FileResponse(path, headers=_NO_CACHE)


async def demo_cases(request: web.Request) -> web.Response:
    """List the cases per provider: ``{"providers": [{provider, directory, cases: [{case, about, terminal}]}]}``."""
    body = {"providers": catalogue(os.environ), "slow_prefix": SLOW_PREFIX,
            "roots": [str(root) for root in transcript_roots(os.environ)]}
    return web.json_response(body, dumps=lambda obj: msgspec.json.encode(obj).decode(), headers=_NO_CACHE)


async def demo_start(request: web.Request) -> web.Response:
    """Submit a job for a listed case on the page's behalf; answer like ``POST /v1/streams`` (201).

    Raises:
        ProblemError: 403 (another ``Origin``), 413 (body size), 400 (``invalid-body``;
            ``invalid-field`` naming ``provider``, ``case`` or ``slow``).
    """
    _same_origin(request)
    start = _parse_start(await read_body(request, request.app[SETTINGS].max_body_bytes))
    model = SLOW_PREFIX + start.case if start.slow else start.case
    directory = provider_dirs(os.environ)[start.provider]
    sub = Submission(provider=start.provider, model=model, request=demo_request(start.provider),
                     metadata={"demo_case": f"{directory}/{start.case}", "demo_slow": start.slow})
    body = await accept_submission(request, sub)
    return web.json_response({**body, "model": model}, status=201, headers={"Location": body["status_url"]})


def _same_origin(request: web.Request) -> None:
    """Accept only the demo page's own ``fetch``: an ``Origin`` equal to this server, named by an address.

    A browser always sends ``Origin`` on a cross-site or same-site ``POST``; a host *name*
    other than ``localhost`` is refused too, so a DNS-rebinding page (its own name resolving
    to this server) cannot pass the check with a matching ``Host``.
    """
    origin = request.headers.get("Origin")
    own = f"{request.scheme}://{request.host}"
    if origin != own or not _address_host(request.url.host or ""):
        sent = f"this request sent Origin {origin!r}" if origin is not None else "this request sent no Origin header"
        raise ProblemError("cross-origin", f"POST /demo/streams only accepts the demo page's own requests ({sent}): "
                                        "open it at http://127.0.0.1:<port>/demo or http://localhost:<port>/demo; "
                                        "submit other jobs with POST /v1/streams and an API key")


def _address_host(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or an IP address literal (not a DNS name)."""
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _parse_start(raw: bytes) -> DemoStart:
    body = decode_body(raw)
    if not isinstance(body, dict):
        raise ProblemError("invalid-body", "the body must be a JSON object: {\"provider\", \"case\", \"slow\"}")
    try:
        start = msgspec.convert(body, DemoStart)
    except msgspec.ValidationError as exc:
        found = _FIELD.search(str(exc))
        field = (found[1] or found[2]) if found else "body"
        detail = str(exc)
        if field == "provider":
            detail = (f"provider {body.get('provider')!r} must be one of {', '.join(PROVIDERS)} "
                      "(the provider API; GET /demo/cases names each one's transcript directory)")
        error = FieldError(field=field, detail=detail)
        raise ProblemError("invalid-field", f"{detail}; expected {{provider, case, slow}}", errors=[error]) from exc
    cases = next(p.cases for p in catalogue(os.environ) if p.provider == start.provider)
    if start.case not in {c.case for c in cases}:
        detail = f"no recorded case {start.case!r} for {start.provider}; GET /demo/cases lists them"
        raise ProblemError("invalid-field", detail, errors=[FieldError(field="case", detail=detail)])
    return start


def install(app: web.Application) -> None:
    """Register the demo routes: the publisher's ``demo`` plug-in (:data:`publisher.api.routes.Plugins`).

    The publisher installs it only with ``FANOUT_DEMO_PAGE=1``.
    """
    app.router.add_route("GET", "/demo", demo_page)
    app.router.add_route("GET", "/demo/assets/{name}", demo_asset)
    app.router.add_route("GET", "/demo/cases", demo_cases)
    app.router.add_route("POST", "/demo/streams", demo_start)
