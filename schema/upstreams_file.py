"""Reading and checking the upstreams file (``FANOUT_UPSTREAMS_FILE``) into :class:`schema.upstreams.Upstreams`.

:func:`parse_upstreams` is pure (it takes the text); :func:`load_upstreams` reads the file the
environment names, or returns the endpoints today's variables describe when none is named.
Every mistake is one :class:`~schema.settings.SettingsError` naming the file, the table and
the key: not TOML, an unknown table or key, a value of the wrong type or outside its
choices, an API the platform does not serve, a secret reference missing or not allowed, a
URL with a credential or a query, a route naming an unknown endpoint or endpoints that
share no API.

Must not import :mod:`infra`, :mod:`worker`, :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any, TypeVar, get_args
from urllib.parse import urlsplit

import msgspec

from schema.contract import PROVIDERS
from schema.settings import SettingsError
from schema.upstreams import (
    BEDROCK_HOST,
    KEY_AUTHS,
    MAX_MODEL_CHARS,
    NAME_PATTERN,
    PLATFORM_APIS,
    VARIABLE_PATTERN,
    Endpoint,
    Route,
    Upstreams,
    default_upstreams,
)

S = TypeVar("S", bound=msgspec.Struct)


def parse_upstreams(text: str, source: str) -> Upstreams:
    """Parse and check an upstreams file's text.

    Args:
        text: The TOML document.
        source: The file's path, named in every error.

    Returns:
        The endpoints and routes, in the file's order.

    Raises:
        SettingsError: Not TOML, an unknown table or key, a value of the wrong type or
            outside its choices, an API the platform does not serve, a secret reference
            that is missing or not allowed, a route naming an unknown endpoint. The message
            names ``source``, the table and the key; the process exits 2.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"bad upstreams file {source}: not valid TOML: {exc}") from exc
    except RecursionError as exc:  # tomllib parses nested arrays and inline tables recursively
        raise SettingsError(f"bad upstreams file {source}: arrays or inline tables nested too deeply") from exc
    for key in document:
        if key not in ("endpoints", "models"):
            raise _error(source, key, "", "unknown table; expected [endpoints.<name>] and [models.\"<model>\"]")
    endpoints = {name: _endpoint(source, name, table) for name, table in _tables(source, document, "endpoints")}
    if not endpoints:
        raise _error(source, "endpoints", "", "no endpoint: add at least one [endpoints.<name>] table")
    models = {name: _route(source, name, table, endpoints) for name, table in _tables(source, document, "models")}
    return Upstreams(endpoints=endpoints, models=models, source=source)


