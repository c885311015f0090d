"""Endpoint secrets: read from the named variable or file, re-read when the file changes, never shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schema.settings import SettingsError
from schema.upstreams import Endpoint
from schema.upstreams_file import parse_upstreams
from worker.auth import Authorizer, CredentialError
from worker.platforms import Plan
from worker.secrets import Secrets, check_secrets

PLAN = Plan(url="https://h/v1/chat/completions", body=b"{}", framing="sse", headers={})


def endpoint(**fields: str) -> Endpoint:
    return Endpoint(name="e", api=["openai_chat"], url="https://h/v1", auth="bearer", **fields)  # type: ignore[arg-type]


def test_a_rotated_secret_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("first-key\n")
    secrets, one = Secrets({}), endpoint(secret_file=str(path))
    assert secrets.secret(one) == "first-key"
    path.write_text("second-key-longer\n")
    os.utime(path, ns=(1, 2))  # a new mtime even within the clock's resolution
    assert secrets.secret(one) == "second-key-longer"


async def test_each_key_auth_puts_the_secret_in_its_header() -> None:
    authorizer = Authorizer(Secrets({"K": "s3cret"}))
    expected = {"bearer": {"Authorization": "Bearer s3cret"}, "api-key": {"api-key": "s3cret"},
                "x-api-key": {"x-api-key": "s3cret"}, "x-goog-api-key": {"x-goog-api-key": "s3cret"}}
    for auth, headers in expected.items():
        one = Endpoint(name="e", api=["openai_chat"], url="https://h/v1", auth=auth, secret_env="K")  # type: ignore[arg-type]
        assert await authorizer.headers(one, PLAN) == headers
    assert "s3cret" not in repr(authorizer) + repr(authorizer.secrets)


async def test_an_unreadable_secret_file_fails_naming_the_endpoint_not_the_value(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match=r"endpoint 'e': cannot read its secret_file \(No such file") as caught:
        await Authorizer(Secrets({})).headers(endpoint(secret_file=str(tmp_path / "gone")), PLAN)
    assert (caught.value.category, caught.value.retryable) == ("authentication", False)


def test_the_start_check_names_the_unset_variable() -> None:
    upstreams = parse_upstreams('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "bearer"\n'
                                'secret_env = "A_KEY"\n', "u.toml")
    with pytest.raises(SettingsError, match=r"\[endpoints.a\] key 'secret_env': variable A_KEY is empty or unset"):
        check_secrets(upstreams, Secrets({}))
    check_secrets(upstreams, Secrets({"A_KEY": "x"}))  # set: no error


async def test_aws_auth_sends_a_bedrock_api_key_from_the_environment_as_bearer() -> None:
    bedrock = Endpoint(name="b", api=["anthropic"], platform="bedrock", url="https://bedrock-runtime.us-east-1.amazonaws.com",
                       auth="aws", region="us-east-1")
    authorizer = Authorizer(Secrets({"AWS_BEARER_TOKEN_BEDROCK": "ABSK-key"}))
    assert await authorizer.headers(bedrock, PLAN) == {"Authorization": "Bearer ABSK-key"}


def test_the_start_check_covers_a_bedrock_api_key_an_aws_endpoint_names() -> None:
    upstreams = parse_upstreams('[endpoints.b]\napi = "anthropic"\nplatform = "bedrock"\nauth = "aws"\n'
                                'url = "https://bedrock-runtime.us-east-1.amazonaws.com"\nsecret_env = "BR_KEY"\n',
                                "u.toml")
    with pytest.raises(SettingsError, match=r"\[endpoints.b\] key 'secret_env': variable BR_KEY is empty or unset"):
        check_secrets(upstreams, Secrets({}))
