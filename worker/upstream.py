"""The upstream HTTP client: one streaming POST per attempt to the provider's real endpoint.

* ``openai_chat``: ``POST {openai}/chat/completions``, ``Authorization: Bearer <key>``;
* ``openai_responses``: ``POST {openai}/responses``, ``Authorization: Bearer <key>``;
* ``anthropic``: ``POST {anthropic}/v1/messages``, ``x-api-key`` and ``anthropic-version: 2023-06-01``;
* ``gemini``: ``POST {gemini}/v1beta/models/{model}:streamGenerateContent?alt=sse`` (no ``alt`` for the
  JSON-array framing), ``x-goog-api-key``.

The body is the job's provider-native ``request`` with ``model`` set (not for Gemini,
whose model is in the path) and streaming switched on (``stream: true``; Chat also
``stream_options.include_usage``). Sources: OpenAI API reference "Chat Completions" and
"Responses" (streaming), Anthropic "Messages" + "Streaming Messages" and "Versioning",
Gemini API "Generate content" (``streamGenerateContent``) and "API keys".

Keys come from ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``GEMINI_API_KEY``; they live only
in request headers, never in a log line, an error message or a ``repr``.

Errors raised here are :class:`~schema.errors.UpstreamTransportError` and
:class:`~schema.errors.UpstreamTimeoutError` (both under ``UpstreamError`` in the tree of
:mod:`schema.errors`, re-exported from this module),
:class:`~schema.errors.UpstreamHTTPError` and :class:`~schema.errors.UpstreamProtocolError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import msgspec

from schema.errors import FanoutError, UpstreamProtocolError, UpstreamTimeoutError, UpstreamTransportError
from schema.job import Job
from worker.adapters.base import Framing
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
]

ANTHROPIC_VERSION: Final = "2023-06-01"
"""``anthropic-version`` header sent with every Messages request."""

_encoder: Final = msgspec.json.Encoder()
HTML_TYPES: Final = frozenset({"text/html", "application/xhtml+xml"})
"""Content types of a 2xx answer that is a web page (a portal, a proxy's page), never a stream."""


class Credentials:
    """Provider API keys; ``repr`` shows only which ones are set.

    Args:
        openai: ``OPENAI_API_KEY`` (both OpenAI APIs), or empty.
        anthropic: ``ANTHROPIC_API_KEY``, or empty.
        gemini: ``GEMINI_API_KEY``, or empty.
    """

    __slots__ = ("_keys",)

    def __init__(self, *, openai: str = "", anthropic: str = "", gemini: str = "") -> None:
        self._keys = {"openai": openai, "anthropic": anthropic, "gemini": gemini}

    def key(self, vendor: str) -> str:
        """Return the key for ``openai``, ``anthropic`` or ``gemini`` (empty when unset)."""
        return self._keys.get(vendor, "")

    def __repr__(self) -> str:
        present = ", ".join(f"{k}={'set' if v else 'unset'}" for k, v in self._keys.items())
        return f"Credentials({present})"


def credentials_from_env(environ: Mapping[str, str]) -> Credentials:
    """Read the three provider keys from ``environ`` (``os.environ``)."""
    return Credentials(
        openai=environ.get("OPENAI_API_KEY", ""),
        anthropic=environ.get("ANTHROPIC_API_KEY", ""),
        gemini=environ.get("GEMINI_API_KEY", ""),
    )


class UpstreamRequest(msgspec.Struct, frozen=True, kw_only=True, repr_omit_defaults=True):
    """One provider request, ready to send; ``repr`` never shows the headers."""

    provider: str
    """Provider API of the job."""
    url: str
    """Absolute URL, query included; never holds a credential."""
    body: bytes
    """JSON body."""
    framing: Framing
    """How the answer's body is framed (``sse``, or Gemini's ``json_array``)."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Request headers, the credential included."""

    def __repr__(self) -> str:
        return f"UpstreamRequest(provider={self.provider!r}, url={self.url!r}, framing={self.framing!r})"


def _vendor(provider: str) -> str:
    return {"openai_chat": "openai", "openai_responses": "openai"}.get(provider, provider)


def _auth_headers(provider: str, key: str) -> dict[str, str]:
    if provider == "anthropic":
        return {"anthropic-version": ANTHROPIC_VERSION} | ({"x-api-key": key} if key else {})
    if not key:
        return {}
    return {"x-goog-api-key": key} if provider == "gemini" else {"Authorization": f"Bearer {key}"}


def _body(job: Job) -> dict[str, Any]:
    body = dict(job.request)
    if job.provider == "gemini":
        body.pop("model", None)
        body.pop("stream", None)
        return body
    body["model"], body["stream"] = job.model, True
    if job.provider == "openai_chat":
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise FanoutError("request.stream_options must be a JSON object (or absent), such as "
                              '{"include_usage": true}', category="invalid_request", retryable=False)
        body["stream_options"] = {**(options or {}), "include_usage": True}
    return body


def _url(job: Job, settings: WorkerSettings) -> str:
    if job.provider == "openai_chat":
        return settings.openai_base_url.rstrip("/") + "/chat/completions"
    if job.provider == "openai_responses":
        return settings.openai_base_url.rstrip("/") + "/responses"
    if job.provider == "anthropic":
        return settings.anthropic_base_url.rstrip("/") + "/v1/messages"
    url = f"{settings.gemini_base_url.rstrip('/')}/v1beta/models/{quote(job.model, safe='')}:streamGenerateContent"
    return url + ("?alt=sse" if settings.gemini_framing == "sse" else "")


def build_request(job: Job, settings: WorkerSettings, credentials: Credentials) -> UpstreamRequest:
    """Return the streaming request for ``job`` (endpoint, headers, body) per the list above.

    Raises:
        KeyError: The job names a provider this worker has no endpoint for.
        FanoutError: ``invalid_request``, not retryable: an ``openai_chat`` request whose
            ``stream_options`` is not an object (the publisher refuses it at submit; this
            guards jobs written by anything else), or a ``bedrock_converse`` job (its
            adapter exists; no endpoint serves it until Bedrock endpoints are configured).
            The caller stores it as the stream's error.
    """
    if job.provider == "bedrock_converse":
        raise FanoutError("no endpoint serves provider bedrock_converse yet: Bedrock needs an upstreams file",
                          category="invalid_request", retryable=False)
    if job.provider not in ("openai_chat", "openai_responses", "anthropic", "gemini"):
        raise KeyError(job.provider)
    framing: Framing = "json_array" if job.provider == "gemini" and settings.gemini_framing == "json_array" else "sse"
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json" if framing == "json_array" else "text/event-stream",
        "Accept-Encoding": "identity",  # no compression: no buffering in a proxy, no decompression bombs
        **_auth_headers(job.provider, credentials.key(_vendor(job.provider))),
    }
    return UpstreamRequest(provider=job.provider, url=_url(job, settings), body=_encoder.encode(_body(job)),
                           framing=framing, headers=headers)


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
    """
    try:
        timeout = session.timeout if connect_timeout_s is None else aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=None)
        response = await session.post(request.url, data=request.body, headers=request.headers,
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
