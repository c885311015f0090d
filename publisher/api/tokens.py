"""Read tokens: HMAC-SHA256-signed, one stream, one scope, an expiry. Pure (no I/O, no clock).

Wire form: ``v1.<payload>.<mac>`` where ``payload`` is the base64url (unpadded) of the
compact JSON ``{"sid": stream_id, "scp": scope, "exp": expires_at}`` and ``mac`` the
base64url of HMAC-SHA256(secret, ``"v1." + payload``). Every publisher of a deployment
shares the secret, so a token from one verifies on all. The token is a bearer credential:
callers must never log it.

Follows RFC 2104 (HMAC) and RFC 4648 section 5 (base64url).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

import msgspec

from publisher.history.visibility import Scope
from schema.errors import ClientError

TOKEN_PREFIX: Final = "v1."  # noqa: S105 - a format marker, not a secret
"""Leading marker of every read token (API keys never start with it)."""


class TokenClaims(msgspec.Struct, frozen=True, kw_only=True):
    """What a valid token grants."""

    sid: str
    """The one stream the token may read."""
    scp: Scope
    """The projection the token may see."""
    exp: int
    """Expiry, seconds since the Unix epoch; the token is refused from this second on."""


class TokenInvalidError(ClientError):
    """Malformed token or bad signature: the client must get a new token."""

    category = "authentication"


class TokenExpiredError(ClientError):
    """A well-signed token past its ``exp``: the client must get a new token."""

    category = "authentication"


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(TokenClaims)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, signed: str) -> bytes:
    return hmac.new(secret.encode(), signed.encode("ascii"), hashlib.sha256).digest()


def issue(secret: str, stream_id: str, scope: Scope, expires_at: int) -> str:
    """Return a signed token for ``stream_id`` and ``scope`` valid until ``expires_at``.

    Args:
        secret: The deployment's ``FANOUT_TOKEN_SECRET``.
        stream_id: The stream the token may read.
        scope: ``public`` or ``internal``.
        expires_at: Expiry, whole seconds since the Unix epoch.

    Returns:
        The token, ASCII, URL-safe (fits a query parameter unescaped).
    """
    payload = _b64(_encoder.encode(TokenClaims(sid=stream_id, scp=scope, exp=expires_at)))
    signed = TOKEN_PREFIX + payload
    return f"{signed}.{_b64(_mac(secret, signed))}"


def verify(secret: str, token: str, now_s: float) -> TokenClaims:
    """Check a token's signature and expiry and return its claims.

    The caller still has to compare ``claims.sid`` with the stream asked for.

    Args:
        secret: The deployment's ``FANOUT_TOKEN_SECRET``.
        token: The token as received (header or query parameter).
        now_s: Current time, seconds since the Unix epoch.

    Raises:
        TokenInvalidError: Not a v1 token, bad base64 or JSON, or a signature that does
            not match (its text compared in constant time with the one :func:`issue`
            writes, so every token has exactly one accepted spelling).
        TokenExpiredError: Signature valid, ``now_s >= exp``.
    """
    signed, _, mac_text = token.rpartition(".")
    if not token.isascii() or not signed.startswith(TOKEN_PREFIX):
        raise TokenInvalidError("not a fanout read token")
    if not hmac.compare_digest(mac_text, _b64(_mac(secret, signed))):
        raise TokenInvalidError("read token signature does not match")
    try:
        claims = _decoder.decode(_unb64(signed[len(TOKEN_PREFIX):]))
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise TokenInvalidError("malformed read token") from exc
    if now_s >= claims.exp:
        raise TokenExpiredError("read token expired")
    return claims
