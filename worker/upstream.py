"""The upstream HTTP client: one streaming POST per attempt to the job's endpoint.

A job goes to a target of the upstreams (:func:`schema.upstreams.targets`: the endpoint it
names, its model's route, or, without an upstreams file, the provider's default endpoint
built from ``FANOUT_*_BASE_URL``). :func:`request_for` builds the request for one target:
URL, body and framing by the endpoint's platform (:mod:`worker.platforms`), the key of a
key auth in the headers, and for ``google``/``aws`` endpoints a hook that adds the access
token or the SigV4 signature when the request is sent (:mod:`worker.auth`), so each
attempt is authorized afresh. Without an upstreams file the requests are today's:

* ``openai_chat``: ``POST {openai}/chat/completions``, ``Authorization: Bearer <key>``;
* ``openai_responses``: ``POST {openai}/responses``, ``Authorization: Bearer <key>``;
* ``anthropic``: ``POST {anthropic}/v1/messages``, ``x-api-key`` and ``anthropic-version: 2023-06-01``;
* ``gemini``: ``POST {gemini}/v1beta/models/{model}:streamGenerateContent?alt=sse`` (no ``alt`` for the
  JSON-array framing), ``x-goog-api-key``.

Keys come from the variables the endpoints name (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
``GEMINI_API_KEY`` without a file); they live only in request headers, never in a log
line, an error message or a ``repr``.

Errors raised here are :class:`~schema.errors.UpstreamTransportError` and
:class:`~schema.errors.UpstreamTimeoutError` (both under ``UpstreamError`` in the tree of
:mod:`schema.errors`, re-exported from this module),
:class:`~schema.errors.UpstreamHTTPError`, :class:`~schema.errors.UpstreamProtocolError`
and :class:`worker.auth.CredentialError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Final

import aiohttp
import msgspec
from yarl import URL

from schema.errors import FanoutError, UpstreamProtocolError, UpstreamTimeoutError, UpstreamTransportError
from schema.job import Job
from schema.upstreams import Target, Upstreams, default_upstreams, targets
from worker.adapters.base import Framing
from worker.auth import KEY_HEADERS, Authorizer
from worker.platforms import ANTHROPIC_VERSION, plan_request
from worker.secrets import Secrets
from worker.settings import WorkerSettings
from worker.upstream_errors import MAX_ERROR_BODY_BYTES, http_error

__all__ = [
    "ANTHROPIC_VERSION",
    "Credentials",
    "UpstreamRequest",
    "UpstreamTimeoutError",
    "UpstreamTransportError",
    "build_request",
    "credentials_from_env",
    "new_session",
    "open_stream",
    "read_chunk",
    "request_for",
    "upstreams_of",
]

HTML_TYPES: Final = frozenset({"text/html", "application/xhtml+xml"})
"""Content types of a 2xx answer that is a web page (a portal, a proxy's page), never a stream."""
VENDOR_VARIABLES: Final = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
"""The key variable of each default endpoint (no upstreams file)."""


class Credentials(Secrets):
    """The secrets of the worker's endpoints; ``repr`` shows only which default keys are set.

    Args:
        openai: ``OPENAI_API_KEY`` (both OpenAI APIs), or empty.
        anthropic: ``ANTHROPIC_API_KEY``, or empty.
        gemini: ``GEMINI_API_KEY``, or empty.
        environ: Every other variable an endpoint may name (``os.environ``).
    """

    __slots__ = ()

    def __init__(self, *, openai: str = "", anthropic: str = "", gemini: str = "",
                 environ: Mapping[str, str] | None = None) -> None:
        given = {VENDOR_VARIABLES[k]: v for k, v in (("openai", openai), ("anthropic", anthropic), ("gemini", gemini))
                 if v}
        super().__init__({**(environ or {}), **given})

    def key(self, vendor: str) -> str:
        """Return the key for ``openai``, ``anthropic`` or ``gemini`` (empty when unset)."""
        return self.variable(VENDOR_VARIABLES[vendor]) if vendor in VENDOR_VARIABLES else ""

    def __repr__(self) -> str:
        present = ", ".join(f"{k}={'set' if self.key(k) else 'unset'}" for k in VENDOR_VARIABLES)
        return f"Credentials({present})"


def credentials_from_env(environ: Mapping[str, str]) -> Credentials:
    """Read the endpoints' secrets from ``environ`` (``os.environ``)."""
    return Credentials(environ=environ)


AuthHook = Callable[[], Awaitable[dict[str, str]]]
"""Returns the headers that authenticate one attempt (an access token, a SigV4 signature)."""


class UpstreamRequest(msgspec.Struct, frozen=True, kw_only=True, repr_omit_defaults=True):
    """One provider request, ready to send; ``repr`` never shows the headers."""

    provider: str
    """Provider API of the job."""
    url: str
    """Absolute URL, query included; never holds a credential."""
    body: bytes
    """JSON body."""
    framing: Framing
    """How the answer's body is framed (``sse``, Gemini's ``json_array``, Bedrock's ``eventstream``)."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Request headers, a key included."""
    endpoint: str = ""
    """The endpoint's name (``openai``, ``anthropic``, ``gemini`` without an upstreams file)."""
    model: str = ""
    """The model (or deployment) name sent to the endpoint."""
    auth: AuthHook | None = None
    """Called when the request is sent: the headers of a ``google`` or ``aws`` endpoint."""

    def __repr__(self) -> str:
        return (f"UpstreamRequest(provider={self.provider!r}, endpoint={self.endpoint!r}, url={self.url!r}, "
                f"framing={self.framing!r})")


def upstreams_of(settings: WorkerSettings) -> Upstreams:
    """Return the default endpoints of ``settings`` (``FANOUT_*_BASE_URL``, no upstreams file)."""
    return default_upstreams({"FANOUT_OPENAI_BASE_URL": settings.openai_base_url,
                              "FANOUT_ANTHROPIC_BASE_URL": settings.anthropic_base_url,
                              "FANOUT_GEMINI_BASE_URL": settings.gemini_base_url,
                              "FANOUT_GEMINI_FRAMING": settings.gemini_framing})


def request_for(job: Job, target: Target, credentials: Secrets,
                authorizer: Authorizer | None = None) -> UpstreamRequest:
    """Return the streaming request of ``job`` for one target (:mod:`worker.platforms`, :mod:`worker.auth`).

    ``authorizer``: the process's (its Google token and AWS signers are shared); else one over
    ``credentials``. A route's fallback calls this once per endpoint it tries.

    A key auth's header is set here (omitted while the key is empty, as with no key today);
    ``google`` and ``aws`` endpoints get :attr:`UpstreamRequest.auth`, run per attempt.

    Raises:
        FanoutError: ``invalid_request``, not retryable (:func:`worker.platforms.plan_request`).
        worker.auth.CredentialError: A key auth's ``secret_file`` cannot be read.
    """
    endpoint = target.endpoint
    plan = plan_request(endpoint, job.provider, target.model, job.request)
    headers = dict(plan.headers)
    hook: AuthHook | None = None
    authorizer = authorizer or Authorizer(credentials)
    if endpoint.auth in KEY_HEADERS:
        key = authorizer.key(endpoint, required=False)
        if key:
            header, prefix = KEY_HEADERS[endpoint.auth]
            headers[header] = prefix + key
    elif endpoint.auth in ("google", "aws"):
        hook = partial(authorizer.headers, endpoint, plan)
    return UpstreamRequest(provider=job.provider, url=plan.url, body=plan.body, framing=plan.framing,
                           headers=headers, endpoint=endpoint.name, model=target.model, auth=hook)


def build_request(job: Job, settings: WorkerSettings, credentials: Secrets, *, upstreams: Upstreams | None = None,
                  authorizer: Authorizer | None = None) -> UpstreamRequest:
    """Return the request for the job's first target (:func:`request_for`).

    Args:
        job: The job.
        settings: Its default endpoints when ``upstreams`` is ``None``.
        credentials: Where keys are read.
        upstreams: The worker's upstreams (the file's, or :func:`upstreams_of` ``settings``).
        authorizer: The process's token and signer cache (one per call otherwise).

    Raises:
        FanoutError: ``invalid_request``, not retryable: no endpoint serves the job (an
            unknown endpoint, one that does not speak its provider, a model that is no
            route with no default, e.g. ``bedrock_converse`` without an upstreams file),
            or its body cannot be sent as is. The caller stores it as the stream's error.
    """
    try:
        first = targets(upstreams or upstreams_of(settings), job.provider, job.model, job.endpoint)[0]
    except LookupError as exc:
        raise FanoutError(f"no endpoint serves this job: {exc.args[0]}", category="invalid_request",
                          retryable=False) from exc
    return request_for(job, first, credentials, authorizer)


def new_session(settings: WorkerSettings, *, limit: int = 0) -> aiohttp.ClientSession:
    """Return the process's client session: connect timeout only (other deadlines are the caller's).

    Bodies are never decompressed (``auto_decompress=False``): the worker asks for
    ``identity`` and :func:`open_stream` refuses any other ``Content-Encoding``, so a
    compressed bomb costs nothing; an error body that arrives compressed is classified
    by its status alone.

    Args:
        settings: Gives ``connect_timeout_s``.
        limit: Simultaneous connections (0 = unlimited; the worker's concurrency bounds them).
    """
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=settings.connect_timeout_s, sock_read=None)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=limit),
                                 auto_decompress=False)


