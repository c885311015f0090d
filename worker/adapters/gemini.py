"""Gemini ``streamGenerateContent`` adapter: ``GenerateContentResponse`` chunks → contract events.

Serves both framings (PROVIDERS.md 5.1): with ``alt=sse`` every ``data:`` event is one
chunk and a raw, unframed JSON object in the body (Gemini's error object) arrives as a
:class:`~worker.frames.JSONFrame`; without it every element of the streamed JSON array
arrives as a :class:`~worker.frames.JSONFrame`. Pure: imports no asyncio, aiohttp, redis
or opentelemetry.

Terminal signals (PROVIDERS.md 5.3 and section 7). A ``finishReason`` is proven only by
the clean end of the body (SSE) or the closing ``]`` (JSON array), so ``stream.done`` is
emitted from :meth:`GeminiAdapter._finish`, after closing every block. A ``finishReason``
followed by more content is not final (amended 5.3: Gemini 2.5 sends an intermediate
``STOP`` inside a built-in code-execution turn, 0xPlaygrounds/rig#2328; gateways stamp
``STOP`` on leading empty chunks, Chevey339/kelivo#1003): content after it continues
the stream and the **last** ``finishReason`` counts, if only the end of the body follows it::

    signal                                                  status       finish_reason      category
    ------------------------------------------------------  -----------  -----------------  ---------------
    finishReason STOP + clean end                           completed    stop / tool_calls  -
    finishReason MAX_TOKENS + clean end                     incomplete   length             -
    finishReason SAFETY, RECITATION, BLOCKLIST,             incomplete   content_filter     -
      PROHIBITED_CONTENT, SPII, IMAGE_SAFETY,
      IMAGE_PROHIBITED_CONTENT, IMAGE_RECITATION + clean end
    any other finishReason (MALFORMED_FUNCTION_CALL,        incomplete   other              -
      OTHER, LANGUAGE, unknown, ...) + clean end
    {"error": {code, message, status}} as a data event,     failed       finish seen/null   by status, then
      an array element or raw JSON in the SSE body                                          code (gemini_parts)
    promptFeedback.blockReason with no candidates           failed       null               content_filter
    malformed JSON; a streamed call open at STOP;           failed       finish seen/null   protocol
      bad partialArgs
    body ends without finishReason (or with output after    interrupted  finish seen/null   transport
      the last one), inside a frame, or the array never closes

Quirks handled (PROVIDERS.md 5.2, 5.4; decisions where the docs are silent marked *):

* ``candidates[0].content.parts[]``: ``{text}`` → text, ``{text, thought: true}`` →
  reasoning; consecutive parts of one kind merge across chunks; a change of kind closes
  the open block. Text and reasoning blocks close at the terminal.
* Each ``functionCall`` is its own ``tool_call`` block: opened, its ``thoughtSignature``
  (if any), one ``json_text`` delta of the serialized ``args`` (absent = ``{}``), closed
  at once. A missing ``id`` becomes ``call_<block index>`` (stable across replays and
  chunkings).
* ``thoughtSignature`` rides as a ``signature`` delta on the block of its own part. On an
  empty part (``{"text": "", "thoughtSignature": ...}``, or a part with only the
  signature) it rides on the open block (the streamed call, if one is open);
  *with no open block, or one that already carries a signature, it is counted as
  ``thoughtSignature_without_block`` and dropped (a delta may not follow ``block.stop``
  and no empty block is created). *A text or thought part carrying a signature while the
  open block of its kind already has one starts a new block (signed parts are never
  merged, PROVIDERS.md 5.4); an unsigned part still merges (BUG-CASES B05).
* Empty text parts add nothing. ``executableCode``, ``codeExecutionResult``,
  ``inlineData`` and unknown parts are not blocks in v1: counted as ``part:<name>``, their
  signatures dropped with them. Candidates with ``index`` != 0 are counted.
* ``content`` missing, ``{}`` or without ``parts``; finish-only and usage-only chunks.
* A part with output (non-empty text, a ``functionCall``, ``executableCode``, any part
  but an empty text or a bare signature) after a ``finishReason`` continues the stream
  (the open block when the kind is unchanged) and makes that ``finishReason`` not final
  (counted as ``finishReason_not_final``): the body must then carry another one, else
  its end is ``interrupted``. Usage-only chunks and empty signed parts after a
  ``finishReason`` leave it final. A ``finishReason`` repeated without output between
  is counted (``finishReason_repeated``); the last one counts. Usage is the last report.
* Vertex AI (UPSTREAMS.md B.3): ``createTime``, ``usageMetadata.trafficType`` and other
  extra fields are ignored; its ``blockReason`` values (``MODEL_ARMOR``, ``JAILBREAK``)
  fail the prompt like the others; CRLF frames are the SSE decoder's job.
* Usage is the latest ``usageMetadata`` snapshot holding a token count (gemini_parts);
  ``response_id`` = ``responseId``, ``model`` = ``modelVersion`` (latest seen).
* *Vertex streamed arguments are supported: ``functionCall {name, willContinue: true}``
  opens the block, ``partialArgs`` pieces are assembled by ``jsonPath``, and the call ends
  at a ``functionCall`` without ``willContinue`` (``{}`` is the usual marker), giving one
  ``json_text`` delta. An incomplete end (``MAX_TOKENS``, filter) closes it with what
  arrived; ``STOP`` with it still open is ``failed``/``protocol``. A ``jsonPath`` deeper
  than 128 segments, with an index of more than 9 digits or skipping more than 64 array
  elements is ``failed``/``protocol`` too (gemini_parts bounds what one piece may build).
* *SSE events with an ``event:`` name other than ``message`` (Gemini sends none) and
  payloads with no known field are counted and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final

from schema.contract import FinishReason
from schema.errors import UpstreamProtocolError
from worker.adapters.base import Adapter, Framing, parse_object
from worker.adapters.gemini_blocks import PartBlocks
from worker.adapters.gemini_parts import (
    as_list,
    error_info,
    finish_terminal,
    has_content,
    signature_of,
    usage_of,
)
from worker.frames import Frame, SSEFrame
from worker.normalizer import Normalizer

_KNOWN_KEYS: Final = frozenset(
    {"candidates", "promptFeedback", "usageMetadata", "responseId", "modelVersion", "createTime"}
)
_INERT_KEYS: Final = frozenset({"thoughtSignature", "thought", "partMetadata"})
"""Part keys that carry no content of their own."""


class GeminiAdapter(Adapter):
    """One Gemini ``streamGenerateContent`` response (SSE or JSON-array framing)."""

    provider: ClassVar[str] = "gemini"

    def __init__(self, normalizer: Normalizer, *, framing: Framing = "sse") -> None:
        super().__init__(normalizer, framing=framing)
        self._blocks = PartBlocks(normalizer)
        self._finish_raw: str | None = None
        self._response_id: str | None = None
        self._model: str | None = None

    # -- frames and payloads -------------------------------------------------

    def _feed(self, frame: Frame) -> None:
        if isinstance(frame, SSEFrame) and frame.event != "message":
            self.norm.ignore(f"event:{frame.event}")
            return
        try:
            self._payload(parse_object(frame.data if isinstance(frame, SSEFrame) else frame.text))
        except UpstreamProtocolError as exc:  # as the base does, plus the finishReason already seen
            self.norm.fail(category="protocol", message=exc.message, finish_reason=self._finish_reason())

    def _payload(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self._error(chunk["error"])
        elif not _KNOWN_KEYS & chunk.keys():
            self.norm.ignore("unknown_payload")
        elif chunk.get("candidates"):
            self._candidates(chunk["candidates"])
            self._metadata(chunk)  # after the parts: a rejected chunk's usage is not taken
        else:
            self._metadata(chunk)
            self._prompt_feedback(chunk.get("promptFeedback"))

    def _metadata(self, chunk: dict[str, Any]) -> None:
        if isinstance(rid := chunk.get("responseId"), str) and rid:
            self._response_id = rid
        if isinstance(model := chunk.get("modelVersion"), str) and model:
            self._model = model
        if (usage := usage_of(chunk.get("usageMetadata"))) is not None:
            self.norm.usage = usage

    def _error(self, error: object) -> None:
        category, code, message = error_info(error)
        self.norm.fail(category=category, message=message, provider_code=code,
                       finish_reason=self._finish_reason())

    def _prompt_feedback(self, feedback: object) -> None:
        reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
        if isinstance(reason, str) and reason:
            self.norm.fail(category="content_filter", provider_code=reason,
                           message=f"Gemini blocked the prompt ({reason})")

    # -- candidates and parts ------------------------------------------------

    def _candidates(self, candidates: object) -> None:
        for candidate in as_list(candidates, "candidates"):
            if not isinstance(candidate, dict):
                raise UpstreamProtocolError("upstream sent a candidate that is not an object")
            if (candidate.get("index") or 0) != 0:
                self.norm.ignore("candidate_other_index")
            else:
                self._candidate(candidate)

    def _candidate(self, candidate: dict[str, Any]) -> None:
        content = candidate.get("content")
        if content is not None and not isinstance(content, dict):
            raise UpstreamProtocolError("upstream sent candidate content that is not an object")
        for part in as_list((content or {}).get("parts"), "content.parts"):
            self._part(part)
        finish = candidate.get("finishReason")
        if isinstance(finish, str) and finish:
            self._on_finish(finish)

    def _part(self, part: object) -> None:
        if not isinstance(part, dict):
            raise UpstreamProtocolError("upstream sent a content part that is not an object")
        if self._finish_raw is not None and has_content(part, _INERT_KEYS):
            self._finish_raw = None  # that finishReason was not final (PROVIDERS.md 5.3, amended)
            self.norm.ignore("finishReason_not_final")
        handler = next((h for k, h in self._PARTS.items() if k in part), None)
        if handler is not None:
            handler(self._blocks, part)
        elif part.keys() <= _INERT_KEYS and (signature := signature_of(part)):
            self._blocks.loose_signature(signature)
        else:
            name = next((k for k in part if k not in _INERT_KEYS), "empty")
            self.norm.ignore(f"part:{name}")

    _PARTS: ClassVar[dict[str, Callable[[PartBlocks, dict[str, Any]], None]]] = {
        "text": PartBlocks.text,
        "functionCall": PartBlocks.call,
    }
    """Part kind → handler; any other part (executableCode, inlineData, ...) is counted."""

    # -- terminal ------------------------------------------------------------

    def _on_finish(self, raw: str) -> None:
        if self._finish_raw is not None:
            self.norm.ignore("finishReason_repeated")  # counted; the last one counts
        self._finish_raw = raw

    def _finish_reason(self) -> FinishReason | None:
        return finish_terminal(self._finish_raw)[1] if self._finish_raw else None

    def _finish(self, *, truncated: bool) -> None:
        if self._finish_raw is None:
            return
        status, reason = finish_terminal(self._finish_raw)
        if truncated:
            self.norm.fail(category="transport", finish_reason=reason,
                           message="upstream closed the connection after the finishReason, before the end of the body")
            return
        if self._blocks.streamed is not None:
            if status == "completed":
                self.norm.fail(category="protocol", finish_reason=reason,
                               message="upstream ended the response inside a streamed function call")
                return
            self._blocks.end_streamed()
        self.norm.close_all()
        self.norm.done(status=status, finish_reason=reason, provider_finish_reason=self._finish_raw,
                       response_id=self._response_id, model=self._model)

