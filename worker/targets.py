"""A job's targets: the endpoints of the upstreams file it may go to, in order, with their model, deadlines and request.

:func:`schema.upstreams.targets` decides the endpoints (the one the job names, its model's
route, or the provider's default endpoint without a file); this module turns them into
:class:`~worker.route_run.RouteTarget` objects: the name terminal events carry (only with an
upstreams file, so streams without one stay byte-identical), the endpoint's own deadlines,
and how to build the request. Also the slot limits of every endpoint, for the process's
:class:`~worker.router.Router`.

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from schema.errors import FanoutError
from schema.job import Job
from schema.upstreams import Endpoint, Target, Upstreams, targets
from worker.attempt import AttemptLimits
from worker.route_run import RouteTarget
from worker.routing import OnFull
from worker.secrets import Secrets
from worker.settings import WorkerSettings
from worker.upstream import Credentials, UpstreamRequest, build_request


def slot_limits(upstreams: Upstreams) -> dict[str, int | None]:
    """Return endpoint name → ``max_concurrency`` (``None``: no limit) for :class:`~worker.router.Router`."""
    return {name: endpoint.max_concurrency for name, endpoint in upstreams.endpoints.items()}


def endpoint_limits(endpoint: Endpoint, settings: WorkerSettings) -> AttemptLimits:
    """Return the endpoint's deadlines: its own where the file gives them, else the worker's settings."""
    return AttemptLimits.of(settings, connect_timeout_s=endpoint.connect_timeout_s,
                            idle_timeout_s=endpoint.idle_timeout_s, progress_timeout_s=endpoint.progress_timeout_s)


def job_targets(job: Job, upstreams: Upstreams, settings: WorkerSettings, credentials: Credentials,
                secrets: Secrets) -> tuple[list[RouteTarget], OnFull]:
    """Return where ``job`` may go, in route order, and its route's rule for a full endpoint.

    Raises:
        FanoutError: ``invalid_request``, not retryable: the job names an unknown endpoint,
            or one (or a route) that does not speak its provider (the message names both);
            the caller stores it as the stream's error.
    """
    try:
        found = targets(upstreams, job.provider, job.model, job.endpoint)
    except LookupError as exc:
        raise FanoutError(str(exc.args[0]), category="invalid_request", retryable=False) from exc
    route = None if job.endpoint else upstreams.models.get(job.model)
    stamped = bool(upstreams.source)
    out = [RouteTarget(name=target.endpoint.name, model=target.model, stamped=stamped,
                       limits=endpoint_limits(target.endpoint, settings),
                       build=_builder(job, target, settings, credentials, secrets, from_file=stamped))
           for target in found]
    return out, route.on_full if route else "fallback"


def _builder(job: Job, target: Target, settings: WorkerSettings, credentials: Credentials, secrets: Secrets, *,
             from_file: bool) -> _Build:
    if not from_file:  # today's variables: today's request, byte for byte
        return _Build(job, settings, credentials=credentials)
    return _Build(msgspec.structs.replace(job, model=target.model), _settings_for(target.endpoint, settings),
                  endpoint=target.endpoint, secrets=secrets)


class _Build:
    """A deferred :func:`worker.upstream.build_request`, run when the job reaches its endpoint.

    Interim, until the per-platform request builder: an upstreams-file endpoint of platform
    ``openai`` gets its API's own URL shape under its ``url`` and its secret in that API's
    header; other platforms are refused (``invalid_request``).
    """

    __slots__ = ("credentials", "endpoint", "job", "secrets", "settings")

    def __init__(self, job: Job, settings: WorkerSettings, *, credentials: Credentials | None = None,
                 endpoint: Endpoint | None = None, secrets: Secrets | None = None) -> None:
        self.job, self.settings, self.credentials = job, settings, credentials
        self.endpoint, self.secrets = endpoint, secrets

    def __call__(self) -> UpstreamRequest:
        credentials = self.credentials
        if credentials is None:
            assert self.endpoint is not None
            assert self.secrets is not None
            credentials = _credentials_for(self.endpoint, self.secrets)
        try:
            return build_request(self.job, self.settings, credentials)
        except KeyError as exc:
            raise FanoutError(f"no endpoint serves provider {self.job.provider!r}", category="invalid_request",
                              retryable=False) from exc


_BASE_URL: Mapping[str, str] = {"openai_chat": "openai_base_url", "openai_responses": "openai_base_url",
                                "anthropic": "anthropic_base_url", "gemini": "gemini_base_url"}


def _settings_for(endpoint: Endpoint, settings: WorkerSettings) -> WorkerSettings:
    """Return the settings with every provider root at the endpoint's ``url`` (each API's own URL shape)."""
    roots = dict.fromkeys(set(_BASE_URL.values()), endpoint.url)
    return msgspec.structs.replace(settings, gemini_framing=endpoint.framing, **roots)


def _credentials_for(endpoint: Endpoint, secrets: Secrets) -> Credentials:
    """Return the endpoint's key for its API's header (bearer, ``x-api-key``, ``x-goog-api-key``); none for ``none``."""
    if endpoint.platform != "openai":
        raise FanoutError(f"endpoint {endpoint.name!r}: platform {endpoint.platform!r} is not served by this worker "
                          "yet", category="invalid_request", retryable=False)
    try:
        key = secrets.secret(endpoint) if endpoint.auth != "none" else ""
    except OSError as exc:
        raise FanoutError(f"endpoint {endpoint.name!r}: cannot read its secret_file", category="authentication",
                          retryable=False) from exc
    return Credentials(openai=key, anthropic=key, gemini=key)
