"""The upstreams file's routing keys: an endpoint's max_concurrency and timeouts, a route's on_full."""

from __future__ import annotations

from pathlib import Path

import pytest

from schema.settings import SettingsError
from schema.upstreams_file import parse_upstreams

ENDPOINT = '[endpoints.a]\napi = "openai_chat"\nurl = "http://127.0.0.1:1/v1"\nauth = "none"\n'
ROUTE = '[models."m"]\nendpoints = ["a"]\n'


def test_the_fallback_docs_example_parses_with_its_routing_keys() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "fallback.md").read_text()
    example = page.split("```toml\n", 1)[1].split("```", 1)[0]
    upstreams = parse_upstreams(example, "docs/fallback.md")
    east = upstreams.endpoints["azure-east"]
    assert (east.max_concurrency, east.idle_timeout_s, east.progress_timeout_s, east.connect_timeout_s) == \
        (32, 20, 45, None)
    assert upstreams.endpoints["openai"].max_concurrency is None
    assert upstreams.models["gpt-4o"].on_full == "fallback"


def test_routing_keys_default_to_no_limit_and_fallback() -> None:
    upstreams = parse_upstreams(ENDPOINT + ROUTE, "u.toml")
    endpoint = upstreams.endpoints["a"]
    assert (endpoint.max_concurrency, endpoint.connect_timeout_s, endpoint.idle_timeout_s,
            endpoint.progress_timeout_s) == (None, None, None, None)
    assert upstreams.models["m"].on_full == "fallback"


def test_max_concurrency_of_one_is_the_smallest_accepted() -> None:
    assert parse_upstreams(ENDPOINT + "max_concurrency = 1\n", "u.toml").endpoints["a"].max_concurrency == 1
    with pytest.raises(SettingsError, match=r"u\.toml: \[endpoints\.a\] key 'max_concurrency'"):
        parse_upstreams(ENDPOINT + "max_concurrency = 0\n", "u.toml")


@pytest.mark.parametrize("key", ["connect_timeout_s", "idle_timeout_s", "progress_timeout_s"])
def test_an_endpoint_timeout_must_be_positive(key: str) -> None:
    assert getattr(parse_upstreams(ENDPOINT + f"{key} = 0.001\n", "u.toml").endpoints["a"], key) == 0.001
    with pytest.raises(SettingsError, match=rf"\[endpoints\.a\] key '{key}'"):
        parse_upstreams(ENDPOINT + f"{key} = 0\n", "u.toml")


def test_on_full_takes_wait_or_fallback_only() -> None:
    assert parse_upstreams(ENDPOINT + ROUTE + 'on_full = "wait"\n', "u.toml").models["m"].on_full == "wait"
    with pytest.raises(SettingsError, match=r"\[models\.\"m\"\] key 'on_full': must be one of fallback, wait"):
        parse_upstreams(ENDPOINT + ROUTE + 'on_full = "queue"\n', "u.toml")
