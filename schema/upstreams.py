"""The upstreams file (``FANOUT_UPSTREAMS_FILE``): named endpoints and the model routes over them.

A TOML file (read with the standard library's ``tomllib``) with two tables::

    [endpoints.<name>]   api, url, auth, platform, secret_env | secret_file, region, framing
    [models."<model>"]   endpoints = [<name>, ...], upstream_model = {<name> = "<model id>"}

Parsing is pure (:func:`parse_upstreams` takes the text); :func:`load_upstreams` reads the
file named by the environment, or builds the endpoints today's variables describe
(:func:`default_upstreams`) when none is named. Every mistake is one :class:`SettingsError`
naming the file, the table and the key (``fanout worker`` and ``fanout publisher`` exit 2
with it). Secrets are never in this module's values: an endpoint holds the *name* of the
variable or the *path* of the file that holds its secret (the worker reads it,
:mod:`worker.secrets`).

A TOML key of an endpoint is a field of :class:`Endpoint` (a new field with a default is a
new optional key). Wire facts: ``UPSTREAMS.md`` of the design notes (Azure v1 URLs, Vertex
publisher paths, Bedrock runtime hosts).

Must not import :mod:`infra`, :mod:`worker`, :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeVar, get_args
from urllib.parse import urlsplit

import msgspec

from schema.contract import PROVIDERS, Provider
from schema.settings import SettingsError

Platform = Literal["openai", "azure", "vertex", "bedrock"]
"""URL shape and body edits: ``openai`` is each API's own (native) shape."""
Auth = Literal["bearer", "api-key", "x-api-key", "x-goog-api-key", "google", "aws", "none"]
"""How a request proves who sends it (:mod:`worker.auth`)."""
KEY_AUTHS: Final = frozenset({"bearer", "api-key", "x-api-key", "x-goog-api-key"})
"""Auth kinds that send a secret read from ``secret_env`` or ``secret_file``."""
PLATFORM_APIS: Final[dict[str, frozenset[str]]] = {
    "openai": frozenset({"openai_chat", "openai_responses", "anthropic", "gemini"}),
    "azure": frozenset({"openai_chat", "openai_responses"}),
    "vertex": frozenset({"anthropic", "gemini"}),
    "bedrock": frozenset({"anthropic", "bedrock_converse"}),
}
"""The APIs each platform serves."""
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""An endpoint name: 1 to 64 letters, digits, ``_``, ``.``, ``-``; it is sent in job bodies."""
VARIABLE_PATTERN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable name (``secret_env`` names one; it never holds the secret)."""
BEDROCK_HOST: Final = re.compile(r"bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
"""A Bedrock runtime host, whose second label is the region."""
MAX_MODEL_CHARS: Final = 256
"""Longest route (public model) name, as for a job's ``model``."""

S = TypeVar("S", bound=msgspec.Struct)


class Endpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One upstream server and how to talk to it (a ``[endpoints.<name>]`` table)."""

    name: str = ""
    """The table's name (filled in from it; not a TOML key)."""
    api: list[Provider]
    """Provider APIs it speaks: one name or a list (``["openai_chat", "openai_responses"]``)."""
    url: str
    """API root, an http(s) URL with a host, no query, no user info (the path of each request is appended)."""
    auth: Auth
    """Credential kind: ``bearer``, ``api-key`` (Azure), ``x-api-key`` (Anthropic), ``x-goog-api-key``
    (Gemini), ``google`` (Application Default Credentials), ``aws`` (SigV4, or a Bedrock API key), ``none``."""
    platform: Platform = "openai"
    """``openai`` (each API's own URL shape), ``azure``, ``vertex`` or ``bedrock``."""
    secret_env: str = ""
    """Name of the variable that holds the secret (key auths; with ``aws`` a Bedrock API key)."""
    secret_file: str = ""
    """Path of a file that holds the secret (a mounted Kubernetes Secret); read again when it changes."""
    region: str = ""
    """AWS region of a Bedrock endpoint (SigV4 scope); taken from a ``bedrock-runtime.<region>`` host when absent."""
    framing: Literal["sse", "json_array"] = "sse"
    """Gemini only: ``sse`` asks for ``alt=sse``; ``json_array`` reads the streamed JSON array."""
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None
    """Attempts on this endpoint at once in one worker process, at most (absent: no limit); a job
    beyond it waits for a slot or falls back, as its route's ``on_full`` says."""
    connect_timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """This endpoint's connect timeout, seconds (absent: ``FANOUT_CONNECT_TIMEOUT_S``)."""
    idle_timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """This endpoint's idle timeout (no byte), seconds (absent: ``FANOUT_IDLE_TIMEOUT_S``)."""
    progress_timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """This endpoint's progress timeout (no contract event), seconds (absent: ``FANOUT_PROGRESS_TIMEOUT_S``)."""

    @property
    def apis(self) -> tuple[Provider, ...]:
        """The APIs it speaks, in the file's order."""
        return tuple(self.api)


class Route(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A public model name and the endpoints that serve it, in order (a ``[models."<model>"]`` table)."""

    name: str = ""
    """The public model name (the table's name; a job's ``model``)."""
    endpoints: list[str]
    """Endpoint names, tried in this order; at least one, no repeats, all speaking one API."""
    upstream_model: dict[str, str] = msgspec.field(default_factory=dict)
    """Endpoint name → model (or deployment) name sent to it; the route's name for the others."""
    on_full: Literal["fallback", "wait"] = "fallback"
    """When the endpoint a job would try next has no free slot (``max_concurrency``): take the next
    endpoint of the route with one (``fallback``), or wait for a slot (``wait``)."""

    def model_for(self, endpoint: str) -> str:
        """Return the model name sent to ``endpoint`` for this route."""
        return self.upstream_model.get(endpoint, self.name)


class Upstreams(msgspec.Struct, frozen=True, kw_only=True):
    """Every endpoint and route one process knows."""

    endpoints: dict[str, Endpoint]
    """Endpoint name → endpoint, in the file's order."""
    models: dict[str, Route] = msgspec.field(default_factory=dict)
    """Public model name → route."""
    source: str = ""
    """The file they were read from; empty when built from today's variables."""
    defaults: dict[str, str] = msgspec.field(default_factory=dict)
    """Provider API → endpoint of a job that names neither an endpoint nor a route (no file only)."""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint a job may be sent to, with the model name it gets there."""

    endpoint: Endpoint
    """Where to send it."""
    model: str
    """The model (or deployment) name sent upstream."""


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


def default_upstreams(environ: Mapping[str, str]) -> Upstreams:
    """Build the endpoints today's variables describe (no upstreams file).

    ``openai`` (both OpenAI APIs, ``FANOUT_OPENAI_BASE_URL``, bearer ``OPENAI_API_KEY``),
    ``anthropic`` (``FANOUT_ANTHROPIC_BASE_URL``, ``x-api-key`` ``ANTHROPIC_API_KEY``) and
    ``gemini`` (``FANOUT_GEMINI_BASE_URL``, ``x-goog-api-key`` ``GEMINI_API_KEY``,
    ``FANOUT_GEMINI_FRAMING``). The URLs are checked by the worker's settings.
    """
    def url(name: str, default: str) -> str:
        return environ.get(f"FANOUT_{name}_BASE_URL", "") or default

    framing: Literal["sse", "json_array"] = "json_array" if environ.get("FANOUT_GEMINI_FRAMING") == "json_array" \
        else "sse"
    # the variables' names, not secrets
    endpoints = {
        "openai": Endpoint(name="openai", api=["openai_chat", "openai_responses"], auth="bearer",
                           url=url("OPENAI", "https://api.openai.com/v1"), secret_env="OPENAI_API_KEY"),  # noqa: S106 - a name
        "anthropic": Endpoint(name="anthropic", api=["anthropic"], auth="x-api-key",
                              url=url("ANTHROPIC", "https://api.anthropic.com"), secret_env="ANTHROPIC_API_KEY"),  # noqa: S106 - a name
        "gemini": Endpoint(name="gemini", api=["gemini"], auth="x-goog-api-key", framing=framing,
                           url=url("GEMINI", "https://generativelanguage.googleapis.com"),
                           secret_env="GEMINI_API_KEY"),  # noqa: S106 - a name
    }
    defaults = {"openai_chat": "openai", "openai_responses": "openai", "anthropic": "anthropic", "gemini": "gemini"}
    return Upstreams(endpoints=endpoints, defaults=defaults)


def targets(upstreams: Upstreams, provider: str, model: str, endpoint: str = "") -> list[Target]:
    """Return where a job may go, in the order to try: its endpoint, its model's route, or the default.

    Args:
        upstreams: This process's upstreams.
        provider: The job's provider API.
        model: The job's model (a route's name, or sent as is).
        endpoint: The endpoint the job names, or empty.

    Returns:
        One target for a named endpoint or a default, one per route endpoint for a route.

    Raises:
        LookupError: The job names an unknown endpoint, an endpoint (or route) that does not
            speak ``provider``, or neither an endpoint nor a route where no default exists.
            The message names both sides and never a secret; the publisher answers 400, the
            worker ends the stream ``failed``/``invalid_request``.
    """
    if endpoint:
        found = upstreams.endpoints.get(endpoint)
        if found is None:
            raise LookupError(f"unknown endpoint {endpoint!r}; {_known(upstreams)}")
        _check_speaks(found, provider)
        return [Target(endpoint=found, model=model)]
    route = upstreams.models.get(model)
    if route is not None:
        chosen = [upstreams.endpoints[name] for name in route.endpoints]
        for one in chosen:
            _check_speaks(one, provider, route=route.name)
        return [Target(endpoint=one, model=route.model_for(one.name)) for one in chosen]
    default = upstreams.defaults.get(provider)
    if default is None:
        raise LookupError(f"model {model!r} is not a route of the upstreams file and the job names no endpoint; "
                          f"{_known(upstreams)}")
    return [Target(endpoint=upstreams.endpoints[default], model=model)]


def _check_speaks(endpoint: Endpoint, provider: str, *, route: str = "") -> None:
    if provider not in endpoint.apis:
        via = f"route {route!r} goes to endpoint {endpoint.name!r}, which" if route else \
            f"endpoint {endpoint.name!r}"
        raise LookupError(f"provider {provider!r} is not spoken by {via} speaks {', '.join(endpoint.apis)}")


def _known(upstreams: Upstreams) -> str:
    return (f"endpoints: {', '.join(upstreams.endpoints) or 'none'}; "
            f"routes: {', '.join(upstreams.models) or 'none'}")


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
