"""OpenAI Chat Completions (``stream: true``) adapter, for OpenAI and compatible servers.

Covers OpenAI, Azure OpenAI, OpenRouter, vLLM, DeepSeek, Groq and Ollama. Follows the
OpenAI streaming doc and PROVIDERS.md section 2, normalized per section 7. The body is
``data:`` payloads only; each is routed on its shape (``[DONE]``, an error object, a
chunk), never on the SSE ``event:`` line. Pure: imports no asyncio, aiohttp, redis or
opentelemetry.

Terminal signals, the only ones that end a stream here. A normal end needs a
``finish_reason`` on choice 0 **and then** ``data: [DONE]`` (checked with
``startswith("[DONE]")``, as the official SDK does). ``[DONE]`` ends a Chat stream; a
``finish_reason`` does not: content after it continues the stream (the same block when
the kind is unchanged; relays stamp ``stop`` on chunks that still carry content,
one-hub#402), and the **last** ``finish_reason`` before ``[DONE]`` is the one that counts
(PROVIDERS.md 2.2, amended):

| last ``finish_reason``, then ``[DONE]`` | status | finish_reason |
| --- | --- | --- |
| ``stop``, ``eos`` (Together AI), ``eos_token`` (TGI-style) | completed | stop (see below) |
| ``tool_calls``, ``function_call`` | completed | tool_calls |
| ``length`` | incomplete | length |
| ``content_filter`` | incomplete | content_filter |
| any other value | incomplete | other |

(``stop`` becomes tool_calls with tool calls, refusal with only a refusal.)

| failure signal | status | category |
| --- | --- | --- |
| a payload with a top-level ``error`` (object or string), no matter what follows | failed | by code/type, below |
| vLLM's flat ``{"object":"error","message":…,"code":…}`` | failed | by code/type |
| ``finish_reason: "error"`` (OpenRouter), with or without ``error`` | failed | by code/type, else upstream_error |
| ``[DONE]`` without any ``finish_reason`` before it | failed | protocol |
| a tool call that got arguments but never a name | failed | protocol |
| body ends without ``[DONE]``, even after a ``finish_reason`` | interrupted | transport |

Error ``code``/``type`` → category (string codes first, then ``type``, then a numeric
code, which OpenRouter and vLLM set to the HTTP status): ``server_error``/500/502
upstream_error; ``rate_limit_exceeded``/429 rate_limited; ``insufficient_quota``/402
rate_limited, not retryable; ``context_length_exceeded``; ``invalid_request_error``/400
invalid_request; 401 authentication; 403 permission; 404 not_found;
``overloaded``/503/529 upstream_overloaded; other 4xx invalid_request, else
upstream_error. ``provider_code`` is the ``code`` if a string, else the ``type``, else
the numeric code as a string. The first fatal condition wins: a ``[DONE]`` after an
error changes nothing. A ``stream.error`` carries the normalized finish_reason when one
came before it.

Blocks. Chat has no block-end signal: content is one sequence, so at most one block is
open; opening the next block (a change of kind among text, refusal and reasoning, or a
new tool call) closes the previous one, and ``[DONE]`` after a ``finish_reason`` closes
the last one (for every finish value, ``length`` included). Runs of the same kind merge,
across a ``finish_reason`` too. A body that ends after a ``finish_reason`` but before
``[DONE]`` leaves the last block open (``interrupted``, no fake ``block.stop``).

Quirks handled:

* Azure: an empty-``choices`` first chunk with ``prompt_filter_results`` and empty
  ``id``/``model`` (counted as ``prompt_filter_results``); a late content-filter choice
  after the finish chunk with no ``delta`` (counted as ``choice_without_delta``; it
  neither reopens nor ends anything). Empty ids and models are never taken.
* Reasoning: one source per delta, ``reasoning_content`` (string or ``{"text"}``) >
  ``reasoning`` > ``reasoning_text`` (GitHub Copilot) > ``reasoning_details[]`` text;
  mirrored copies are never read twice. Copilot's ``reasoning_opaque`` is a
  ``signature`` delta on the current reasoning block, read after the delta's reasoning
  text and before its content (a reasoning block holding only the signature when no
  reasoning run is current) (PROVIDERS.md 2.5, amended).
* OpenRouter: ``: OPENROUTER PROCESSING`` comments never reach the adapter; error chunks
  (top-level ``error`` and/or ``finish_reason: "error"``) fail, a later ``[DONE]`` is ignored.
* Tool calls keyed by ``index`` (list position when absent). A non-empty ``id`` different
  from the call held at that index starts a new call (Ollama sends parallel calls all at
  index 0); the same id, or none, continues it. Repeated ``id``/``type``/``name`` (vLLM's
  closing fragment) are never concatenated. Arguments before the name are buffered until
  the name arrives. ``arguments`` may be omitted, ``""``, or whole; ``""`` overall is ``{}``.
  A call without an id gets ``call_fanout_<index>`` (stable across replays).
* Deprecated ``delta.function_call`` is one more tool call.
* Gemini's OpenAI-compatible layer: tool fragments without ``index``; a tool fragment's
  ``extra_content.google.thought_signature`` rides on its block as a ``signature`` delta.
* ``finish_reason: stop`` with tool calls → tool_calls, with only a refusal → refusal.
* Usage on any chunk (the trailing empty-choices chunk, DeepSeek/Groq finish chunk,
  Groq ``x_groq.usage``); the last report wins.
* ``delta.content``/``refusal`` ``null`` or ``""`` open nothing; ``obfuscation``, ``logprobs``
  and other unknown fields are ignored; choices other than index 0 (``n > 1``) are
  ignored and counted as ``choice_index_nonzero``; payloads of unknown shape are counted
  under their ``object`` or ``type`` (else ``unknown_payload``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schema.contract import FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters.base import Adapter, Framing, parse_object
from worker.adapters.openai_chat_blocks import ChatBlocks
from worker.adapters.openai_chat_parts import (
    map_finish,
    map_usage,
    nonempty,
    payload_shape,
    read_error,
    reasoning_opaque,
    reasoning_text,
    text_of,
    usage_of,
)
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

Payload = dict[str, Any]
Handler = Callable[[Payload], None]


class OpenAIChatAdapter(Adapter):
    """Adapter for one Chat Completions streaming response (see the module docstring)."""

    provider = "openai_chat"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        super().__init__(normalizer, framing=framing)
        self._finish_raw: str | None = None
        self._response_id: str | None = None
        self._model: str | None = None
        self._blocks = ChatBlocks(normalizer)
        self._handlers: dict[str, Handler] = {
            "chunk": self._on_chunk,
            "error": self._on_error,
            "flat_error": self._fail_with,
        }

    # -- routing ------------------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        text = frame.data if isinstance(frame, SSEFrame) else frame.text
        if text.startswith("[DONE]"):
            self._on_done()
            return
        payload = parse_object(text)
        name = payload_shape(payload)
        self._dispatch(self._handlers, name, payload)

    def _finish(self, *, truncated: bool) -> None:
        if self._finish_raw is not None:
            self.norm.fail(category="transport", finish_reason=self._finish_reason(),
                           message="upstream closed the connection after the finish_reason, before [DONE]")

    def _finish_reason(self) -> FinishReason | None:
        if self._finish_raw is None:
            return None
        return self.norm.derive_finish(map_finish(self._finish_raw)[1])

    # -- terminal signals ---------------------------------------------------

    def _on_done(self) -> None:
        if self._finish_raw is None:
            raise UpstreamProtocolError("upstream sent [DONE] without a finish_reason")
        self._blocks.check_calls_named()
        self.norm.close_all()
        status, reason = map_finish(self._finish_raw)
        self.norm.done(status=status, finish_reason=reason, provider_finish_reason=self._finish_raw,
                       response_id=self._response_id, model=self._model)

    def _on_error(self, payload: Payload) -> None:
        self._fail_with(payload["error"])

    def _fail_with(self, error: Any) -> None:
        report = read_error(error)
        self.norm.fail(category=report.category, message=report.message, provider_code=report.provider_code,
                       retryable=report.retryable, finish_reason=self._finish_reason())

    def _on_finish(self, raw: Any) -> None:
        if raw is None:
            return
        if not isinstance(raw, str):
            raise UpstreamProtocolError("upstream sent a finish_reason that is not a string")
        if raw == "error":
            self._fail_with({"message": "upstream ended the choice with an error"})
            return
        if self._finish_raw is not None:
            self.norm.ignore("repeated_finish_reason")  # counted; the last one counts
        self._finish_raw = raw

    # -- chunks -------------------------------------------------------------

    def _on_chunk(self, chunk: Payload) -> None:
        self._note_identity(chunk)
        if "prompt_filter_results" in chunk:
            self.norm.ignore("prompt_filter_results")
        choice = self._first_choice(chunk.get("choices"))
        if choice is not None:
            self._on_delta(choice)
        usage = usage_of(chunk)
        if usage is not None:
            self.norm.usage = map_usage(usage)
        error = chunk.get("error") or (choice or {}).get("error")
        if error:
            self._fail_with(error)
        elif choice is not None:
            self._on_finish(choice.get("finish_reason"))

    def _note_identity(self, chunk: Payload) -> None:
        self._response_id = self._response_id or nonempty(chunk.get("id"))
        self._model = self._model or nonempty(chunk.get("model"))

    def _first_choice(self, choices: Any) -> Payload | None:
        if choices is None:
            return None
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise UpstreamProtocolError("upstream sent choices that are not a list of objects")
        found: Payload | None = None
        for choice in choices:
            if choice.get("index") in (0, None) and found is None:
                found = choice
            else:
                self.norm.ignore("choice_index_nonzero")
        return found

    def _on_delta(self, choice: Payload) -> None:
        delta = choice.get("delta")
        if delta is None:
            if choice.get("finish_reason") is None:
                self.norm.ignore("choice_without_delta")
            return
        if not isinstance(delta, dict):
            raise UpstreamProtocolError("upstream sent a delta that is not an object")
        self._blocks.run("reasoning", reasoning_text(delta))
        self._blocks.reasoning_signature(reasoning_opaque(delta))
        self._blocks.run("text", text_of(delta, "content"))
        self._blocks.run("refusal", text_of(delta, "refusal"))
        self._blocks.tool_calls(delta.get("tool_calls"))
        function_call = delta.get("function_call")
        if isinstance(function_call, dict):
            self._blocks.fragment("function_call", {"function": function_call})
