"""Validation of a job submission body into a :class:`Submission`, naming every bad field.

Takes bytes, returns a Struct or raises one ``invalid-body`` / ``invalid-field``
:class:`~publisher.api.problems.Problem` listing all problems at once. Unknown fields are
refused too, so a misspelt ``reasoning_visibilty`` never silently falls back to a default.
Bodies nested deeper than :data:`MAX_JSON_DEPTH` are ``invalid-body``: the job and the
events that carry its ``request`` and ``metadata`` must stay decodable by every process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

import msgspec

from publisher.api.limits import valid_stream_id
from publisher.api.problems import FieldError, ProblemError
from schema.contract import Visibility
from schema.job import PROVIDERS, Provider
from schema.upstreams import NAME_PATTERN, Upstreams, targets

MAX_MODEL_CHARS: Final = 256
"""Longest accepted ``model`` name."""
MAX_JSON_DEPTH: Final = 128
"""Deepest nesting of objects and arrays in a body (the body object is depth 1)."""
VISIBILITIES: Final = ("public", "internal")


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """A valid ``POST /v1/streams`` body."""

    provider: Provider
    """Provider API (schema.job.PROVIDERS)."""
    model: str
    """Model name, 1 to 256 characters."""
    request: dict[str, Any]
    """Provider-native request body."""
    stream_id: str | None = None
    """Client-chosen id (idempotency key), else ``None``."""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    """Opaque caller metadata, copied onto ``stream.start``."""
    reasoning_visibility: Visibility = "public"
    """Visibility of the stream's reasoning blocks."""
    endpoint: str = ""
    """The upstreams file's endpoint to send it to (``FANOUT_UPSTREAMS_FILE``), else empty."""

    def body_hash(self) -> str:
        """Return the SHA-256 (hex) of the canonical JSON of everything but ``stream_id``.

        Two submissions with the same hash are the same job, whatever their key order. An
        empty ``endpoint`` is left out, so a body hashes as it did before endpoints existed.
        """
        fields = msgspec.structs.asdict(self) | {"stream_id": None}
        if not self.endpoint:
            del fields["endpoint"]
        return hashlib.sha256(msgspec.json.encode(fields, order="sorted")).hexdigest()


def _check_provider(value: Any) -> str | None:
    return None if value in PROVIDERS else f"must be one of {', '.join(PROVIDERS)}"


def _check_model(value: Any) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_MODEL_CHARS:
        return f"must be a string of 1 to {MAX_MODEL_CHARS} characters"
    if not value.isprintable() or value != value.strip():
        return "must be printable, without control characters or surrounding spaces"
    return None


def _check_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be a JSON object"


def _check_stream_id(value: Any) -> str | None:
    if isinstance(value, str) and valid_stream_id(value):
        return None
    return "must match ^[A-Za-z0-9_-]{1,128}$"


def _check_endpoint(value: Any) -> str | None:
    if isinstance(value, str) and NAME_PATTERN.fullmatch(value):
        return None
    return "must be an endpoint name of the upstreams file: 1 to 64 letters, digits, '_', '.', '-'"


def _check_visibility(value: Any) -> str | None:
    return None if value in VISIBILITIES else "must be 'public' or 'internal'"


CHECKS: Final[dict[str, tuple[bool, Callable[[Any], str | None]]]] = {
    "provider": (True, _check_provider),
    "model": (True, _check_model),
    "request": (True, _check_object),
    "stream_id": (False, _check_stream_id),
    "metadata": (False, _check_object),
    "reasoning_visibility": (False, _check_visibility),
    "endpoint": (False, _check_endpoint),
}
"""Field → (required, check returning an error text or ``None``)."""


def _request_errors(body: dict[str, Any]) -> list[FieldError]:
    """Check the parts of a provider-native ``request`` the worker itself builds on.

    ``request.model``, when present, must equal the top-level ``model`` (the worker sends
    the top-level one: a different value would be silently overridden); ``request.stream``,
    when present, must be ``true`` (every job streams). ``openai_chat``: ``stream_options``,
    when present and not null, must be an object (the worker adds ``include_usage`` to it;
    OpenAI's API reference, Chat Completions).
    """
    request = body.get("request")
    if not isinstance(request, dict):
        return []
    errors = _switch_errors(body, request)
    options = request.get("stream_options")
    if body.get("provider") == "openai_chat" and options is not None and not isinstance(options, dict):
        errors.append(FieldError(field="request.stream_options",
                                 detail='must be a JSON object (or absent), such as {"include_usage": true}'))
    return errors


