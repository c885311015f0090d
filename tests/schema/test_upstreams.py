"""The upstreams file: the issue's example parses; each mistake names the file, the table and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from schema.settings import SettingsError
from schema.upstreams import Endpoint, default_upstreams, targets
from schema.upstreams_file import load_upstreams, parse_upstreams

EXAMPLE = """
[endpoints.openai]
api = "openai_chat"
url = "https://api.openai.com/v1"
auth = "bearer"
secret_env = "OPENAI_API_KEY"

[endpoints.vllm]
api = "openai_chat"
url = "http://vllm.internal:8000/v1"
auth = "none"

[endpoints.azure-east]
api = ["openai_chat", "openai_responses"]
platform = "azure"
url = "https://myres.openai.azure.com/openai/v1"
auth = "api-key"
secret_file = "/run/secrets/azure-key"

[endpoints.vertex-claude]
api = "anthropic"
platform = "vertex"
url = "https://us-east5-aiplatform.googleapis.com/v1/projects/my-proj/locations/us-east5"
auth = "google"

[endpoints.bedrock]
api = ["anthropic", "bedrock_converse"]
platform = "bedrock"
url = "https://bedrock-runtime.us-east-1.amazonaws.com"
auth = "aws"

[models."gpt-4o"]
endpoints = ["azure-east", "openai"]
upstream_model = { azure-east = "gpt4o-prod" }
"""


def parse(text: str) -> object:
    return parse_upstreams(text, "/etc/fanout/upstreams.toml")


def test_issue_example_parses_in_file_order() -> None:
    upstreams = parse_upstreams(EXAMPLE, "u.toml")
    assert list(upstreams.endpoints) == ["openai", "vllm", "azure-east", "vertex-claude", "bedrock"]
    assert upstreams.endpoints["azure-east"].apis == ("openai_chat", "openai_responses")
    assert upstreams.endpoints["bedrock"].region == "us-east-1"  # taken from the runtime host
    route = upstreams.models["gpt-4o"]
    assert [route.model_for(name) for name in route.endpoints] == ["gpt4o-prod", "gpt-4o"]


def test_targets_of_a_route_are_in_order_with_their_upstream_models() -> None:
    upstreams = parse_upstreams(EXAMPLE, "u.toml")
    found = targets(upstreams, "openai_chat", "gpt-4o")
    assert [(t.endpoint.name, t.model) for t in found] == [("azure-east", "gpt4o-prod"), ("openai", "gpt-4o")]


def test_a_named_endpoint_gets_the_model_as_is() -> None:
    found = targets(parse_upstreams(EXAMPLE, "u.toml"), "openai_chat", "meta-llama/Llama-3-8B", "vllm")
    assert [(t.endpoint.name, t.model) for t in found] == [("vllm", "meta-llama/Llama-3-8B")]


def test_a_provider_the_endpoint_does_not_speak_names_both() -> None:
    with pytest.raises(LookupError, match=r"provider 'gemini' is not spoken by endpoint 'vllm'.*openai_chat"):
        targets(parse_upstreams(EXAMPLE, "u.toml"), "gemini", "m", "vllm")


def test_a_provider_the_route_does_not_speak_names_route_and_endpoint() -> None:
    with pytest.raises(LookupError, match="route 'gpt-4o': it goes to endpoint 'azure-east'"):
        targets(parse_upstreams(EXAMPLE, "u.toml"), "anthropic", "gpt-4o")
    with pytest.raises(LookupError, match="route 'gpt-4o': it goes to endpoint 'openai', which speaks openai_chat"):
        targets(parse_upstreams(EXAMPLE, "u.toml"), "openai_responses", "gpt-4o")


def test_with_a_file_a_job_must_name_a_route_or_an_endpoint() -> None:
    with pytest.raises(LookupError, match=r"'other' is not a route.*endpoints: openai, vllm"):
        targets(parse_upstreams(EXAMPLE, "u.toml"), "openai_chat", "other")


def test_an_unknown_endpoint_is_refused_with_the_known_ones() -> None:
    with pytest.raises(LookupError, match="unknown endpoint 'nope'; endpoints: openai"):
        targets(parse_upstreams(EXAMPLE, "u.toml"), "openai_chat", "m", "nope")


def test_without_a_file_todays_variables_make_the_endpoints() -> None:
    upstreams = load_upstreams({"FANOUT_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                                "FANOUT_GEMINI_FRAMING": "json_array"})
    assert upstreams.source == ""
    openai = upstreams.endpoints["openai"]
    assert (openai.url, openai.auth, openai.secret_env) == ("http://127.0.0.1:9/v1", "bearer", "OPENAI_API_KEY")
    assert upstreams.endpoints["gemini"].framing == "json_array"
    assert [t.endpoint.name for t in targets(upstreams, "openai_responses", "gpt-5")] == ["openai"]
    assert [t.endpoint.name for t in targets(upstreams, "anthropic", "claude")] == ["anthropic"]


def test_without_a_file_bedrock_converse_has_no_endpoint() -> None:
    with pytest.raises(LookupError, match=r"no endpoint serves provider 'bedrock_converse' without an upstreams file"):
        targets(default_upstreams({}), "bedrock_converse", "anthropic.claude")


def test_load_reads_the_named_file(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(EXAMPLE)
    upstreams = load_upstreams({"FANOUT_UPSTREAMS_FILE": str(path)})
    assert upstreams.source == str(path)
    assert "gpt-4o" in upstreams.models


def test_a_missing_file_names_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    with pytest.raises(SettingsError, match=f"FANOUT_UPSTREAMS_FILE='{missing}': cannot read it: No such file"):
        load_upstreams({"FANOUT_UPSTREAMS_FILE": str(missing)})


MISTAKES = [
    ("[endpoints.a\n", "not valid TOML"),
    ('[endpoint.a]\napi = "openai_chat"\n', "[endpoint]: unknown table"),
    ("x = 1\n", "[x]: unknown table"),
    ("", "[endpoints]: no endpoint"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "http://h/v1"\nauth = "none"\nurll = "x"\n',
     "[endpoints.a] key 'urll': unknown key"),
    ('[endpoints.a]\napi = "openai_chat"\nauth = "none"\n', "[endpoints.a] key 'url': missing required key"),
    ('[endpoints.a]\napi = "openai_chats"\nurl = "http://h/v1"\nauth = "none"\n',
     "[endpoints.a] key 'api': must be one of openai_chat, openai_responses, anthropic, gemini, bedrock_converse"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "http://h/v1"\nauth = "apikey"\n',
     "[endpoints.a] key 'auth': must be one of bearer, api-key"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = 5\nauth = "none"\n', "[endpoints.a] key 'url': expected a string"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "ftp://h/v1"\nauth = "none"\n',
     "[endpoints.a] key 'url': expected an http(s) URL with a host"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://u:pw@h/v1"\nauth = "none"\n',
     "[endpoints.a] key 'url': must not hold a user or password"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1?api-version=1"\nauth = "none"\n',
     "[endpoints.a] key 'url': must not have a query"),
    ('[endpoints.a]\napi = "gemini"\nplatform = "azure"\nurl = "https://h"\nauth = "api-key"\nsecret_env = "K"\n',
     "[endpoints.a] key 'api': platform 'azure' does not serve gemini"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "bearer"\n',
     "[endpoints.a] key 'auth': auth 'bearer' needs secret_env"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "bearer"\nsecret_env = "sk-live-1234"\n',
     "[endpoints.a] key 'secret_env': must name an environment variable"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "bearer"\nsecret_env = "K"\n'
     'secret_file = "/k"\n', "[endpoints.a] key 'secret_file': give secret_env or secret_file, not both"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\nsecret_env = "K"\n',
     "[endpoints.a] key 'secret_env': auth 'none' takes no secret"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "aws"\n',
     "[endpoints.a] key 'auth': auth 'aws' signs Bedrock requests"),
    ('[endpoints.a]\napi = "anthropic"\nplatform = "bedrock"\nurl = "https://proxy.internal"\nauth = "aws"\n',
     "[endpoints.a] key 'region': required"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\nframing = "json_array"\n',
     "[endpoints.a] key 'framing': only a Gemini endpoint"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\nbackground = true\n',
     "[endpoints.a] key 'background': only an endpoint whose api is exactly \"openai_responses\" or"),
    ('[endpoints.a]\napi = ["openai_chat", "openai_responses"]\nurl = "https://h/v1"\nauth = "none"\n'
     'background = true\n', "[endpoints.a] key 'background': only an endpoint whose api"),
    ('[endpoints.a]\napi = "openai_responses"\nurl = "https://h/v1"\nauth = "none"\nbackground = "yes"\n',
     "[endpoints.a] key 'background': Expected `bool`"),
    ('[endpoints."a b"]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n',
     '[endpoints."a b"]: an endpoint name is 1 to 64'),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n[models."m"]\nendpoints = ["b"]\n',
     "[models.\"m\"] key 'endpoints': unknown endpoint 'b'; endpoints: a"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n[models."m"]\nendpoints = []\n',
     "[models.\"m\"] key 'endpoints': give one or more distinct endpoint names"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n[models."m"]\n',
     "[models.\"m\"] key 'endpoints': missing required key"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n'
     '[endpoints.b]\napi = "anthropic"\nurl = "https://h"\nauth = "none"\n[models."m"]\nendpoints = ["a", "b"]\n',
     "[models.\"m\"] key 'endpoints': the endpoints share no API (a: openai_chat, b: anthropic)"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n[models."m"]\nendpoints = ["a"]\n'
     'upstream_model = { c = "x" }\n', "[models.\"m\"] key 'upstream_model': 'c' is not one of this route's"),
    ('[endpoints.a]\napi = "openai_chat"\nurl = "https://h/v1"\nauth = "none"\n[models."m"]\nendpoints = ["a"]\n'
     'weight = 2\n', "[models.\"m\"] key 'weight': unknown key"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES, ids=[m for _, m in MISTAKES])
def test_a_mistake_names_the_file_the_table_and_the_key(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse(text)
    assert str(caught.value).startswith("bad upstreams file /etc/fanout/upstreams.toml: ")
    assert message in str(caught.value)


def test_an_endpoint_repr_holds_the_variable_name_not_a_secret() -> None:
    endpoint = Endpoint(name="a", api=["openai_chat"], url="https://h/v1", auth="bearer", secret_env="OPENAI_API_KEY")
    assert "OPENAI_API_KEY" in repr(endpoint)


def test_background_is_off_by_default_and_on_for_a_responses_endpoint() -> None:
    on = parse('[endpoints.a]\napi = "openai_responses"\nplatform = "azure"\nurl = "https://h/openai/v1"\n'
               'auth = "api-key"\nsecret_env = "K"\nbackground = true\n')
    off = parse('[endpoints.a]\napi = "openai_responses"\nurl = "https://h/v1"\nauth = "none"\n')
    assert on.endpoints["a"].background is True
    assert off.endpoints["a"].background is False


def test_the_docs_example_parses() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "upstreams.md").read_text()
    example = page.split("```toml\n", 1)[1].split("```", 1)[0]
    upstreams = parse_upstreams(example, "docs/upstreams.md")
    assert set(upstreams.endpoints) == {"openai", "vllm", "azure-east", "anthropic", "gemini", "vertex-gemini",
                                        "vertex-claude", "bedrock"}
    assert [t.model for t in targets(upstreams, "openai_chat", "gpt-4o")] == ["gpt4o-prod", "gpt-4o"]


def test_background_is_accepted_for_a_gemini_interactions_endpoint() -> None:
    on = parse('[endpoints.g]\napi = "gemini_interactions"\nurl = "https://h"\nauth = "none"\nbackground = true\n')
    assert on.endpoints["g"].background is True
