"""Endpoint secrets: read from the variable an endpoint names, or from its file, never shown.

An endpoint of the upstreams file (:class:`schema.upstreams.Endpoint`) names where its
secret is (``secret_env``: a variable; ``secret_file``: a path, e.g. a mounted Kubernetes
Secret); :class:`Secrets` reads it. A file is read again when its modification time or size
changes, so a rotated Secret takes effect on the next request without a restart. Surrounding
whitespace (the trailing newline of ``echo key > file``) is stripped. No value read here
appears in a ``repr``, a log line or an error message.

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from schema.settings import SettingsError
from schema.upstreams import KEY_AUTHS, Endpoint, Upstreams

__all__ = ["Secrets", "check_secrets"]


class Secrets:
    """The secrets of every endpoint; ``repr`` names nothing.

    Args:
        environ: The variables (``os.environ``); copied, so later changes of the process
            environment are not seen (as for every other setting).
    """

    __slots__ = ("_environ", "_files")

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)
        self._files: dict[str, tuple[tuple[int, int], str]] = {}

    def __repr__(self) -> str:
        return "Secrets(...)"

    def secret(self, endpoint: Endpoint) -> str:
        """Return the secret of ``endpoint``; empty when it names none or its variable is unset.

        Raises:
            OSError: Its ``secret_file`` cannot be read (the caller fails the attempt with
                a message naming the endpoint and the path, not the content).
        """
        if endpoint.secret_file:
            return self._read(endpoint.secret_file)
        if endpoint.secret_env:
            return self._environ.get(endpoint.secret_env, "").strip()
        return ""

    def variable(self, name: str) -> str:
        """Return the variable ``name`` (e.g. ``AWS_BEARER_TOKEN_BEDROCK``), empty when unset."""
        return self._environ.get(name, "").strip()

    def _read(self, path: str) -> str:
        status = os.stat(path)
        stamp = (status.st_mtime_ns, status.st_size)
        cached = self._files.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
        self._files[path] = (stamp, value)
        return value


def check_secrets(upstreams: Upstreams, secrets: Secrets) -> None:
    """At worker start: every endpoint of an upstreams file that names a secret can read it.

    Endpoints built from today's variables (no file) are not checked: they keep today's
    behaviour (a WARNING when no key is set at all).

    Raises:
        SettingsError: A ``secret_env`` that is unset or empty, or a ``secret_file`` that
            cannot be read or is empty; names the file, the endpoint's table and the key,
            never a value. The worker exits 2.
    """
    if not upstreams.source:
        return
    for endpoint in upstreams.endpoints.values():
        if endpoint.auth not in KEY_AUTHS and not (endpoint.secret_env or endpoint.secret_file):
            continue  # google, none, and aws without a Bedrock API key named
        where = f"bad upstreams file {upstreams.source}: [endpoints.{endpoint.name}]"
        try:
            value = secrets.secret(endpoint)
        except OSError as exc:
            raise SettingsError(f"{where} key 'secret_file': cannot read {endpoint.secret_file}: "
                                f"{exc.strerror or type(exc).__name__}") from exc
        if not value:
            key = "secret_file" if endpoint.secret_file else "secret_env"
            holder = endpoint.secret_file or f"variable {endpoint.secret_env}"
            raise SettingsError(f"{where} key {key!r}: {holder} is empty or unset; it must hold the secret")