def load_upstreams(environ: Mapping[str, str]) -> Upstreams:
    """Return the upstreams of this process: the file named by ``FANOUT_UPSTREAMS_FILE``, else today's variables.

    Raises:
        SettingsError: The file cannot be read or has a mistake (:func:`parse_upstreams`).
    """
    path = environ.get("FANOUT_UPSTREAMS_FILE", "")
    if not path:
        return default_upstreams(environ)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise SettingsError(f"bad configuration: FANOUT_UPSTREAMS_FILE={path!r}: cannot read it: "
                            f"{exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(f"bad upstreams file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return parse_upstreams(text, path)


def _error(source: str, table: str, key: str, problem: str) -> SettingsError:
    where = f"[{table}]" + (f" key {key!r}" if key else "")
    return SettingsError(f"bad upstreams file {source}: {where}: {problem}")


def _table_name(kind: str, name: str) -> str:
    return f"{kind}.{name}" if NAME_PATTERN.fullmatch(name) and kind == "endpoints" else f'{kind}."{name}"'


def _tables(source: str, document: dict[str, Any], kind: str) -> list[tuple[str, dict[str, Any]]]:
    section = document.get(kind, {})
    if not isinstance(section, dict):
        raise _error(source, kind, "", f"must be tables: [{kind}.<name>]")
    found = []
    for name, table in section.items():
        if not isinstance(table, dict):
            raise _error(source, kind, name, f"must be a table: [{_table_name(kind, name)}]")
        found.append((name, table))
    return found


def _convert(source: str, table: str, raw: dict[str, Any], cls: type[S]) -> S:
    """Convert one table, naming the key msgspec refused."""
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        detail, _, path = str(exc).rpartition(" - at `$")
        detail = detail or str(exc)
        key = path.rstrip("`").lstrip(".").split("[", 1)[0].split(".", 1)[0]
        named = re.fullmatch(r"Object (contains unknown|missing required) field `(.+)`", detail)
        if named:
            return_key = named[2]
            problem = "unknown key" if named[1] == "contains unknown" else "missing required key"
        else:
            return_key, problem = key, _plain(cls, key, detail)
        raise _error(source, table, return_key, problem) from exc


def _plain(cls: type[msgspec.Struct], key: str, detail: str) -> str:
    hint = msgspec.structs.fields(cls)
    for field in hint:
        if field.name == key:
            choices = [str(v) for arg in (field.type, *get_args(field.type)) for v in get_args(arg)
                       if isinstance(v, str)]
            if choices and ("enum" in detail or "Expected `str`" in detail):
                return f"must be one of {', '.join(choices)}"
    return detail.replace("Expected `str`", "expected a string").replace("Expected `array`", "expected a list")


def _endpoint(source: str, name: str, raw: dict[str, Any]) -> Endpoint:
    table = _table_name("endpoints", name)
    if not NAME_PATTERN.fullmatch(name):
        raise _error(source, table, "", "an endpoint name is 1 to 64 letters, digits, '_', '.', '-'")
    if "name" in raw:
        raise _error(source, table, "name", "unknown key (the table's name is the endpoint's name)")
    if isinstance(raw.get("api"), str):
        raw = {**raw, "api": [raw["api"]]}
    endpoint = _convert(source, table, {**raw, "name": name}, Endpoint)
    problem = _endpoint_problem(endpoint)
    if problem is not None:
        raise _error(source, table, *problem)
    if endpoint.platform == "bedrock" and not endpoint.region:
        endpoint = msgspec.structs.replace(endpoint, region=_bedrock_region(source, table, endpoint.url))
    return endpoint


def _endpoint_problem(endpoint: Endpoint) -> tuple[str, str] | None:
    """Return ``(key, problem)`` for the first thing wrong with ``endpoint``, else ``None``."""
    if not endpoint.api or len(set(endpoint.api)) != len(endpoint.api):
        return "api", f"give one or more distinct APIs of {', '.join(PROVIDERS)}"
    served = PLATFORM_APIS[endpoint.platform]
    wrong = [api for api in endpoint.api if api not in served]
    if wrong:
        return "api", f"platform {endpoint.platform!r} does not serve {', '.join(wrong)}; it serves " \
                      f"{', '.join(sorted(served))}"
    url_problem = endpoint_url_problem(endpoint.url)
    if url_problem:
        return "url", url_problem
    return _auth_problem(endpoint)


def _auth_problem(endpoint: Endpoint) -> tuple[str, str] | None:
    secrets = [key for key in ("secret_env", "secret_file") if getattr(endpoint, key)]
    if len(secrets) > 1:
        return "secret_file", "give secret_env or secret_file, not both"
    if endpoint.secret_env and not VARIABLE_PATTERN.fullmatch(endpoint.secret_env):
        return "secret_env", "must name an environment variable (letters, digits, '_'), never hold the secret"
    if endpoint.auth in KEY_AUTHS and not secrets:
        return "auth", f"auth {endpoint.auth!r} needs secret_env (a variable's name) or secret_file (a path)"
    if endpoint.auth in ("none", "google") and secrets:
        return secrets[0], f"auth {endpoint.auth!r} takes no secret"
    if endpoint.auth == "aws" and endpoint.platform != "bedrock":
        return "auth", "auth 'aws' signs Bedrock requests: it needs platform = \"bedrock\""
    if endpoint.platform == "bedrock" and endpoint.auth not in ("aws", "bearer"):
        return "auth", "a Bedrock endpoint takes auth 'aws' (SigV4 or a Bedrock API key) or 'bearer'"
    if endpoint.framing != "sse" and "gemini" not in endpoint.api:
        return "framing", "only a Gemini endpoint reads the JSON-array framing"
    if endpoint.background and endpoint.api not in (["openai_responses"], ["gemini_interactions"]):
        return "background", ("only an endpoint whose api is exactly \"openai_responses\" or \"gemini_interactions\" "
                              "runs in background mode")
    return None


def _bedrock_region(source: str, table: str, url: str) -> str:
    match = BEDROCK_HOST.fullmatch(urlsplit(url).hostname or "")
    if match is None:
        raise _error(source, table, "region", "required: the url's host is not bedrock-runtime.<region>.amazonaws.com")
    return match[1]


def _route(source: str, name: str, raw: dict[str, Any], endpoints: Mapping[str, Endpoint]) -> Route:
    table = _table_name("models", name)
    if not 1 <= len(name) <= MAX_MODEL_CHARS or not name.isprintable() or name != name.strip():
        raise _error(source, table, "", f"a model name is 1 to {MAX_MODEL_CHARS} printable characters")
    if "name" in raw:
        raise _error(source, table, "name", "unknown key (the table's name is the public model name)")
    route = _convert(source, table, {**raw, "name": name}, Route)
    if not route.endpoints or len(set(route.endpoints)) != len(route.endpoints):
        raise _error(source, table, "endpoints", "give one or more distinct endpoint names")
    unknown = [one for one in route.endpoints if one not in endpoints]
    if unknown:
        raise _error(source, table, "endpoints", f"unknown endpoint {unknown[0]!r}; endpoints: {', '.join(endpoints)}")
    shared = set.intersection(*(set(endpoints[one].apis) for one in route.endpoints))
    if not shared:
        spoken = ", ".join(f"{one}: {'/'.join(endpoints[one].apis)}" for one in route.endpoints)
        raise _error(source, table, "endpoints", f"the endpoints share no API ({spoken}); a route's endpoints "
                                                 "must all speak the job's API")
    stray = [one for one in route.upstream_model if one not in route.endpoints]
    if stray:
        raise _error(source, table, "upstream_model", f"{stray[0]!r} is not one of this route's endpoints")
    if any(not model or model != model.strip() for model in route.upstream_model.values()):
        raise _error(source, table, "upstream_model",
                     "each model name is a non-empty string without surrounding spaces")
    return route


def base_url_problem(url: str) -> str | None:
    """Return why ``url`` cannot be a provider API root, or ``None`` when it can.

    Accepted: an ``http`` or ``https`` URL with a host (and a valid port when given), no
    whitespace; a path is kept (``/v1``). Checked at start, so a typo is an exit 2, not
    every job ending ``interrupted``/``transport`` after its retries.
    """
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:  # a bad port or IPv6 literal
        return f"expected an http(s) URL with a host ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        return "expected an http(s) URL with a host"
    return None if port_ok else "expected an http(s) URL with a host (port 0)"


def endpoint_url_problem(url: str) -> str | None:
    """Return why ``url`` cannot be an endpoint's ``url``, or ``None`` when it can.

    :func:`base_url_problem`, plus: no user info (a credential in a URL reaches logs) and
    no query or fragment (each request's path is appended to it).
    """
    problem = base_url_problem(url)
    if problem:
        return problem
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "must not hold a user or password; put the secret in secret_env or secret_file"
    if parts.query or parts.fragment:
        return "must not have a query or fragment: the request path is appended to it"
    return None
