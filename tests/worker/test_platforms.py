"""Per-platform request building: URL shapes, body edits, framing, no credential (UPSTREAMS.md A-C)."""

from __future__ import annotations

import msgspec
import pytest

from schema.errors import FanoutError
from schema.upstreams import Endpoint
from worker.platforms import plan_request
from worker.upstream_errors import http_error

MESSAGES = {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
VERTEX = "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5"


def endpoint(**fields: object) -> Endpoint:
    return msgspec.convert({"name": "e", "auth": "none", **fields}, Endpoint)


def body(plan: object) -> dict[str, object]:
    return msgspec.json.decode(plan.body)  # type: ignore[attr-defined]


def test_azure_v1_chat_sends_the_deployment_as_model() -> None:
    plan = plan_request(endpoint(api=["openai_chat"], platform="azure", url="https://r.openai.azure.com/openai/v1/"),
                        "openai_chat", "gpt4o-prod", {"messages": []})
    assert plan.url == "https://r.openai.azure.com/openai/v1/chat/completions"
    assert body(plan) == {"messages": [], "model": "gpt4o-prod", "stream": True,
                          "stream_options": {"include_usage": True}}
    assert plan.framing == "sse"


def test_azure_responses_url() -> None:
    plan = plan_request(endpoint(api=["openai_responses"], platform="azure", url="https://r.openai.azure.com/openai/v1"),
                        "openai_responses", "dep", {"input": "hi"})
    assert plan.url == "https://r.openai.azure.com/openai/v1/responses"


def test_vertex_gemini_regional_and_global_paths() -> None:
    plan = plan_request(endpoint(api=["gemini"], platform="vertex", url=VERTEX), "gemini", "gemini-2.5-flash",
                        {"contents": [], "model": "x"})
    assert plan.url == f"{VERTEX}/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert body(plan) == {"contents": []}
    root = "https://aiplatform.googleapis.com/v1/projects/p/locations/global"
    array = plan_request(endpoint(api=["gemini"], platform="vertex", url=root, framing="json_array"), "gemini", "g",
                         {"contents": []})
    assert (array.url, array.framing) == (f"{root}/publishers/google/models/g:streamGenerateContent", "json_array")


def test_vertex_claude_drops_model_adds_anthropic_version_keeps_stream() -> None:
    plan = plan_request(endpoint(api=["anthropic"], platform="vertex", url=VERTEX), "anthropic",
                        "claude-sonnet-4-5@20250929", {**MESSAGES, "model": "ignored"})
    assert plan.url == f"{VERTEX}/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict"
    assert body(plan) == {**MESSAGES, "anthropic_version": "vertex-2023-10-16", "stream": True}
    assert "anthropic-version" not in plan.headers


def test_bedrock_invoke_drops_model_and_stream_and_encodes_an_arn() -> None:
    arn = "arn:aws:bedrock:us-east-1:123:inference-profile/us.anthropic.claude"
    plan = plan_request(endpoint(api=["anthropic"], platform="bedrock", auth="aws", region="us-east-1",
                                 url="https://bedrock-runtime.us-east-1.amazonaws.com"),
                        "anthropic", arn, {**MESSAGES, "stream": True})
    assert plan.url == ("https://bedrock-runtime.us-east-1.amazonaws.com/model/arn:aws:bedrock:us-east-1:123:"
                        "inference-profile%2Fus.anthropic.claude/invoke-with-response-stream")
    assert body(plan) == {**MESSAGES, "anthropic_version": "bedrock-2023-05-31"}
    assert (plan.framing, plan.headers["Accept"]) == ("eventstream", "application/vnd.amazon.eventstream")


def test_bedrock_converse_url_and_body() -> None:
    request = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 5}}
    plan = plan_request(endpoint(api=["bedrock_converse"], platform="bedrock", auth="aws", region="eu-west-1",
                                 url="https://bedrock-runtime.eu-west-1.amazonaws.com"),
                        "bedrock_converse", "anthropic.claude-3-haiku-20240307-v1:0", request)
    assert plan.url.endswith("/model/anthropic.claude-3-haiku-20240307-v1:0/converse-stream")
    assert body(plan) == request


def test_native_anthropic_keeps_the_version_header() -> None:
    plan = plan_request(endpoint(api=["anthropic"], url="https://api.anthropic.com"), "anthropic", "claude", MESSAGES)
    assert (plan.url, plan.headers["anthropic-version"]) == ("https://api.anthropic.com/v1/messages", "2023-06-01")


def test_a_provider_the_endpoint_does_not_speak_is_invalid_request() -> None:
    with pytest.raises(FanoutError, match="endpoint 'e' does not speak provider 'gemini'") as caught:
        plan_request(endpoint(api=["openai_chat"], url="https://h/v1"), "gemini", "m", {})
    assert (caught.value.category, caught.value.retryable) == ("invalid_request", False)


def test_a_bedrock_http_error_is_named_by_its_error_type_header() -> None:
    error = http_error("anthropic", 429, {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/"},
                       b'{"message":"Too many requests, please wait"}')
    assert (error.category, error.retryable, error.provider_code) == ("rate_limited", True, "ThrottlingException")
    denied = http_error("bedrock_converse", 403, {"X-Amzn-ErrorType": "AccessDeniedException"}, b'{"Message":"no"}')
    assert (denied.category, denied.provider_code, denied.message) == ("permission", "AccessDeniedException",
                                                                        "provider answered HTTP 403: no")


def test_gemini_interactions_url_body_and_revision_header() -> None:
    gemini = endpoint(api=["gemini", "gemini_interactions"], url="https://generativelanguage.googleapis.com",
                      framing="json_array")
    plan = plan_request(gemini, "gemini_interactions", "gemini-3-flash-preview", {"input": "hi", "stream": False})
    assert plan.url == "https://generativelanguage.googleapis.com/v1beta/interactions"
    assert body(plan) == {"input": "hi", "model": "gemini-3-flash-preview", "stream": True}
    assert (plan.framing, plan.headers["Api-Revision"]) == ("sse", "2026-05-20")
    assert "Api-Revision" not in plan_request(gemini, "gemini", "g", {"contents": []}).headers


def test_a_gemini_interactions_http_error_is_named_by_its_status() -> None:
    raw = b'{"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}'
    error = http_error("gemini_interactions", 429, {}, raw)
    assert (error.category, error.provider_code) == ("rate_limited", "RESOURCE_EXHAUSTED")
