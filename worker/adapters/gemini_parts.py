"""Gemini ``streamGenerateContent`` tables and helpers used by :mod:`worker.adapters.gemini`.

One job: the pure lookups the adapter needs (``finishReason`` → terminal status, error
object → contract error, ``usageMetadata`` → usage) and :class:`StreamedArgs`, which
rebuilds the arguments of a Vertex streamed function call (``partialArgs``) from its
``jsonPath`` pieces. Follows PROVIDERS.md sections 5 and 6 and python-genai
``google/genai/types.py`` (FinishReason, PartialArg). Pure: imports no asyncio, aiohttp,
redis or opentelemetry.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any, Final

import msgspec

from schema.contract import DoneStatus, ErrorCategory, FinishReason, Usage
from schema.errors import UpstreamProtocolError

_FILTERED: Final = (
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
    "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
)

FINISH: Final[dict[str, tuple[DoneStatus, FinishReason]]] = {
    "STOP": ("completed", "stop"),
    "MAX_TOKENS": ("incomplete", "length"),
    **dict.fromkeys(_FILTERED, ("incomplete", "content_filter")),
}
"""``finishReason`` → (status, finish_reason); every other value is ``incomplete``/``other``
(MALFORMED_FUNCTION_CALL, OTHER, LANGUAGE, UNEXPECTED_TOOL_CALL, TOO_MANY_TOOL_CALLS,
NO_IMAGE, IMAGE_OTHER, FINISH_REASON_UNSPECIFIED and values added later)."""

OTHER_FINISH: Final[tuple[DoneStatus, FinishReason]] = ("incomplete", "other")
"""The terminal of a ``finishReason`` not in :data:`FINISH`."""

ERROR_BY_STATUS: Final[dict[str, ErrorCategory]] = {
    "UNAVAILABLE": "upstream_overloaded",
    "RESOURCE_EXHAUSTED": "rate_limited",
    "INTERNAL": "upstream_error",
    "INVALID_ARGUMENT": "invalid_request",
    "UNAUTHENTICATED": "authentication",
    "PERMISSION_DENIED": "permission",
    "NOT_FOUND": "not_found",
    "DEADLINE_EXCEEDED": "upstream_error",
}
"""Google RPC ``status`` → error category (tried first)."""

ERROR_BY_CODE: Final[dict[int, ErrorCategory]] = {
    503: "upstream_overloaded",
    429: "rate_limited",
    500: "upstream_error",
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    504: "upstream_error",
}
"""HTTP ``code`` → error category (when ``status`` is absent or unknown); else ``upstream_error``."""

_CONTEXT_LENGTH: Final = re.compile(
    r"(?i)token count|maximum number of tokens|context (?:length|window)|too many tokens"
)


def finish_terminal(raw: str) -> tuple[DoneStatus, FinishReason]:
    """Return (status, normalized finish_reason) for one raw ``finishReason`` value."""
    return FINISH.get(raw, OTHER_FINISH)


def error_info(error: object) -> tuple[ErrorCategory, str | None, str]:
    """Map a Gemini ``error`` value to (category, provider_code, message).

    Args:
        error: The value of the payload's ``error`` key: normally
            ``{"code": int, "message": str, "status": str}``; a bare string is taken as
            the message.

    Returns:
        The category by ``status`` then ``code`` (``upstream_error`` if neither is
        known; ``INVALID_ARGUMENT``/400 about token counts is ``context_length_exceeded``),
        ``provider_code`` = ``status`` (else the code as a string, else ``None``) and the
        provider's message (the normalizer masks secrets and cuts it).

    """
    fields = error if isinstance(error, dict) else {"message": error}
    status, code = fields.get("status"), fields.get("code")
    category = ERROR_BY_STATUS.get(status) if isinstance(status, str) else None
    if category is None and isinstance(code, int):
        category = ERROR_BY_CODE.get(code)
    message = fields.get("message")
    text = message if isinstance(message, str) and message else "Gemini returned an error"
    if category == "invalid_request" and _CONTEXT_LENGTH.search(text):
        category = "context_length_exceeded"
    provider_code = status if isinstance(status, str) and status else (str(code) if code is not None else None)
    return category or "upstream_error", provider_code, text


_COUNT_KEYS: Final = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount",
                      "cachedContentTokenCount", "totalTokenCount")


def usage_of(meta: object) -> Usage | None:
    """Map one ``usageMetadata`` snapshot to usage, or ``None`` if it holds no token count.

    ``output_tokens`` = ``candidatesTokenCount`` + ``thoughtsTokenCount`` (a missing one
    counts as 0; ``candidatesTokenCount`` excludes thoughts); ``cached_input_tokens`` and
    ``reasoning_tokens`` are ``None`` when not sent. A snapshot without any token count
    (Vertex sends ``{"trafficType": ...}`` on early chunks) is not a usage report.
    """
    if not isinstance(meta, dict) or not any(isinstance(meta.get(k), int) for k in _COUNT_KEYS):
        return None
    prompt, candidates = _count(meta, "promptTokenCount"), _count(meta, "candidatesTokenCount")
    thoughts, cached = _count(meta, "thoughtsTokenCount"), _count(meta, "cachedContentTokenCount")
    return Usage(input_tokens=prompt, output_tokens=(candidates or 0) + (thoughts or 0),
                 cached_input_tokens=cached, reasoning_tokens=thoughts)


def _count(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_SEGMENT: Final = re.compile(r"\.([A-Za-z_$][\w$-]*)|\[(\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")

Segment = str | int

MAX_PATH_SEGMENTS: Final = 128
"""Deepest ``jsonPath`` accepted (keys and indexes): a short piece must not build a structure
nested past what the JSON encoder can serialize."""
MAX_INDEX_GAP: Final = 64
"""Most missing array elements one ``jsonPath`` index may skip (they are padded with nulls):
a short piece must not force an arbitrarily large array into memory and into the output."""
_MAX_INDEX_DIGITS: Final = 9


def parse_path(path: object) -> tuple[Segment, ...]:
    """Split a ``partialArgs`` ``jsonPath`` (``$.a.b[0]['c d']``) into keys and indexes.

    Raises:
        UpstreamProtocolError: Not a string, not starting with ``$``, unparsable, deeper
            than :data:`MAX_PATH_SEGMENTS` or with an index of more than 9 digits.

    """
    if not isinstance(path, str) or not path.startswith("$"):
        raise UpstreamProtocolError("streamed function call argument without a valid jsonPath")
    segments: list[Segment] = []
    pos = 1
    while pos < len(path):
        match = _SEGMENT.match(path, pos)
        if match is None:
            raise UpstreamProtocolError("streamed function call argument with an unparsable jsonPath")
        name, index, quoted, dquoted = match.groups()
        if index is not None and len(index) > _MAX_INDEX_DIGITS:
            raise UpstreamProtocolError("streamed function call argument with an array index out of range")
        segments.append(int(index) if index is not None else next(
            s for s in (name, quoted, dquoted) if s is not None))
        pos = match.end()
        if len(segments) > MAX_PATH_SEGMENTS:
            raise UpstreamProtocolError("streamed function call argument with a jsonPath nested too deeply")
    return tuple(segments)


_VALUE_KEYS: Final = ("stringValue", "numberValue", "boolValue", "nullValue")


class StreamedArgs:
    """Rebuilds one Vertex streamed function call's arguments from ``partialArgs`` pieces.

    Each piece names a ``jsonPath`` and one of ``stringValue``/``numberValue``/
    ``boolValue``/``nullValue``; a string piece with ``willContinue: true`` is continued
    by the next string piece at the same path (its text is appended). :meth:`text` gives
    the arguments as one JSON object text. Source: python-genai ``types.py`` (PartialArg);
    vercel/ai ``packages/google/src/__fixtures__/google-stream-tool-call-arguments.chunks.txt``.
    """

    def __init__(self, args: object = None) -> None:
        self.root: dict[str, Any] = dict(args) if isinstance(args, dict) else {}
        self._open_string: tuple[Segment, ...] | None = None

    def add(self, piece: object) -> None:
        """Apply one ``partialArgs`` element.

        Raises:
            UpstreamProtocolError: Not an object, a bad path, no value, or a path that
                contradicts the shape built so far.

        """
        if not isinstance(piece, dict):
            raise UpstreamProtocolError("streamed function call argument is not an object")
        path = parse_path(piece.get("jsonPath"))
        if not path:
            raise UpstreamProtocolError("streamed function call argument addresses the root")
        key = next((k for k in _VALUE_KEYS if k in piece), None)
        if key is None:
            raise UpstreamProtocolError("streamed function call argument without a value")
        value = None if key == "nullValue" else piece[key]
        if key == "stringValue" and path == self._open_string:
            value = str(self._get(path)) + str(value)
        self._set(path, value)
        self._open_string = path if key == "stringValue" and piece.get("willContinue") is True else None

    def text(self) -> str:
        """Return the arguments so far as compact JSON object text."""
        return msgspec.json.encode(self.root).decode()

    def _get(self, path: tuple[Segment, ...]) -> Any:
        node: Any = self.root
        for segment in path:
            node = node[segment]
        return node

    def _set(self, path: tuple[Segment, ...], value: Any) -> None:
        node: Any = self.root
        for segment, following in pairwise(path):
            _make_slot(node, segment)
            if node[segment] is None:
                node[segment] = [] if isinstance(following, int) else {}
            node = node[segment]
        _make_slot(node, path[-1])
        if isinstance(node[path[-1]], dict | list):
            raise UpstreamProtocolError("streamed function call argument overwrites an object or array")
        node[path[-1]] = value


def _make_slot(node: Any, segment: Segment) -> None:
    """Make ``node[segment]`` assignable (pad a list with nulls, default a key to null).

    Raises:
        UpstreamProtocolError: The path contradicts the shape, or an index skips more
            than :data:`MAX_INDEX_GAP` elements.
    """
    if isinstance(segment, int) and isinstance(node, list):
        if segment > len(node) + MAX_INDEX_GAP:
            raise UpstreamProtocolError("streamed function call argument index skips too many elements")
        node.extend([None] * (segment + 1 - len(node)))
    elif isinstance(segment, str) and isinstance(node, dict):
        node.setdefault(segment, None)
    else:
        raise UpstreamProtocolError("streamed function call argument path contradicts its shape")


def as_list(value: object, what: str) -> list[Any]:
    """``value`` as a list (``None`` → empty).

    Raises:
        UpstreamProtocolError: Present but not a list.

    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise UpstreamProtocolError(f"upstream sent {what} that is not a list")
    return value


def signature_of(part: dict[str, Any]) -> str | None:
    """Return the part's non-empty ``thoughtSignature``, or ``None``."""
    signature = part.get("thoughtSignature")
    return signature if isinstance(signature, str) and signature else None


def has_content(part: dict[str, Any], inert: frozenset[str]) -> bool:
    """Whether a part is model output: non-empty text, or any key beyond ``text`` and ``inert``.

    A ``functionCall``, ``executableCode`` or ``codeExecutionResult`` is output even when
    it makes no contract block; an empty text part or a bare signature is not.
    """
    text = part.get("text")
    return (isinstance(text, str) and text != "") or bool(part.keys() - inert - {"text"})


def args_text(args: object) -> str:
    """Serialize a whole call's ``args`` (absent or null = ``{}``) as JSON object text.

    Raises:
        UpstreamProtocolError: ``args`` is present but not an object.

    """
    if args is None:
        return "{}"
    if not isinstance(args, dict):
        raise UpstreamProtocolError("upstream sent functionCall args that are not an object")
    return msgspec.json.encode(args).decode()
