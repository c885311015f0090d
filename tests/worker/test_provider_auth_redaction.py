"""A provider's real 401/403 answer reaches readers redacted: the sentence, never a key fragment.

Each body is the provider's error body as its API sends it (key material made up, in the
shape each provider masks it); it goes the worker's own way: :func:`worker.upstream_errors.http_error`,
then the adapter's ``fail``, whose normalizer writes the ``stream.error`` message through
:func:`worker.error_policy.safe_message` (one redaction, :func:`schema.redact.redact`).
"""

from __future__ import annotations

import msgspec
import pytest

from schema.contract import StreamError
from worker.pipeline import build_pipeline
from worker.upstream_errors import http_error

OPENAI_HINT = "You can find your API key at https://platform.openai.com/account/api-keys."
AZURE = ("Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an "
         "active subscription and use a correct regional API endpoint for your resource.")
GEMINI_DETAILS = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                   "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]


def _openai_style(message: str, code: str = "invalid_api_key") -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


CASES = [
    ("openai_chat", 401, _openai_style(f"Incorrect API key provided: sk-proj-{'*' * 148}Ab3x. {OPENAI_HINT}"),
     f"Incorrect API key provided: [redacted]. {OPENAI_HINT}", ["Ab3x", "sk-proj"]),
    ("openai_responses", 401, _openai_style(f"Incorrect API key provided: sk-PMafP{'*' * 39}E873. {OPENAI_HINT}"),
     f"Incorrect API key provided: [redacted]. {OPENAI_HINT}", ["PMafP", "E873"]),
    ("anthropic", 401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                        "request_id": "req_011CYhr1kdGzCrPHfrhibMen"}, "invalid x-api-key", []),
    ("gemini", 400, [{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                                "status": "INVALID_ARGUMENT", "details": GEMINI_DETAILS}}],
     "API key not valid. Please pass a valid API key.", []),
    ("openai_chat", 401, {"error": {"code": "401", "message": AZURE}}, AZURE, []),  # Azure OpenAI
    ("openai_chat", 403, {"message": "The security token included in the request is invalid."},  # Bedrock gateway
     "The security token included in the request is invalid.", []),
    ("openai_chat", 401, _openai_style("Invalid API Key"), "Invalid API Key", []),  # Groq
    ("openai_chat", 401, {"error": {"message": "No auth credentials found", "code": 401}},  # OpenRouter
     "No auth credentials found", []),
    ("openai_chat", 401, _openai_style("Authentication Fails, Your api key: ****6eA3 is invalid",
                                       "invalid_request_error"),  # DeepSeek
     "Authentication Fails, Your api key: [redacted] is invalid", ["6eA3"]),
    ("openai_chat", 401, _openai_style("Invalid API key provided. You can find your API key at "
                                       "https://api.together.xyz/settings/api-keys."),  # Together
     "Invalid API key provided. You can find your API key at https://api.together.xyz/settings/api-keys.", []),
    ("openai_chat", 401, _openai_style("Incorrect API key provided: xa***Qz. You can obtain an API key from "
                                       "https://console.x.ai."),  # xAI (OpenAI-shaped body)
     "Incorrect API key provided: [redacted]. You can obtain an API key from https://console.x.ai.", ["Qz"]),
]
"""(provider API, HTTP status, error body, the message readers get after ``provider answered HTTP <status>: ``,
fragments of the key that must not reach them)."""


@pytest.mark.parametrize(("provider", "status", "body", "shown", "gone"), CASES)
def test_a_providers_auth_error_reaches_readers_without_any_key_fragment(
        provider: str, status: int, body: object, shown: str, gone: list[str]) -> None:
    error = http_error(provider, status, {}, msgspec.json.encode(body))
    pipeline = build_pipeline(provider=provider, stream_id="st_auth", model="m", clock=lambda: 1)
    events = [*pipeline.adapter.start(), *pipeline.adapter.fail(error)]
    terminal = events[-1]
    assert isinstance(terminal, StreamError)
    assert terminal.error.category in ("authentication", "permission", "invalid_request")
    assert terminal.error.message == f"provider answered HTTP {status}: {shown}"
    for fragment in gone:
        assert fragment not in terminal.error.message
