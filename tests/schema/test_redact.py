"""The one redaction of reader-visible text: key-shaped strings out, the sentence kept.

The texts are the providers' own 401/400/403 messages as their APIs word them (key
material here is made up, in the shape each provider shows it, masked or not).
"""

from __future__ import annotations

import pytest

from schema.redact import REDACTED, redact

OPENAI_URL = "You can find your API key at https://platform.openai.com/account/api-keys."
CASES = [
    (f"Incorrect API key provided: sk-proj-{'*' * 148}Ab3x. {OPENAI_URL}",
     f"Incorrect API key provided: {REDACTED}. {OPENAI_URL}", ["Ab3x", "sk-proj"]),
    (f"Incorrect API key provided: sk-PMafP{'*' * 39}E873. {OPENAI_URL}",
     f"Incorrect API key provided: {REDACTED}. {OPENAI_URL}", ["PMafP", "E873"]),
    (f"Incorrect API key provided: https://{'*' * 80}lETQ. {OPENAI_URL}",
     f"Incorrect API key provided: {REDACTED}. {OPENAI_URL}", ["lETQ"]),
    ("Incorrect API key provided: sk-...abcd.", f"Incorrect API key provided: {REDACTED}.", ["abcd"]),
    ("Incorrect API key provided: sk-ant-api03-Zx8Qw7Er6Ty5Ui4Op3As2Df1Gh0JkLzXcVbNm-AAAAAAA. (wrong provider)",
     f"Incorrect API key provided: {REDACTED}. (wrong provider)", ["api03", "Zx8Qw7"]),
    ("Incorrect API key provided: gs***tF. You can obtain an API key from https://console.x.ai.",
     f"Incorrect API key provided: {REDACTED}. You can obtain an API key from https://console.x.ai.", ["tF"]),
    ("Authentication Fails, Your api key: ****6eA3 is invalid",
     f"Authentication Fails, Your api key: {REDACTED} is invalid", ["6eA3"]),
    ("Authentication Fails, Your api key: ****Njk= is invalid",
     f"Authentication Fails, Your api key: {REDACTED} is invalid", ["Njk="]),
    (f"key {'*' * 20}Ab3x was revoked", f"key {REDACTED} was revoked", ["Ab3x"]),
    ("the API key ending in 'Q9zK' was revoked", f"the API key ending in '{REDACTED}' was revoked", ["Q9zK"]),
    ("Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/bedrock/aws4_request is not valid",
     f"Credential={REDACTED} is not valid", ["AKIAIOSFODNN7EXAMPLE"]),
    ("temporary key ASIAY34FZKBOKMUTVV7A expired", f"temporary key {REDACTED} expired", ["ASIAY34FZKBOKMUTVV7A"]),
    ("GET /v1beta/models?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW&alt=sse failed",
     f"GET /v1beta/models?key={REDACTED}&alt=sse failed", ["AIzaSy"]),
    ("key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW is not allowed", f"key {REDACTED} is not allowed", ["AIzaSy"]),
    ("sent Authorization: Bearer gsk_Q2w3E4r5T6y7U8i9O0pAsDfGhJkL upstream",
     f"sent Authorization: Bearer {REDACTED} upstream", ["gsk_", "Q2w3"]),
    ("session eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl is invalid",
     f"session {REDACTED} is invalid", ["eyJ"]),
    ("secret 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0 leaked",
     f"secret {REDACTED} leaked", ["3f2a9c1e"]),
    ("aws secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY in the log", f"aws secret {REDACTED} in the log",
     ["wJalrXUtnFEMI"]),
]
"""(text, redacted, fragments that must be gone)."""

UNTOUCHED = [
    "invalid x-api-key",  # Anthropic
    "API key not valid. Please pass a valid API key.",  # Gemini
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an "
    "active subscription and use a correct regional API endpoint for your resource.",  # Azure OpenAI
    "The security token included in the request is invalid.",  # Bedrock / AWS
    "Invalid API Key",  # Groq
    "No auth credentials found",  # OpenRouter
    "Invalid API key provided. You can find your API key at https://api.together.xyz/settings/api-keys.",  # Together
    "invalid token: The token has expired",
    "prompt is too long: 215439 tokens > 200000 maximum",
]
"""Provider sentences that hold no key: redaction leaves them as they are."""


@pytest.mark.parametrize(("text", "redacted", "gone"), CASES)
def test_a_key_quoted_by_a_provider_masked_or_not_is_removed_and_the_sentence_kept(
        text: str, redacted: str, gone: list[str]) -> None:
    assert redact(text) == redacted
    for fragment in gone:
        assert fragment not in redact(text)


@pytest.mark.parametrize("text", UNTOUCHED)
def test_a_provider_sentence_without_a_key_is_left_as_it_is(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [case[0] for case in CASES] + UNTOUCHED)
def test_redaction_is_idempotent(text: str) -> None:
    assert redact(redact(text)) == redact(text)
