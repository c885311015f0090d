"""The upstreams file (``FANOUT_UPSTREAMS_FILE``): named endpoints and the model routes over them.

A TOML file (read with the standard library's ``tomllib``) with two tables::

    [endpoints.<name>]   api, url, auth, platform, secret_env | secret_file, region, framing
    [models."<model>"]   endpoints = [<name>, ...], upstream_model = {<name> = "<model id>"}

This module holds the Structs, the endpoints today's variables describe
(:func:`default_upstreams`) and where a job goes (:func:`targets`); reading and checking the
file is :mod:`schema.upstreams_file` (every mistake one ``SettingsError`` naming the file,
the table and the key; ``fanout worker`` and ``fanout publisher`` exit 2 with it). Secrets
are never in this module's values: an endpoint holds the *name* of the variable or the
*path* of the file that holds its secret (the worker reads it, :mod:`worker.secrets`).

A TOML key of an endpoint is a field of :class:`Endpoint` (a new field with a default is a
new optional key). Wire facts: ``UPSTREAMS.md`` of the design notes (Azure v1 URLs, Vertex
publisher paths, Bedrock runtime hosts).

Must not import :mod:`infra`, :mod:`worker`, :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from schema.contract import Provider

Platform = Literal["openai", "azure", "vertex", "bedrock"]
"""URL shape and body edits: ``openai`` is each API's own (native) shape."""
Auth = Literal["bearer", "api-key", "x-api-key", "x-goog-api-key", "google", "aws", "none"]
"""How a request proves who sends it (:mod:`worker.auth`)."""
KEY_AUTHS: Final = frozenset({"bearer", "api-key", "x-api-key", "x-goog-api-key"})
"""Auth kinds that send a secret read from ``secret_env`` or ``secret_file``."""
PLATFORM_APIS: Final[dict[str, frozenset[str]]] = {
    "openai": frozenset({"openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions"}),
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
    background: bool = False
    """OpenAI Responses (Azure's included) or Gemini Interactions only: send ``background: true`` and
    ``store: true``, so the provider keeps generating when the worker dies and a successor re-attaches
    to the same response (:mod:`worker.reattach`). Trade-offs: the provider keeps the response for
    about 10 minutes (Gemini: retention unconfirmed; no zero-data-retention), the first token comes
    later, and cancelling needs the provider's cancel call."""

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


def default_upstreams(environ: Mapping[str, str]) -> Upstreams:
    """Build the endpoints today's variables describe (no upstreams file).

    ``openai`` (both OpenAI APIs, ``FANOUT_OPENAI_BASE_URL``, bearer ``OPENAI_API_KEY``),
    ``anthropic`` (``FANOUT_ANTHROPIC_BASE_URL``, ``x-api-key`` ``ANTHROPIC_API_KEY``) and
    ``gemini`` (both Gemini APIs, ``FANOUT_GEMINI_BASE_URL``, ``x-goog-api-key`` ``GEMINI_API_KEY``,
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
        "gemini": Endpoint(name="gemini", api=["gemini", "gemini_interactions"], auth="x-goog-api-key", framing=framing,
                           url=url("GEMINI", "https://generativelanguage.googleapis.com"),
                           secret_env="GEMINI_API_KEY"),  # noqa: S106 - a name
    }
    defaults = {"openai_chat": "openai", "openai_responses": "openai", "anthropic": "anthropic", "gemini": "gemini",
                "gemini_interactions": "gemini"}
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
    if default is None and not upstreams.source:
        raise LookupError(f"no endpoint serves provider {provider!r} without an upstreams file "
                          f"(FANOUT_UPSTREAMS_FILE); {_known(upstreams)}")
    if default is None:
        raise LookupError(f"model {model!r} is not a route of the upstreams file and the job names no endpoint; "
                          f"{_known(upstreams)}")
    return [Target(endpoint=upstreams.endpoints[default], model=model)]


def _check_speaks(endpoint: Endpoint, provider: str, *, route: str = "") -> None:
    if provider not in endpoint.apis:
        via = f"route {route!r}: it goes to endpoint {endpoint.name!r}" if route else f"endpoint {endpoint.name!r}"
        raise LookupError(f"provider {provider!r} is not spoken by {via}, which speaks {', '.join(endpoint.apis)}")


def _known(upstreams: Upstreams) -> str:
    return (f"endpoints: {', '.join(upstreams.endpoints) or 'none'}; "
            f"routes: {', '.join(upstreams.models) or 'none'}")
