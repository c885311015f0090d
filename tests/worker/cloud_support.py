"""The fake cloud on a real port, a service account whose token_uri points at it, and AWS test credentials."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tools.fake_cloud import CLOUD, CloudConfig, CloudState, make_cloud_app

AZURE_KEY = "azure-key-0123456789abcdef"
BEDROCK_API_KEY = "ABSKbedrock-api-key-0123456789"
AWS_ACCESS_KEY_ID = "AKIAFAKECLOUD0000001"
AWS_SECRET_ACCESS_KEY = "fake-cloud-aws-secret-access-key-0123456789"
OPENAI_KEY = "sk-openai-cloud-test-0123456789"
SECRETS = (AZURE_KEY, BEDROCK_API_KEY, AWS_SECRET_ACCESS_KEY, OPENAI_KEY)
"""Every secret a cloud test hands the worker; none may reach Redis, a log or an error."""


def new_key() -> rsa.RSAPrivateKey:
    """A fresh RSA key for the test service account."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def write_service_account(path: Path, key: rsa.RSAPrivateKey, token_uri: str) -> Path:
    """Write a service-account JSON (the shape ``gcloud iam service-accounts keys create`` writes)."""
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "fake-project", "private_key_id": "k1", "private_key": private,
        "client_email": "fanout-test@fake-project.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": token_uri,
    }))
    return path


@contextlib.asynccontextmanager
async def fake_cloud(config: CloudConfig) -> AsyncIterator[tuple[str, CloudState]]:
    """Serve :func:`tools.fake_cloud.make_cloud_app` on 127.0.0.1:0; yield (base URL, its state)."""
    app = make_cloud_app(config)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    app[CLOUD].base_url = f"http://{host}:{port}"
    try:
        yield app[CLOUD].base_url, app[CLOUD]
    finally:
        await runner.cleanup()
