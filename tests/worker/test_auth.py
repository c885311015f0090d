"""Cloud credentials that cannot be found end the attempt with ``authentication``, naming the endpoint only."""

from __future__ import annotations

from pathlib import Path

import pytest

from schema.upstreams import Endpoint
from worker.auth import Authorizer, CredentialError
from worker.platforms import plan_request
from worker.secrets import Secrets

BEDROCK = Endpoint(name="bedrock", api=["anthropic"], platform="bedrock", auth="aws", region="us-east-1",
                   url="https://bedrock-runtime.us-east-1.amazonaws.com")
VERTEX = Endpoint(name="vertex", api=["gemini"], platform="vertex", auth="google",
                  url="https://aiplatform.googleapis.com/v1/projects/p/locations/global")


@pytest.fixture
def no_cloud_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment where botocore's and google-auth's chains find nothing, quickly."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # the discard port: refused at once
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")


@pytest.mark.usefixtures("no_cloud_credentials")
async def test_no_aws_credentials_is_authentication_naming_the_endpoint() -> None:
    plan = plan_request(BEDROCK, "anthropic", "anthropic.claude", {"messages": []})
    with pytest.raises(CredentialError, match=r"endpoint 'bedrock': no AWS credentials") as caught:
        await Authorizer(Secrets({})).headers(BEDROCK, plan)
    assert (caught.value.category, caught.value.retryable) == ("authentication", False)


@pytest.mark.usefixtures("no_cloud_credentials")
async def test_no_google_credentials_is_authentication_naming_the_endpoint() -> None:
    plan = plan_request(VERTEX, "gemini", "gemini-2.5-flash", {"contents": []})
    with pytest.raises(CredentialError, match=r"endpoint 'vertex': no Google Application Default Credentials") as c:
        await Authorizer(Secrets({})).headers(VERTEX, plan)
    assert (c.value.category, c.value.retryable) == ("authentication", False)


async def test_sigv4_signs_with_the_endpoints_region_and_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-value")
    plan = plan_request(BEDROCK, "anthropic", "anthropic.claude", {"messages": []})
    headers = await Authorizer(Secrets({})).headers(BEDROCK, plan)
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/bedrock/aws4_request, SignedHeaders=" in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == "session-token-value"
    assert "wJalrXUtnFEMI" not in str(headers)