def _switch_errors(body: dict[str, Any], request: dict[str, Any]) -> list[FieldError]:
    """Return the problems of ``request.model`` and ``request.stream`` (see :func:`_request_errors`)."""
    errors: list[FieldError] = []
    if "model" in request and "model" in body and request["model"] != body["model"]:
        errors.append(FieldError(field="request.model", detail=(
            f"{_shown(request['model'])} disagrees with the top-level model {_shown(body['model'])}: the worker "
            "sends the top-level model; leave request.model out or make it equal")))
    if "stream" in request and request["stream"] is not True:
        errors.append(FieldError(field="request.stream", detail=(
            f"is {_shown(request['stream'])}, but fanout always streams from the provider: leave request.stream "
            "out (or true); to get one answer at the end, read GET /v1/streams/{id} or fanout tail --result")))
    return errors


def _shown(value: Any) -> str:
    """Return ``value`` as short JSON for a message (at most 60 characters)."""
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


MODEL_IN_REQUEST: Final = ("is required at the top level of the body, beside provider and request "
                           '(found only request.model: move it out, {"provider": ..., "model": ..., "request": {...}})')
"""``detail`` for a missing ``model`` when the body has ``request.model``: where ``model`` goes."""


def field_errors(body: dict[str, Any]) -> list[FieldError]:
    """Return every problem of a decoded body, in field order (empty when valid)."""
    errors = [FieldError(field=name, detail="unknown field") for name in body if name not in CHECKS]
    for name, (required, check) in CHECKS.items():
        if name not in body:
            if required:
                errors.append(FieldError(field=name, detail=_missing(name, body)))
        elif (problem := check(body[name])) is not None:
            errors.append(FieldError(field=name, detail=problem))
    return errors + _request_errors(body)


def _missing(name: str, body: dict[str, Any]) -> str:
    request = body.get("request")
    if name == "model" and isinstance(request, dict) and "model" in request:
        return MODEL_IN_REQUEST
    return "is required"


def check_route(upstreams: Upstreams, sub: Submission) -> None:
    """Refuse a job no endpoint of ``upstreams`` can serve (:func:`schema.upstreams.targets`).

    Raises:
        ProblemError: ``invalid-field`` on ``endpoint`` (unknown, or it does not speak the
            job's ``provider``: both are named) or on ``model`` (neither a route nor served
            by a default endpoint, when no endpoint is named).
    """
    try:
        targets(upstreams, sub.provider, sub.model, sub.endpoint)
    except LookupError as exc:
        field = "endpoint" if sub.endpoint else "model"
        detail = str(exc.args[0])
        raise ProblemError("invalid-field", f"invalid fields: {field}",
                           errors=[FieldError(field=field, detail=detail)]) from exc


def json_depth(value: Any) -> int:
    """Return the nesting depth of decoded JSON (a scalar is 0, ``{}`` and ``[]`` are 1), iteratively."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def decode_body(raw: bytes) -> Any:
    """Decode a JSON request body of at most :data:`MAX_JSON_DEPTH` levels.

    Raises:
        ProblemError: ``invalid-body`` for bytes that are not JSON or nest too deeply.
    """
    too_deep = ProblemError("invalid-body", f"the body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels")
    if not raw:
        raise ProblemError("invalid-body", "the body is empty: send a JSON object (Content-Type: application/json)")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ProblemError("invalid-body", f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise too_deep from exc
    if json_depth(body) > MAX_JSON_DEPTH:
        raise too_deep
    return body


def parse_submission(raw: bytes) -> Submission:
    """Decode and validate a submission body.

    Args:
        raw: The request body (at most ``FANOUT_MAX_BODY_BYTES``), UTF-8 JSON.

    Returns:
        The submission, defaults filled in.

    Raises:
        ProblemError: ``invalid-body`` when ``raw`` is not a JSON object (or nests deeper
            than :data:`MAX_JSON_DEPTH`); ``invalid-field`` with one ``errors`` item per
            bad, missing or unknown field.
    """
    body = decode_body(raw)
    if not isinstance(body, dict):
        raise ProblemError("invalid-body", "the body must be a JSON object")
    errors = field_errors(body)
    if errors:
        names = ", ".join(error.field for error in errors)
        raise ProblemError("invalid-field", f"invalid fields: {names}", errors=errors)
    return msgspec.convert(body, Submission)