async def open_stream(session: aiohttp.ClientSession, request: UpstreamRequest, *,
                      connect_timeout_s: float | None = None) -> aiohttp.ClientResponse:
    """Send ``request`` and return the 2xx response whose body is still unread.

    ``connect_timeout_s`` replaces the session's connect timeout for this request (an
    endpoint's own, from the upstreams file).

    The caller bounds the wait for the response headers (idle and total deadlines) and
    must release the response (``async with`` or ``release()``).

    Redirects are not followed: a redirect would carry the provider key (``x-api-key``,
    ``x-goog-api-key``) to another host, so a 3xx is answered like any other non-2xx.

    Raises:
        UpstreamHTTPError: A non-2xx answer; category and ``retryable`` by
            :func:`worker.upstream_errors.http_error`, ``Retry-After`` kept.
        UpstreamProtocolError: A 2xx web page (``text/html``) instead of a stream, or a 2xx
            body with a ``Content-Encoding`` other than ``identity`` (never decompressed).
        UpstreamTimeoutError: The TCP connect took longer than ``connect_timeout_s``.
        UpstreamTransportError: Connection refused, reset or closed before the headers.
        worker.auth.CredentialError: The endpoint's token or signature could not be made.
    """
    headers = request.headers | (await request.auth() if request.auth is not None else {})
    try:
        timeout = session.timeout if connect_timeout_s is None else aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=None)
        # encoded: the URL is sent as built (a SigV4 signature covers its exact path)
        response = await session.post(URL(request.url, encoded=True), data=request.body, headers=headers,
                                      allow_redirects=False, timeout=timeout)
    except aiohttp.ConnectionTimeoutError as exc:
        raise UpstreamTimeoutError("could not connect to the provider in time (connect timeout)",
                                   kind="connect") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamTransportError(f"could not reach the provider ({type(exc).__name__})") from exc
    if 200 <= response.status < 300:
        _check_stream(response)
        return response
    try:
        body = await _read_error_body(response)
    finally:
        response.release()
    raise http_error(request.provider, response.status, dict(response.headers), body)


