"""What the client makes of the publisher's answers and of its base URL: errors that say what to do.

A base URL must be an ``http(s)://`` root (:func:`base_url_problem`); a connection that
cannot be made is worded in a few words (:func:`connect_reason`); a refusal (a problem
document, RFC 9457) becomes :class:`~fanout_client.errors.StreamUnavailableError` or
:class:`~fanout_client.errors.HistoryResetError` (:func:`refusal_error`), a ``404`` that
missed every route saying the base URL is not the publisher's root (:data:`NOT_A_ROUTE`).
Imports nothing of the server.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, Final

import aiohttp
from yarl import URL

from fanout_client.errors import HistoryResetError, StreamUnavailableError

NOT_A_ROUTE: Final = "is not a route of a fanout publisher"
"""Words of the ``404`` message for a request that missed every route (a wrong base URL)."""


def base_url_problem(base_url: str) -> str | None:
    """Return why ``base_url`` cannot be a publisher's root URL, or ``None`` when it can.

    Args:
        base_url: Text such as ``http://127.0.0.1:8080``; ``127.0.0.1:8080`` (no scheme) is refused.
    """
    try:
        url = URL(base_url)
    except ValueError as exc:
        return f"{base_url!r} is not a URL ({exc})"
    if url.scheme in ("http", "https") and url.host:
        return None
    example = f"http://{base_url}" if "://" not in base_url and base_url else "http://127.0.0.1:8080"
    return f"{base_url!r} is not an http:// or https:// URL; write it with the scheme, e.g. {example}"


def connect_reason(exc: aiohttp.ClientConnectorError) -> str:
    """Say in a few words why a connection could not be made."""
    os_error = exc.os_error
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS failed ({os_error})"
    if isinstance(os_error, socket.gaierror):
        return f"unknown host {exc.host}"
    if isinstance(os_error, ConnectionRefusedError) or os_error.errno == errno.ECONNREFUSED:
        return "connection refused (nothing listens there)"
    return os_error.strerror or str(os_error)


def refusal_error(status: int, request: str, data: Any, *, base_url: str,
                  reason: str | None) -> StreamUnavailableError:
    """Return the error for a refused request.

    Args:
        status: The HTTP status.
        request: ``<method> <path>`` of the request, for a missed route.
        data: The decoded JSON body (a problem document), or anything else (ignored).
        base_url: The client's base URL, for the advice on a missed route.
        reason: The HTTP reason phrase, used when the body has no ``detail`` or ``title``.

    Returns:
        :class:`HistoryResetError` for ``410 history-reset``, else :class:`StreamUnavailableError`
        with the problem's detail (and its per-field errors).
    """
    problem = data if isinstance(data, dict) else {}
    detail = problem.get("detail") or problem.get("title") or reason or "request refused"
    fields = "; ".join(f"{e.get('field')}: {e.get('detail')}" for e in problem.get("errors") or []
                       if isinstance(e, dict))
    if fields:
        detail = f"{detail} ({fields})"
    if status == 404 and (_ends_in_v1(base_url) or not _about_a_stream(problem)):
        detail = f"{request} {NOT_A_ROUTE}: {_root_hint(base_url)}"
    if status == 410 and str(problem.get("type", "")).endswith("/history-reset"):
        return HistoryResetError(f"{status}: {detail}", status=status, problem=problem)
    return StreamUnavailableError(f"{status}: {detail}", status=status, problem=problem)


def _ends_in_v1(base_url: str) -> bool:
    return URL(base_url).path.rstrip("/").endswith("/v1")


def _root_hint(base_url: str) -> str:
    """Advice for a base URL that reached no route."""
    if _ends_in_v1(base_url):
        return f"give the publisher's root URL without /v1 ({base_url[:-3]})"
    return f"is {base_url} the publisher's root URL (e.g. http://127.0.0.1:8080)?"


def _about_a_stream(problem: dict[str, Any]) -> bool:
    """Return True for the publisher's ``404`` about an unknown stream (not a missing route)."""
    kind, detail = str(problem.get("type", "")), str(problem.get("detail", ""))
    return kind.endswith("/not-found") and not detail.startswith("no such route")
