"""A job's targets: the endpoints of the upstreams file it may go to, in order, with their model, deadlines and request.

:func:`schema.upstreams.targets` decides the endpoints (the one the job names, its model's
route, or the provider's default endpoint without a file); this module turns them into
:class:`~worker.route_run.RouteTarget` objects: the name terminal events carry (only with an
upstreams file, so streams without one stay byte-identical), the endpoint's own deadlines,
and its request (:func:`worker.upstream.request_for`, built when the job reaches it). Also
the slot limits of every endpoint, for the process's
:class:`~worker.router.Router`.

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

from functools import partial

from schema.errors import FanoutError
from schema.job import Job
from schema.upstreams import Endpoint, Upstreams, targets
from worker.attempt import AttemptLimits
from worker.auth import Authorizer
from worker.route_run import RouteTarget
from worker.routing import OnFull
from worker.secrets import Secrets
from worker.settings import WorkerSettings
from worker.upstream import request_for


def slot_limits(upstreams: Upstreams) -> dict[str, int | None]:
    """Return endpoint name → ``max_concurrency`` (``None``: no limit) for :class:`~worker.router.Router`."""
    return {name: endpoint.max_concurrency for name, endpoint in upstreams.endpoints.items()}


def endpoint_limits(endpoint: Endpoint, settings: WorkerSettings) -> AttemptLimits:
    """Return the endpoint's deadlines: its own where the file gives them, else the worker's settings."""
    return AttemptLimits.of(settings, connect_timeout_s=endpoint.connect_timeout_s,
                            idle_timeout_s=endpoint.idle_timeout_s, progress_timeout_s=endpoint.progress_timeout_s)


def job_targets(job: Job, upstreams: Upstreams, settings: WorkerSettings, credentials: Secrets,
                authorizer: Authorizer) -> tuple[list[RouteTarget], OnFull]:
    """Return where ``job`` may go, in route order, and its route's rule for a full endpoint.

    Each target's request is built when the job reaches it (:func:`worker.upstream.request_for`).

    Raises:
        FanoutError: ``invalid_request``, not retryable: the job names an unknown endpoint,
            one (or a route) that does not speak its provider, or a model that is no route
            where no default endpoint exists (the message names both sides); the caller
            stores it as the stream's error.
    """
    try:
        found = targets(upstreams, job.provider, job.model, job.endpoint)
    except LookupError as exc:
        raise FanoutError(f"no endpoint serves this job: {exc.args[0]}", category="invalid_request",
                          retryable=False) from exc
    route = None if job.endpoint else upstreams.models.get(job.model)
    stamped = bool(upstreams.source)
    out = [RouteTarget(name=target.endpoint.name, model=target.model, stamped=stamped,
                       limits=endpoint_limits(target.endpoint, settings),
                       build=partial(request_for, job, target, credentials, authorizer))
           for target in found]
    return out, route.on_full if route else "fallback"
