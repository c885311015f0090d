"""The one redaction of text shown to readers: every key-shaped string out, the sentence kept.

Every provider error message that becomes a ``stream.error``'s ``error.message`` (through
:func:`worker.error_policy.safe_message`) and every other text a reader may see passes
through :func:`redact`. Providers quote the key they refused, whole or masked, and a
masked key still gives away its last characters (and which account it is):

=====================================================  ====================================================
what                                                   examples (from the providers' real 401/400 bodies)
=====================================================  ====================================================
a value after a credential word and ``=`` (a query,     ``?key=AIza...``, ``api_key=...``, ``token=...``
a header dump): always
a value after a credential word and ``:`` when it       ``Your api key: ****6eA3 is invalid`` (DeepSeek),
looks like a key (a digit, a ``*``, or 20+ characters)  ``Authorization: Bearer ...``
``Bearer <token>``                                      ``bearer eyJhbGciOi...``
a known key prefix and what follows, masked or not      ``sk-proj-****...MxYA`` (OpenAI), ``sk-ant-api03-...``
                                                        (Anthropic), ``sk-or-v1-``, ``gsk_`` (Groq), ``xai-``,
                                                        ``pplx-``, ``hf_``, ``r8_``, ``ghp_``, ``xoxb-``
Google API keys                                         ``AIzaSy...``
AWS access key ids                                      ``AKIA...``, ``ASIA...``
JSON Web Tokens                                         ``eyJ<header>.eyJ<payload>.<signature>``
any word with a run of three or more ``*`` (a masked    ``gs***tF`` (xAI), ``********Ab3x``,
key whatever its prefix)                                ``https://*****...lETQ`` (OpenAI, a URL as key)
a run of 32+ letters, digits, ``+/_=-`` holding both    a Together or Mistral key, a hex secret, an AWS
a digit and a letter                                    secret access key
the few characters after "key ending in/with"           ``API key ending in 'Ab3x'``
=====================================================  ====================================================

Each match becomes :data:`REDACTED`; a trailing ``.`` or ``,`` of the match is kept, so the
sentence still reads. :func:`redact` is idempotent. Pure: imports no asyncio, aiohttp,
redis or opentelemetry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

REDACTED: Final = "[redacted]"
"""What replaces a key-shaped string."""

_WORD: Final = r"(?:api[_ -]?key|x-api-key|key|access[_ -]?token|token|secret|password|authorization|credential)"
_ASSIGNED: Final = re.compile(rf"(?i)(\b{_WORD}\s*=\s*)(?!\[redacted\])[^\s&\"',;]+")
_LABELLED: Final = re.compile(
    rf"(?i)(\b{_WORD}(?:\s+provided)?\s*:\s*(?:bearer\s+)?)(?!\[redacted\])"
    r"((?=[^\s\"',;]*[\d*])[^\s\"',;]{4,}|[^\s\"',;]{20,})")
_BEARER: Final = re.compile(r"(?i)(\bbearer\s+)(?!\[redacted\])[A-Za-z0-9._~+/=*-]{8,}")
_PREFIXED: Final = re.compile(
    r"(?<![\w-])(?:sk|pk|rk|gsk|xai|pplx|hf|fw|r8|ghp|gho|ghu|ghs|github_pat|xox[abprs])[-_][\w*.…-]{3,}")
_GOOGLE: Final = re.compile(r"\bAIza[\w*.…-]{4,}")
_AWS: Final = re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z0-9*]{8,}\b")
_JWT: Final = re.compile(r"\beyJ[\w-]{4,}\.[\w-]{4,}(?:\.[\w-]*)?")
_STARRED: Final = re.compile(r"[\w.…+/=~:-]*\*{3,}[\w.…*+/=~-]*")
_LONG_RUN: Final = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_ENDING: Final = re.compile(r"(?i)(\b(?:key|token)\s+(?:that\s+)?end(?:s|ing)?\s+(?:in|with)\s+['\"]?)[\w-]{2,8}")


def _masked(text: str) -> str:
    """:data:`REDACTED` in place of ``text``, keeping its trailing ``.``/``,``/``…``/``:`` (the sentence's)."""
    body = text.rstrip(".,…:")
    return REDACTED + text[len(body):] if body else text


def _keep_tail(match: re.Match[str]) -> str:
    return _masked(match.group(0))


def _after_label(match: re.Match[str]) -> str:
    label = match.group(1)
    return label + _masked(match.group(0)[len(label):])


def _long_run(match: re.Match[str]) -> str:
    text = match.group(0)
    secret = any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    return REDACTED if secret else text


_RULES: Final[tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...]] = (
    (_ASSIGNED, _after_label), (_LABELLED, _after_label), (_BEARER, _after_label), (_PREFIXED, _keep_tail),
    (_GOOGLE, _keep_tail), (_AWS, _keep_tail), (_JWT, _keep_tail), (_STARRED, _keep_tail),
    (_LONG_RUN, _long_run), (_ENDING, lambda m: m.group(1) + REDACTED),
)
"""The module table, in the order applied."""


def redact(text: str) -> str:
    """Return ``text`` with every key-shaped string replaced by :data:`REDACTED` (module table).

    Args:
        text: Any text for readers, e.g. a provider's error message; may be empty.

    Returns:
        The same text with only the key-shaped parts replaced; the same length or shorter
        unless a match was shorter than :data:`REDACTED`.
    """
    for pattern, replace in _RULES:
        text = pattern.sub(replace, text)
    return text


MAX_MESSAGE_CHARS: Final = 500
"""Longest error message passed on to readers; longer ones are cut."""


def safe_message(text: str) -> str:
    """Return ``text`` with every key-shaped string out (:func:`redact`), cut to MAX_MESSAGE_CHARS.

    The one path of every message shown to readers: ``stream.error``'s ``error.message``
    (the normalizer and the worker's own storage errors), meta ``error_message``.
    """
    masked = redact(text)
    return masked if len(masked) <= MAX_MESSAGE_CHARS else masked[: MAX_MESSAGE_CHARS - 1] + "…"