def _check_stream(response: aiohttp.ClientResponse) -> None:
    """Refuse a 2xx answer that is a web page or a compressed body (closing it first).

    Raises:
        UpstreamProtocolError: The content type is a web page, or ``Content-Encoding`` names
            anything but ``identity``.
    """
    encodings = [e.strip().lower() for e in response.headers.get("Content-Encoding", "").split(",")]
    refused = [e for e in encodings if e not in ("", "identity")]
    if refused:
        response.close()
        raise UpstreamProtocolError(
            f"provider answered with Content-Encoding: {', '.join(refused)}, but the worker asked for identity "
            "and never decompresses; configure the provider or the proxy in between not to compress the stream")
    if response.content_type in HTML_TYPES:
        response.close()
        raise UpstreamProtocolError(f"provider answered HTTP {response.status} with a web page "
                                    f"({response.content_type}), not a stream")


async def _read_error_body(response: aiohttp.ClientResponse) -> bytes:
    body = b""
    try:
        while len(body) < MAX_ERROR_BODY_BYTES:
            chunk = await response.content.read(MAX_ERROR_BODY_BYTES - len(body))
            if not chunk:
                break
            body += chunk
    except (aiohttp.ClientError, OSError):
        pass  # a broken error body still leaves the status to classify by
    return body


async def read_chunk(response: aiohttp.ClientResponse) -> bytes:
    """Return the next bytes of the body as they arrive; ``b""`` at its clean end.

    Raises:
        UpstreamTransportError: The connection broke mid-body (reset, truncated chunked
            encoding, closed by the peer).
    """
    try:
        return await response.content.readany()
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamTransportError(f"the provider connection broke mid-response ({type(exc).__name__})") from exc
