"""Bedrock bodies: event-stream messages to adapter frames, exception mapping, every split of every body."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from schema.contract import StreamDone, StreamError
from schema.errors import UpstreamProtocolError
from schema.validate import validate
from tests.eventstream_build import encode_message, main, message_of
from tools.replay import replay_file, replay_reads
from worker.bedrock_frames import EXCEPTIONS, BedrockBody, failure_of, frame_of
from worker.eventstream import EventStreamDecoder, EventStreamMessage
from worker.frames import ErrorFrame, JSONFrame, SSEFrame
from worker.pipeline import build_pipeline

ROOT = Path(__file__).resolve().parents[2]
BODIES = sorted((ROOT / "transcripts").glob("bedrock_*/*.eventstream"))


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def one(line: dict[str, object]) -> EventStreamMessage:
    (message,) = EventStreamDecoder().feed(message_of(line))
    return message


def test_every_body_is_what_its_source_builds() -> None:
    assert BODIES, "no Bedrock transcripts"
    assert main(["--check"]) == 0


@pytest.mark.parametrize("path", BODIES, ids=_ids(BODIES))
def test_a_split_at_every_byte_boundary_gives_the_same_events(path: Path) -> None:
    body = path.read_bytes()
    whole, _ = replay_file(path)
    provider = "bedrock_converse" if path.parent.name == "bedrock_converse" else "anthropic"
    for cut in range(1, len(body)):
        events, _ = replay_reads([body[:cut], body[cut:]], provider=provider, framing="eventstream")
        assert events == whole, cut
    assert validate(whole) == []


def test_chunk_payload_is_unwrapped_into_the_anthropic_event() -> None:
    frame = frame_of(one({"chunk": {"type": "ping"}}), "invoke")
    assert frame == JSONFrame(text='{"type":"ping"}')


def test_converse_event_becomes_a_named_frame_with_its_json_payload() -> None:
    frame = frame_of(one({"event": "messageStart", "payload": {"role": "assistant"}}), "converse")
    assert frame == SSEFrame(event="messageStart", data='{"role":"assistant"}')


@pytest.mark.parametrize(
    ("name", "category", "retryable"),
    [("throttlingException", "rate_limited", True), ("modelStreamErrorException", "upstream_error", True),
     ("validationException", "invalid_request", False), ("internalServerException", "upstream_error", True),
     ("serviceUnavailableException", "upstream_overloaded", True), ("modelTimeoutException", "upstream_error", True),
     ("accessDeniedException", "permission", False), ("resourceNotFoundException", "not_found", False),
     ("serviceQuotaExceededException", "rate_limited", False), ("brandNewException", "upstream_error", True)],
)
def test_exception_types_map_to_contract_categories(name: str, category: str, retryable: bool) -> None:
    frame = frame_of(one({"exception": name, "payload": {"message": "m"}}), "converse")
    assert frame == ErrorFrame(category=category, retryable=retryable, provider_code=name, message="m")  # type: ignore[arg-type]


def test_exception_table_covers_every_response_stream_member() -> None:
    # botocore data/bedrock-runtime/2023-09-30/service-2.json: ResponseStream and ConverseStreamOutput.
    members = {"internalServerException", "modelStreamErrorException", "validationException",
               "throttlingException", "modelTimeoutException", "serviceUnavailableException"}
    assert {m.lower() for m in members} <= set(EXCEPTIONS)


def test_namespaced_and_uri_suffixed_codes_are_reduced_to_the_name() -> None:
    assert failure_of("com.amazon.coral#ThrottlingException", "x").category == "rate_limited"
    assert failure_of("ValidationException:http://internal.amazon.com/", "x").category == "invalid_request"


def test_validation_saying_the_input_is_too_long_is_context_length_exceeded() -> None:
    assert failure_of("validationException", "prompt is too long: 210000 tokens > 200000 maximum") == (
        "context_length_exceeded", False)


def test_error_message_uses_its_code_and_message_headers() -> None:
    frame = frame_of(one({"error": {"code": "ThrottlingException", "message": "slow down"}}), "invoke")
    assert frame == ErrorFrame(category="rate_limited", retryable=True, provider_code="ThrottlingException",
                               message="slow down")


def test_exception_payload_that_is_not_json_still_gives_a_message() -> None:
    raw = encode_message([(":message-type", 7, "exception"), (":exception-type", 7, "throttlingException")], b"<html>")
    (message,) = EventStreamDecoder().feed(raw)
    frame = frame_of(message, "invoke")
    assert isinstance(frame, ErrorFrame)
    assert frame.message == "Bedrock sent throttlingException"


@pytest.mark.parametrize("payload", [{"p": "abc"}, {"bytes": 5}])
def test_chunk_without_base64_bytes_fails_protocol(payload: dict[str, object]) -> None:
    with pytest.raises(UpstreamProtocolError, match="without a base64 bytes field"):
        frame_of(one({"event": "chunk", "payload": payload}), "invoke")


def test_unknown_message_type_fails_protocol() -> None:
    (message,) = EventStreamDecoder().feed(encode_message([(":message-type", 7, "notice")], b"{}"))
    with pytest.raises(UpstreamProtocolError, match="of :message-type 'notice'"):
        frame_of(message, "invoke")


def test_body_defers_a_framing_error_after_earlier_frames_of_the_read() -> None:
    body = BedrockBody("invoke")
    good = message_of({"chunk": {"type": "ping"}})
    bad = message_of({"event": "chunk", "payload": {"bytes": "!"}})
    assert len(body.feed(good + bad)) == 1
    with pytest.raises(UpstreamProtocolError):
        body.close()


def test_metrics_only_chunk_is_counted_under_its_key_not_as_unknown() -> None:
    path = ROOT / "transcripts" / "bedrock_invoke" / "thinking_signature_then_text_metrics_alone.eventstream"
    events, ignored = replay_file(path)
    assert isinstance(events[-1], StreamDone)
    assert ignored == Counter({"amazon-bedrock-invocationMetrics": 1})


def test_exception_after_a_stop_reason_carries_it_as_finish_reason() -> None:
    start = {"chunk": {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 1}}}}
    stop = {"chunk": {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}}
    body = b"".join(message_of(line) for line in (
        start, stop, {"exception": "internalServerException", "payload": {"message": "boom"}}))
    events, _ = replay_reads([body], provider="anthropic", framing="eventstream")
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.error.category, last.finish_reason) == ("upstream_error", "stop")


def test_pipeline_applies_max_frame_bytes_to_event_stream_messages() -> None:
    big = message_of({"event": "contentBlockDelta", "payload": {"contentBlockIndex": 0, "delta": {"text": "x" * 2000}}})
    pipeline = build_pipeline(provider="bedrock_converse", framing="eventstream", stream_id="st_t", model="m",
                              clock=lambda: 0, max_frame_bytes=1024)
    events = pipeline.start() + pipeline.feed(big[:12])  # the prelude alone is enough to refuse it
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("failed", "protocol")
    assert f"of {len(big)} bytes exceeds max_message_bytes=1024 bytes" in last.error.message


def test_event_stream_framing_for_an_api_bedrock_does_not_serve_is_refused() -> None:
    with pytest.raises(KeyError):
        build_pipeline(provider="gemini", framing="eventstream", stream_id="st_t", model="m", clock=lambda: 0)
