"""Per-platform request building: an endpoint and a job in, URL, body, framing and plain headers out.

The credential is not added here (:mod:`worker.auth` does, per attempt). Shapes, by
``platform`` of the endpoint (:class:`schema.upstreams.Endpoint`) and the job's API:

==========  ==================  ==============================================================  ===========
platform    API                 URL (``{url}`` = the endpoint's ``url``)                        framing
==========  ==================  ==============================================================  ===========
openai      openai_chat         ``{url}/chat/completions``                                      SSE
openai      openai_responses    ``{url}/responses``                                             SSE
openai      anthropic           ``{url}/v1/messages`` (``anthropic-version: 2023-06-01``)       SSE
openai      gemini              ``{url}/v1beta/models/{m}:streamGenerateContent[?alt=sse]``     SSE / array
openai      gemini_interactions ``{url}/v1beta/interactions`` (``Api-Revision: 2026-05-20``)       SSE
azure       openai_*            as ``openai`` (v1 URLs: ``…/openai/v1``); ``model`` = deployment SSE
vertex      gemini              ``{url}/publishers/google/models/{m}:streamGenerateContent``    SSE / array
vertex      anthropic           ``{url}/publishers/anthropic/models/{m}:streamRawPredict``      SSE
bedrock     anthropic           ``{url}/model/{m}/invoke-with-response-stream``                 event-stream
bedrock     bedrock_converse    ``{url}/model/{m}/converse-stream``                             event-stream
==========  ==================  ==============================================================  ===========

Body edits (UPSTREAMS.md B.4, C.3): Vertex Claude drops ``model`` and adds
``anthropic_version: "vertex-2023-10-16"`` (``stream: true`` stays); Bedrock invoke drops
``model`` and ``stream`` and adds ``anthropic_version: "bedrock-2023-05-31"``; Converse drops
``model`` and ``stream`` (the operation streams); Gemini's model is only in the path; a
``background`` endpoint's Responses body gets ``background: true`` and ``store: true``
(UPSTREAMS.md E.1), an Interactions body ``stream: true`` and ``model``, plus ``background: true``
and ``store: true`` on a ``background`` endpoint (E.3). A
model in a path is percent-encoded (Bedrock keeps ``:`` as anthropic-sdk-python does, so
an inference-profile ARN's ``/`` becomes ``%2F``). Sources: OpenAI and Anthropic API
references; Gemini "Generate content"; Vertex AI ``publishers.models.streamGenerateContent``
and ``streamRawPredict``; botocore ``bedrock-runtime`` service model.

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

import msgspec

from schema.errors import FanoutError
from schema.upstreams import Endpoint
from worker.adapters.base import Framing
from worker.adapters.gemini_interactions_parts import API_REVISION

__all__ = ["ANTHROPIC_VERSION", "BEDROCK_ANTHROPIC_VERSION", "VERTEX_ANTHROPIC_VERSION", "Plan", "plan_request"]

ANTHROPIC_VERSION: Final = "2023-06-01"
"""``anthropic-version`` header of every direct Messages request."""
VERTEX_ANTHROPIC_VERSION: Final = "vertex-2023-10-16"
"""``anthropic_version`` body field of Claude on Vertex AI."""
BEDROCK_ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
"""``anthropic_version`` body field of Claude on Bedrock (InvokeModelWithResponseStream)."""
ACCEPT: Final[dict[str, str]] = {"sse": "text/event-stream", "json_array": "application/json",
                                  "eventstream": "application/vnd.amazon.eventstream"}
"""``Accept`` header by framing."""

_encoder: Final = msgspec.json.Encoder()


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """A request without its credential."""

    url: str
    """Absolute URL, query included; never holds a credential."""
    body: bytes
    """JSON body, exactly the bytes sent (and signed, for SigV4)."""
    framing: Framing
    """How the answer's body is framed."""
    headers: dict[str, str]
    """Plain headers (content type, accept, API version)."""


def _invalid(message: str) -> FanoutError:
    return FanoutError(message, category="invalid_request", retryable=False)


