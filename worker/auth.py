"""Endpoint credentials onto a request: keys, Google access tokens, AWS SigV4, per attempt.

One :class:`Authorizer` per worker process; :meth:`Authorizer.headers` returns the headers
that prove who sends one request, by the endpoint's ``auth`` (:class:`schema.upstreams.Endpoint`):

* ``bearer`` / ``api-key`` / ``x-api-key`` / ``x-goog-api-key``: the secret
  (:class:`worker.secrets.Secrets`) in ``Authorization: Bearer``, ``api-key`` (Azure),
  ``x-api-key`` (Anthropic) or ``x-goog-api-key`` (Gemini); ``none``: nothing.
* ``google``: ``Authorization: Bearer <OAuth2 access token>`` from Application Default
  Credentials (``google.auth.default``, scope ``cloud-platform``: a service-account file
  named by ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's user credentials, the metadata
  server), plus ``x-goog-user-project`` when the credentials name a quota project. The
  token is refreshed when missing or ``expired`` (google-auth reports that 3 min 45 s
  before the real expiry), in a thread (``asyncio.to_thread``: the refresh is a blocking
  HTTP call) under one lock per endpoint, so jobs wait for one refresh, never the event loop.
* ``aws``: a Bedrock API key as ``Authorization: Bearer`` when the endpoint names one
  (``secret_env``/``secret_file``) or ``AWS_BEARER_TOKEN_BEDROCK`` is set; otherwise SigV4
  (``botocore.auth.SigV4Auth``, service ``bedrock``, the endpoint's region) over the exact
  URL and body bytes, with credentials from botocore's chain (environment, shared files,
  web identity, container and instance metadata; refreshed by botocore, resolved in a thread).
  Signatures are time-bound, hence per attempt.

No secret, token or signature is logged, kept in an error message or a ``repr``; botocore's
and google-auth's own loggers are held at WARNING (botocore logs the canonical request,
session token included, at DEBUG). Sources: UPSTREAMS.md B.2, C.1; google-auth
``google/auth/_default.py``; botocore ``botocore/auth.py``.

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from schema.contract import ErrorCategory
from schema.errors import UpstreamError
from schema.upstreams import Endpoint
from worker.platforms import Plan
from worker.secrets import Secrets

__all__ = ["CLOUD_PLATFORM_SCOPE", "KEY_HEADERS", "Authorizer", "CredentialError"]

CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
"""OAuth2 scope of Vertex AI requests."""
BEDROCK_API_KEY_VARIABLE: Final = "AWS_BEARER_TOKEN_BEDROCK"
"""The variable AWS SDKs read a Bedrock API key from."""
KEY_HEADERS: Final[dict[str, tuple[str, str]]] = {
    "bearer": ("Authorization", "Bearer "),
    "api-key": ("api-key", ""),
    "x-api-key": ("x-api-key", ""),
    "x-goog-api-key": ("x-goog-api-key", ""),
}
"""Key auth kind → (header, value prefix)."""

for _name in ("botocore", "google", "google.auth", "urllib3"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class CredentialError(UpstreamError):
    """An endpoint's credential could not be read or obtained; the attempt fails before any request.

    ``authentication`` and not retryable when nothing is configured or the provider of
    the credential refused it; ``upstream_error`` and retryable when it could not be reached.
    """

    category: ErrorCategory = "authentication"
    retryable = False


class Authorizer:
    """Credentials of every endpoint of one worker process; ``repr`` names nothing.

    Args:
        secrets: Where keys are read from.
    """

    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets
        self._google = _GoogleToken()
        """One Application Default Credentials for every ``google`` endpoint (they share the process's ADC)."""
        self._aws: dict[str, _AwsSigner] = {}

    def __repr__(self) -> str:
        return "Authorizer(...)"

    async def headers(self, endpoint: Endpoint, plan: Plan) -> dict[str, str]:
        """Return the headers that authenticate ``plan`` for ``endpoint`` (empty for ``auth = "none"``).

        Raises:
            CredentialError: The secret cannot be read, no Google or AWS credentials exist,
                or their source refused or could not be reached. Names the endpoint, never a value.
        """
        if endpoint.auth in KEY_HEADERS:
            header, prefix = KEY_HEADERS[endpoint.auth]
            return {header: prefix + self.key(endpoint)}
        if endpoint.auth == "google":
            return await self._google.headers(endpoint.name)
        if endpoint.auth == "aws":
            key = self.key(endpoint, required=False) or self.secrets.variable(BEDROCK_API_KEY_VARIABLE)
            if key:
                return {"Authorization": f"Bearer {key}"}
            signer = self._aws.setdefault(endpoint.name, _AwsSigner(endpoint.name, endpoint.region))
            return await signer.headers(plan)
        return {}

    def key(self, endpoint: Endpoint, *, required: bool = True) -> str:
        """Return the key of ``endpoint`` (``secret_env``/``secret_file``); empty when none and not ``required``.

        Raises:
            CredentialError: Its ``secret_file`` cannot be read, or no key while ``required``.
        """
        try:
            key = self.secrets.secret(endpoint)
        except OSError as exc:
            raise CredentialError(f"endpoint {endpoint.name!r}: cannot read its secret_file "
                                  f"({exc.strerror or type(exc).__name__})") from exc
        if not key and required:
            where = f"variable {endpoint.secret_env}" if endpoint.secret_env else "secret_file"
            raise CredentialError(f"endpoint {endpoint.name!r}: its {where} holds no secret")
        return key


class _GoogleToken:
    """The process's Application Default Credentials and their access token."""

    def __init__(self) -> None:
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    async def headers(self, name: str) -> dict[str, str]:
        """Return the bearer (and quota project) headers; ``name``: the endpoint, for errors."""
        async with self._lock:
            if self._credentials is None or self._credentials.expired or not self._credentials.token:
                self._credentials = await asyncio.to_thread(self._refreshed, name)
        credentials = self._credentials
        quota = getattr(credentials, "quota_project_id", None)
        return {"Authorization": f"Bearer {credentials.token}"} | ({"x-goog-user-project": quota} if quota else {})

    def _refreshed(self, name: str) -> Any:
        """Load (once) and refresh the credentials; runs in a thread."""
        import google.auth  # noqa: PLC0415 - loaded only by a worker with a google endpoint
        import google.auth.exceptions  # noqa: PLC0415
        import google.auth.transport.urllib3  # noqa: PLC0415
        import urllib3  # noqa: PLC0415

        try:
            credentials = self._credentials
            if credentials is None:
                credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
            credentials.refresh(google.auth.transport.urllib3.Request(urllib3.PoolManager()))  # type: ignore[no-untyped-call]
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise CredentialError(f"endpoint {name!r}: no Google Application Default Credentials (set "
                                  "GOOGLE_APPLICATION_CREDENTIALS, or run where a metadata server answers)") from exc
        except google.auth.exceptions.TransportError as exc:
            raise CredentialError(f"endpoint {name!r}: the Google token server could not be reached "
                                  f"({type(exc).__name__})", category="upstream_error", retryable=True) from exc
        except google.auth.exceptions.RefreshError as exc:
            raise CredentialError(f"endpoint {name!r}: the Google token server refused the credentials "
                                  f"({type(exc).__name__})") from exc
        return credentials


class _AwsSigner:
    """One endpoint's AWS credentials (botocore's chain) and SigV4 signer."""

    def __init__(self, name: str, region: str) -> None:
        self.name, self.region = name, region
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    async def headers(self, plan: Plan) -> dict[str, str]:
        async with self._lock:
            frozen = await asyncio.to_thread(self._frozen)
        return _sigv4(frozen, self.region, plan)

    def _frozen(self) -> Any:
        """Return current (refreshed when due) credentials; runs in a thread."""
        import botocore.exceptions  # noqa: PLC0415 - loaded only by a worker with an aws endpoint
        import botocore.session  # noqa: PLC0415

        try:
            if self._credentials is None:
                self._credentials = botocore.session.Session().get_credentials()
            if self._credentials is None:
                raise CredentialError(f"endpoint {self.name!r}: no AWS credentials (AWS_ACCESS_KEY_ID and "
                                      "AWS_SECRET_ACCESS_KEY, a profile, a role), and no Bedrock API key "
                                      f"({BEDROCK_API_KEY_VARIABLE})")
            return self._credentials.get_frozen_credentials()
        except botocore.exceptions.BotoCoreError as exc:
            raise CredentialError(f"endpoint {self.name!r}: AWS credentials could not be obtained "
                                  f"({type(exc).__name__})", category="upstream_error", retryable=True) from exc


def _sigv4(frozen: Any, region: str, plan: Plan) -> dict[str, str]:
    """Sign ``plan`` (method POST, its URL and exact body) with SigV4 for service ``bedrock``."""
    from botocore.auth import SigV4Auth  # noqa: PLC0415
    from botocore.awsrequest import AWSRequest  # noqa: PLC0415
    from botocore.credentials import Credentials  # noqa: PLC0415

    signed = {k: v for k, v in plan.headers.items() if k.lower() in ("content-type", "accept")}
    request = AWSRequest(method="POST", url=plan.url, data=plan.body, headers=signed)
    credentials = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
    SigV4Auth(credentials, "bedrock", region).add_auth(request)
    wanted = ("authorization", "x-amz-date", "x-amz-security-token")
    return {k: v for k, v in request.headers.items() if k.lower() in wanted}
