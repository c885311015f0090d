"""Who may do what: API keys submit, cancel and read anything; read tokens read one stream.

API keys come only in ``Authorization: Bearer <key>`` (never in a URL). Read tokens
(:mod:`publisher.api.tokens`) come in that header or in the ``token`` query parameter, since
a browser's EventSource cannot set headers. Credentials are never logged.

Follows RFC 6750 (Bearer tokens) for the header and the ``WWW-Authenticate`` challenge.
"""

from __future__ import annotations

import hmac
import time

from aiohttp import web

from publisher.api.problems import ProblemError
from publisher.api.tokens import TOKEN_PREFIX, TokenExpiredError, TokenInvalidError, verify
from publisher.history.visibility import Scope
from publisher.state import SETTINGS

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="fanout"'}
_BAD_TOKEN = {"WWW-Authenticate": 'Bearer realm="fanout", error="invalid_token"'}


def bearer(request: web.Request) -> str | None:
    """Return the credential of an ``Authorization: Bearer`` header, or ``None`` if absent.

    Raises:
        ProblemError: ``unauthorized`` for another scheme or an empty credential.
    """
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, credential = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise ProblemError("unauthorized", "use 'Authorization: Bearer <credential>'", headers=_CHALLENGE)
    return credential.strip()


def is_api_key(request: web.Request, credential: str) -> bool:
    """Return True when ``credential`` is one of ``FANOUT_API_KEYS`` (constant-time per key).

    Header bytes that are not UTF-8 reach here as lone surrogates (``surrogateescape``);
    they are compared as the bytes they were, so they simply match no key.
    """
    given = credential.encode("utf-8", "surrogateescape")
    found = False
    for key in request.app[SETTINGS].api_keys:
        found |= hmac.compare_digest(given, key.encode("utf-8", "surrogateescape"))
    return found


def require_api_key(request: web.Request) -> None:
    """Accept the request only with a valid API key in the ``Authorization`` header.

    Raises:
        ProblemError: ``unauthorized`` (401) when the header is missing, holds a read
            token, or holds a key that is not one of ``FANOUT_API_KEYS``; each says which.
    """
    credential = bearer(request)
    if credential is None:
        raise ProblemError("unauthorized", "an API key is required: send 'Authorization: Bearer <key>' with one of "
                           "the publisher's FANOUT_API_KEYS", headers=_CHALLENGE)
    if credential.startswith(TOKEN_PREFIX):
        raise ProblemError("unauthorized", "a read token only reads its stream; submitting, cancelling and minting "
                           "tokens need an API key", headers=_CHALLENGE)
    if not is_api_key(request, credential):
        raise ProblemError("unauthorized", "the API key was refused: it is not one of the publisher's "
                           "FANOUT_API_KEYS", headers=_CHALLENGE)


def authorize_read(request: web.Request, stream_id: str) -> Scope:
    """Return the projection the request may read of ``stream_id``.

    An API key in the header reads any stream with ``internal`` scope. Otherwise a read
    token is taken from the header, else from the ``token`` query parameter.

    Raises:
        ProblemError: ``unauthorized`` (no credential, unknown key), ``invalid-token``,
            ``token-expired`` (401; get a new token) or ``forbidden`` (403: a token of
            another stream).
    """
    credential = bearer(request)
    if credential is not None and not credential.startswith(TOKEN_PREFIX):
        if is_api_key(request, credential):
            return "internal"
        raise ProblemError("unauthorized", f"the credential was refused: it is neither one of the publisher's "
                           f"FANOUT_API_KEYS nor a read token (those start with {TOKEN_PREFIX!r})",
                           headers=_CHALLENGE)
    token = credential or request.query.get("token")
    if not token:
        raise ProblemError("unauthorized", "a read token (the 'token' of the submission, in 'Authorization: Bearer' "
                           "or ?token=) or an API key is required", headers=_CHALLENGE)
    renew = f"get a new one with POST /v1/streams/{stream_id}/tokens (API key), or read with an API key"
    try:
        claims = verify(request.app[SETTINGS].token_secret, token, time.time())
    except TokenExpiredError as exc:
        raise ProblemError("token-expired", f"the read token expired: {renew}", headers=_BAD_TOKEN) from exc
    except TokenInvalidError as exc:
        raise ProblemError("invalid-token", f"{exc.message} (a token signed with another FANOUT_TOKEN_SECRET never "
                           f"verifies): {renew}", headers=_BAD_TOKEN) from exc
    if claims.sid != stream_id:
        raise ProblemError("forbidden", f"the read token is for another stream: use the token its submission "
                           f"answered, or get one with POST /v1/streams/{stream_id}/tokens (API key)")
    return claims.scp