def _streaming_body(request: dict[str, Any], provider: str, model: str) -> dict[str, Any]:
    """Return the native body with ``model`` and the streaming switches (Chat: ``stream_options.include_usage``)."""
    body = {**request, "model": model, "stream": True}
    if provider == "openai_chat":
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise _invalid('request.stream_options must be a JSON object (or absent), such as {"include_usage": true}')
        body["stream_options"] = {**(options or {}), "include_usage": True}
    return body


def _without(request: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k not in keys}


def _native(endpoint: Endpoint, provider: str, model: str, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    root = endpoint.url.rstrip("/")
    if provider == "openai_chat":
        return root + "/chat/completions", _streaming_body(request, provider, model)
    if provider == "openai_responses":
        extra = {"background": True, "store": True} if endpoint.background else {}
        return root + "/responses", {**_streaming_body(request, provider, model), **extra}
    if provider == "anthropic":
        return root + "/v1/messages", _streaming_body(request, provider, model)
    if provider == "gemini_interactions":
        extra = {"background": True, "store": True} if endpoint.background else {}
        return root + "/v1beta/interactions", {**_streaming_body(request, provider, model), **extra}
    return f"{root}/v1beta/models/{quote(model, safe='')}:streamGenerateContent", _without(request, "model", "stream")


def _vertex(endpoint: Endpoint, provider: str, model: str, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    root, name = endpoint.url.rstrip("/"), quote(model, safe="@")
    if provider == "anthropic":
        body = {**_without(request, "model"), "anthropic_version": VERTEX_ANTHROPIC_VERSION, "stream": True}
        return f"{root}/publishers/anthropic/models/{name}:streamRawPredict", body
    return f"{root}/publishers/google/models/{name}:streamGenerateContent", _without(request, "model", "stream")


def _bedrock(endpoint: Endpoint, provider: str, model: str, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    root, name = endpoint.url.rstrip("/"), quote(model, safe=":")
    body = _without(request, "model", "stream")
    if provider == "anthropic":
        return f"{root}/model/{name}/invoke-with-response-stream", {**body, "anthropic_version":
                                                                    BEDROCK_ANTHROPIC_VERSION}
    return f"{root}/model/{name}/converse-stream", body


_BUILDERS: Final = {"openai": _native, "azure": _native, "vertex": _vertex, "bedrock": _bedrock}


def _framing(endpoint: Endpoint, provider: str) -> Framing:
    if endpoint.platform == "bedrock":
        return "eventstream"
    return "json_array" if provider == "gemini" and endpoint.framing == "json_array" else "sse"


def plan_request(endpoint: Endpoint, provider: str, model: str, request: dict[str, Any]) -> Plan:
    """Return the streaming request of one job for ``endpoint`` (the table above).

    Args:
        endpoint: Where it goes; must speak ``provider`` (:func:`schema.upstreams.targets`).
        provider: The job's API.
        model: The model (or deployment) name for this endpoint.
        request: The job's provider-native body (not modified).

    Raises:
        FanoutError: ``invalid_request``, not retryable: ``provider`` is not one the
            endpoint speaks, or an ``openai_chat`` body whose ``stream_options`` is not an
            object. The caller stores it as the stream's error.
    """
    if provider not in endpoint.apis:
        raise _invalid(f"endpoint {endpoint.name!r} does not speak provider {provider!r} "
                       f"(it speaks {', '.join(endpoint.apis)})")
    url, body = _BUILDERS[endpoint.platform](endpoint, provider, model, request)
    framing = _framing(endpoint, provider)
    if provider == "gemini" and framing == "sse":
        url += "?alt=sse"
    headers = {"Content-Type": "application/json", "Accept": ACCEPT[framing],
               "Accept-Encoding": "identity"}  # no compression: no buffering in a proxy, no decompression bombs
    if provider == "anthropic" and endpoint.platform == "openai":
        headers["anthropic-version"] = ANTHROPIC_VERSION
    if provider == "gemini_interactions":
        headers["Api-Revision"] = API_REVISION
    return Plan(url=url, body=_encoder.encode(body), framing=framing, headers=headers)
