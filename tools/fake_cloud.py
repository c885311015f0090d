"""A local stand-in for Azure OpenAI, Vertex AI, Bedrock and Google's token server, checking auth.

For tests and demos only. It answers each cloud's URL shapes (UPSTREAMS.md A-C) by
streaming recorded transcripts, after checking the credential the way the cloud would:

* ``POST /openai/v1/chat/completions`` and ``…/openai/v1/responses`` (Azure v1): an ``api-key``
  header or ``Authorization: Bearer`` with the configured key; streams
  ``openai_chat``/``openai_responses/<body model>.sse``.
* ``POST /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:streamGenerateContent``
  (Vertex Gemini): a bearer token ``/token`` issued; streams ``gemini_sse/<m>.sse`` with
  ``alt=sse``, else ``gemini_json_array/<m>.sse``.
* ``…/publishers/anthropic/models/{m}:streamRawPredict`` (Vertex Claude): the same token, a
  body with ``anthropic_version: vertex-2023-10-16`` and no ``model``; streams ``anthropic/<m>.sse``.
* ``POST /model/{m}/invoke-with-response-stream`` and ``…/converse-stream`` (Bedrock): a SigV4
  ``Authorization`` whose scope names the configured key id, region and ``bedrock`` and whose
  signature botocore recomputes from the request as received, or a Bedrock API key as
  bearer; invoke bodies need ``anthropic_version: bedrock-2023-05-31`` and neither ``model``
  nor ``stream``; streams ``bedrock_invoke``/``bedrock_converse/<m>.eventstream`` (of an ARN
  ``…/<m>``, sent percent-encoded as ``%2F``, the last segment).
* ``POST /token`` (Google's OAuth2 token endpoint): a service account's RS256 JWT assertion
  (RFC 7523 grant), verified with the configured public key, audience and scope; answers
  an access token.

A refused credential gets the cloud's answer (Azure and Vertex 401, Bedrock 403 with
``x-amzn-ErrorType``); an unknown case 404. Requests are recorded without secret values
(:attr:`CloudState.requests`). Tokens are issued only by a real JWT-bearer exchange: the
assertion is verified with the configured public key, its audience and scope, so
``google-auth`` runs for real against it.
"""

from __future__ import annotations

import secrets
import time
import urllib.parse
from pathlib import Path
from typing import Any, Final

import msgspec
from aiohttp import web

from tools.upstream_bodies import DEFAULT_ROOTS, SECRET_HEADERS

GRANT_JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
"""The OAuth2 grant a service account uses (RFC 7523)."""
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
GOOGLE_TOKEN_AUDIENCE: Final = "https://oauth2.googleapis.com/token"  # noqa: S105 - a URL
"""The audience google-auth puts in a service account's assertion, whatever its ``token_uri``."""
CONTENT_TYPES: Final = {".sse": "text/event-stream", ".eventstream": "application/vnd.amazon.eventstream"}


class CloudConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the fake cloud accepts and how it streams."""

    roots: tuple[Path, ...] = DEFAULT_ROOTS
    """Transcript roots, searched in order."""
    azure_key: str = ""
    """The Azure ``api-key`` (or bearer) accepted."""
    google_public_key_pem: str = ""
    """Public key (PEM) of the service account whose JWT assertions ``/token`` accepts."""
    token_ttl_s: int = 3600
    """``expires_in`` of issued access tokens."""
    aws_access_key_id: str = ""
    """The AWS access key id SigV4 signatures must use."""
    aws_secret_access_key: str = ""
    """Its secret, to verify signatures."""
    aws_region: str = "us-east-1"
    """The region a SigV4 scope must name."""
    bedrock_api_key: str = ""
    """A Bedrock API key accepted as bearer (empty: none)."""
    chunk_bytes: int = 37
    """Bytes per written chunk (an odd size splits frames anywhere)."""


class CloudState:
    """Recorded requests, issued tokens and counters of one fake cloud."""

    def __init__(self, config: CloudConfig) -> None:
        self.config = config
        self.requests: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.base_url = ""
        """Set by the caller once the port is known (the JWT audience is ``<base_url>/token``)."""


CLOUD: Final = web.AppKey("cloud", CloudState)


def make_cloud_app(config: CloudConfig) -> web.Application:
    """Return the fake cloud (routes in the module docstring)."""
    app = web.Application()
    app[CLOUD] = CloudState(config)
    app.router.add_post("/token", _token)
    app.router.add_post("/openai/v1/chat/completions", _azure("openai_chat"))
    app.router.add_post("/openai/v1/responses", _azure("openai_responses"))
    app.router.add_post("/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{tail}", _vertex)
    app.router.add_post("/model/{model}/{operation}", _bedrock)
    return app


def _record(request: web.Request, body: bytes, verdict: str) -> None:
    headers = {k: ("***" if SECRET_HEADERS.search(k) else v) for k, v in request.headers.items()}
    try:
        parsed: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        parsed = None
    request.app[CLOUD].requests.append({"path": request.raw_path, "headers": headers, "auth": verdict,
                                        "body": parsed})


def _json_error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body), content_type="application/json",
                        headers=headers)


async def _stream(request: web.Request, directory: str, case: str, suffix: str = ".sse") -> web.StreamResponse:
    state = request.app[CLOUD]
    path = next((root / directory / f"{case}{suffix}" for root in state.config.roots
                 if (root / directory / f"{case}{suffix}").is_file()), None)
    if path is None or "/" in case or ".." in case:
        return _json_error(404, {"message": f"no transcript {directory}/{case}{suffix}"})
    content_type = "application/json" if directory == "gemini_json_array" else CONTENT_TYPES[suffix]
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    data, size = path.read_bytes(), state.config.chunk_bytes
    for start in range(0, len(data), size):
        await response.write(data[start:start + size])
    await response.write_eof()
    return response


def _azure(directory: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key = request.app[CLOUD].config.azure_key
        sent = request.headers.get("api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        ok = bool(key) and secrets.compare_digest(sent, key)
        _record(request, body, "api-key" if ok else "refused")
        if not ok:
            return _json_error(401, {"error": {"code": "401", "message": "Access denied due to invalid subscription "
                                               "key or wrong API endpoint."}})
        model = msgspec.json.decode(body).get("model", "")
        return await _stream(request, directory, str(model))

    return handler


async def _vertex(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    state = request.app[CLOUD]
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    ok = token in state.tokens
    _record(request, body, "google" if ok else "refused")
    if not ok:
        return _json_error(401, {"error": {"code": 401, "message": "Request had invalid authentication credentials.",
                                           "status": "UNAUTHENTICATED"}})
    model, _, method = request.match_info["tail"].rpartition(":")
    publisher = request.match_info["publisher"]
    if publisher == "google" and method == "streamGenerateContent":
        directory = "gemini_sse" if request.query.get("alt") == "sse" else "gemini_json_array"
        return await _stream(request, directory, model)
    if publisher == "anthropic" and method == "streamRawPredict":
        parsed = msgspec.json.decode(body)
        if parsed.get("anthropic_version") != "vertex-2023-10-16" or "model" in parsed:
            return _json_error(400, {"error": {"code": 400, "message": "anthropic_version must be vertex-2023-10-16 "
                                               "and model only in the URL", "status": "INVALID_ARGUMENT"}})
        return await _stream(request, "anthropic", model)
    return _json_error(404, {"error": {"code": 404, "message": "no such method", "status": "NOT_FOUND"}})


async def _bedrock(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    verdict = _bedrock_auth(request, body)
    _record(request, body, verdict)
    if verdict.startswith("refused"):
        kind = "InvalidSignatureException" if verdict == "refused-signature" else "UnrecognizedClientException"
        return _json_error(403, {"message": f"The request was refused ({kind})."}, {"x-amzn-ErrorType": kind})
    operation = request.match_info["operation"]
    model = request.match_info["model"].rpartition("/")[2]  # an inference-profile ARN names its case last
    parsed = msgspec.json.decode(body)
    if operation == "invoke-with-response-stream":
        if parsed.get("anthropic_version") != "bedrock-2023-05-31" or "model" in parsed or "stream" in parsed:
            message = "Malformed input request: anthropic_version bedrock-2023-05-31 required; no model or stream"
            return _json_error(400, {"message": message}, {"x-amzn-ErrorType": "ValidationException"})
        return await _stream(request, "bedrock_invoke", model, ".eventstream")
    if operation == "converse-stream":
        return await _stream(request, "bedrock_converse", model, ".eventstream")
    return _json_error(404, {"message": "unknown operation"}, {"x-amzn-ErrorType": "UnknownOperationException"})


def _bedrock_auth(request: web.Request, body: bytes) -> str:
    """Return ``api-key``, ``sigv4``, ``refused`` or ``refused-signature`` for one Bedrock request."""
    config = request.app[CLOUD].config
    authorization = request.headers.get("Authorization", "")
    if authorization.startswith("Bearer "):
        key = authorization.removeprefix("Bearer ")
        accepted = bool(config.bedrock_api_key) and secrets.compare_digest(key, config.bedrock_api_key)
        return "api-key" if accepted else "refused"
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return "refused"
    return "sigv4" if _signature_valid(request, body, authorization) else "refused-signature"


def _signature_valid(request: web.Request, body: bytes, authorization: str) -> bool:
    """Recompute the SigV4 signature of the request as received (botocore) and compare."""
    from botocore.auth import SigV4Auth  # noqa: PLC0415 - only this route needs botocore
    from botocore.awsrequest import AWSRequest  # noqa: PLC0415
    from botocore.credentials import Credentials  # noqa: PLC0415

    config = request.app[CLOUD].config
    parts = dict(part.strip().split("=", 1) for part in authorization.removeprefix("AWS4-HMAC-SHA256 ").split(","))
    key_id, date, region, service, _ = parts.get("Credential", "").split("/")
    if (key_id, region, service) != (config.aws_access_key_id, config.aws_region, "bedrock"):
        return False
    amz_date = request.headers.get("X-Amz-Date", "")
    if not amz_date.startswith(date) or abs(time.time() - _epoch(amz_date)) > 300:
        return False
    signed = parts.get("SignedHeaders", "").split(";")
    headers = {name: request.headers.get(name, "") for name in signed}
    url = f"http://{request.host}{request.raw_path}"
    aws = AWSRequest(method=request.method, url=url, data=body, headers=headers)
    aws.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(config.aws_access_key_id, config.aws_secret_access_key), "bedrock", region)
    expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
    return secrets.compare_digest(expected, parts.get("Signature", ""))


def _epoch(amz_date: str) -> float:
    try:
        return time.mktime(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")) - time.timezone
    except ValueError:
        return 0.0


async def _token(request: web.Request) -> web.Response:
    """Exchange a service account's signed JWT for an access token (Google's OAuth2 token endpoint)."""
    import google.auth.exceptions  # noqa: PLC0415
    import google.auth.jwt  # noqa: PLC0415

    state = request.app[CLOUD]
    state.token_requests += 1
    form = urllib.parse.parse_qs((await request.read()).decode())
    if form.get("grant_type") != [GRANT_JWT_BEARER] or len(form.get("assertion", [])) != 1:
        return _json_error(400, {"error": "unsupported_grant_type"})
    try:
        audience = [f"{state.base_url}/token", GOOGLE_TOKEN_AUDIENCE]
        claims = google.auth.jwt.decode(  # type: ignore[no-untyped-call]
            form["assertion"][0], certs=state.config.google_public_key_pem, audience=audience)
    except (ValueError, google.auth.exceptions.GoogleAuthError):
        return _json_error(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
    if CLOUD_PLATFORM_SCOPE not in str(claims.get("scope", "")).split():
        return _json_error(400, {"error": "invalid_scope"})
    token = f"ya29.fake-{secrets.token_hex(16)}"
    state.tokens.add(token)
    return web.json_response({"access_token": token, "expires_in": state.config.token_ttl_s,
                              "token_type": "Bearer"})
