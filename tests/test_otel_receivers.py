"""What the worker and the publisher export reaches real receivers, configured only through ``OTEL_*``.

Both roles run as real processes (:class:`tools.demo.stack.LocalStack`). One stack exports
OTLP/HTTP to a receiver in this test (aiohttp, decoding the protobuf payloads with
``opentelemetry-proto``); another serves the Prometheus endpoint of each process, scraped
and parsed with ``prometheus_client``'s text parser. The metrics table of docs/observability.md
is checked against the scrape.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from prometheus_client.parser import text_string_to_metric_families

from publisher.telemetry import ATTRIBUTE_VALUES as PUBLISHER_VALUES
from tools.demo.stack import LocalStack, wait_for_port
from worker.telemetry import ATTRIBUTE_VALUES as WORKER_VALUES

ROOT = Path(__file__).resolve().parents[1]
PROVIDER, MODEL = "anthropic", "simple_text_ping_and_padding"
GUARD_S = 30.0
"""Hang guard of every wait here, never a performance target."""
KNOWN_VALUES = {**WORKER_VALUES, **PUBLISHER_VALUES}
RETRY_ONCE = {"FANOUT_MAX_RETRIES": "1", "FANOUT_BACKOFF_BASE_S": "0.01", "FANOUT_BACKOFF_MAX_S": "0.02",
              "FANOUT_RETRY_AFTER_MAX_S": "0.02"}


def Stack(redis_url: str, *, env: dict[str, str]) -> LocalStack:  # noqa: N802 - reads as the class it builds
    """A one-worker :class:`LocalStack`; with Prometheus asked, it gives each process its own port."""
    return LocalStack(redis_url, workers=1, delay_ms=5, chunk_bytes=64, env=env)


class Receiver:
    """An OTLP/HTTP receiver: ``POST /v1/traces``, ``/v1/metrics``, ``/v1/logs`` with protobuf bodies."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.content_types: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._handler(ExportTraceServiceRequest, self.traces))
        app.router.add_post("/v1/metrics", self._handler(ExportMetricsServiceRequest, self.metrics))
        app.router.add_post("/v1/logs", self._handler(ExportLogsServiceRequest, self.logs))
        return app

    def _handler(self, message: Any, into: list[Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            if request.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            self.content_types.add(request.content_type)
            into.append(message.FromString(body))
            return web.Response(body=b"", content_type="application/x-protobuf")
        return handle

    def spans(self) -> list[tuple[str, Any]]:
        """(service.name, span) of every span received."""
        return [(_service(rs.resource.attributes), span) for request in self.traces for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def metrics_by_name(self) -> dict[str, list[tuple[str, Any]]]:
        """Metric name → (service.name, metric) of every export."""
        out: dict[str, list[tuple[str, Any]]] = {}
        for request in self.metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        out.setdefault(metric.name, []).append((_service(rm.resource.attributes), metric))
        return out


def _service(attributes: Any) -> str:
    return next((kv.value.string_value for kv in attributes if kv.key == "service.name"), "")


def _attrs(attributes: list[KeyValue]) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in attributes}


def _points(metric: Any) -> list[Any]:
    kind = metric.WhichOneof("data")
    return list(getattr(metric, kind).data_points)


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _submit_and_read(http: aiohttp.ClientSession, stack: LocalStack, provider: str,
                           model: str) -> tuple[dict[str, Any], str]:
    body = {"provider": provider, "model": model,
            "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}}
    async with http.post("/v1/streams", json=body, headers={"Authorization": f"Bearer {stack.api_key}"}) as resp:
        assert resp.status == 201, await resp.text()
        submitted = await resp.json()
    async with http.get(submitted["events_url"], params={"token": submitted["token"]}) as resp:
        return submitted, await asyncio.wait_for(resp.text(), GUARD_S)


async def _one_stream(stack: LocalStack) -> str:
    """Submit one job, read it to the end, then resume at the end (204); return the stream id."""
    async with aiohttp.ClientSession(stack.base_url) as http:
        submitted, text = await _submit_and_read(http, stack, PROVIDER, MODEL)
        last = max(int(seq) for seq in re.findall(r"^id: (\d+)(?:\.\w+)?$", text, flags=re.MULTILINE))  # <seq>.<epoch>
        assert "event: stream.done" in text
        headers = {"Authorization": f"Bearer {stack.api_key}", "Last-Event-ID": str(last)}
        async with http.get(submitted["events_url"], headers=headers) as resp:
            assert resp.status == 204
    return str(submitted["stream_id"])


async def _rate_limited_stream(stack: LocalStack) -> None:
    """Submit one job the fake provider answers 429 to every time: one retry, then ``failed``."""
    async with aiohttp.ClientSession(stack.base_url) as http:
        _, text = await _submit_and_read(http, stack, "gemini", "status-429")
    assert "event: stream.error" in text
    assert '"category":"rate_limited"' in text


# -- OTLP/HTTP ------------------------------------------------------------------


async def _otlp_run(redis_url: str) -> tuple[Receiver, str]:
    receiver = Receiver()
    runner = web.AppRunner(receiver.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{host}:{port}",
           "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BLRP_SCHEDULE_DELAY": "100",
           "FANOUT_METRICS_POLL_S": "0.2", **RETRY_ONCE}
    stack = Stack(redis_url, env=env)
    await asyncio.to_thread(stack.__enter__)
    try:
        stream_id = await _one_stream(stack)
        await _rate_limited_stream(stack)
        names = {"POST /v1/streams", "fanout.job", "fanout.upstream", "GET /v1/streams/{stream_id}/events"}
        await _until(lambda: names <= {span.name for _, span in receiver.spans()}, "spans")
        wanted = {"fanout.streams.ended", "fanout.delivery.latency", "fanout.jobs.pending"}
        await _until(lambda: wanted <= set(receiver.metrics_by_name()), "metrics")
    finally:
        problems = await asyncio.to_thread(stack.stop)  # SIGTERM: providers flush while the receiver still runs
        await runner.cleanup()
    assert problems == []
    return receiver, stream_id


@pytest.fixture(scope="module")
def otlp(single_redis_url: str) -> tuple[Receiver, str]:
    return asyncio.run(_otlp_run(single_redis_url))


def _job_span(receiver: Receiver, stream_id: str) -> Any:
    (job,) = [span for svc, span in receiver.spans() if span.name == "fanout.job" and svc == "fanout-worker"
              and _attrs(span.attributes)["fanout.stream_id"] == stream_id]
    return job


def _parent(receiver: Receiver, child: Any) -> tuple[str, Any]:
    (found,) = [(svc, span) for svc, span in receiver.spans()
                if (span.trace_id, span.span_id) == (child.trace_id, child.parent_span_id)]
    return found


def test_otlp_http_receives_spans_from_both_roles_as_protobuf(otlp: tuple[Receiver, str]) -> None:
    receiver, stream_id = otlp
    assert receiver.content_types == {"application/x-protobuf"}
    job = _job_span(receiver, stream_id)
    assert _attrs(job.attributes)["fanout.status"] == "completed"
    services = {(svc, span.name) for svc, span in receiver.spans()}
    assert ("fanout-publisher", "POST /v1/streams") in services
    assert ("fanout-worker", "fanout.upstream") in services


def test_worker_job_span_is_child_of_publisher_submit_span(otlp: tuple[Receiver, str]) -> None:
    receiver, stream_id = otlp
    job = _job_span(receiver, stream_id)
    service, submit = _parent(receiver, job)
    assert (service, submit.name) == ("fanout-publisher", "POST /v1/streams")
    assert submit.parent_span_id == b""  # the submit span is the root of the stream's trace
    upstream = [span for _, span in receiver.spans() if span.name == "fanout.upstream"
                and span.parent_span_id == job.span_id]
    assert len(upstream) == 1
    assert upstream[0].trace_id == submit.trace_id


def test_sse_span_links_to_the_submit_span(otlp: tuple[Receiver, str]) -> None:
    receiver, stream_id = otlp
    _, submit = _parent(receiver, _job_span(receiver, stream_id))
    readers = [span for svc, span in receiver.spans() if span.name == "GET /v1/streams/{stream_id}/events"
               and _attrs(span.attributes)["url.path"] == f"/v1/streams/{stream_id}/events"]
    assert len(readers) == 2  # the read to the end and the resume answered 204
    for reader in readers:
        assert [(link.trace_id, link.span_id) for link in reader.links] == [(submit.trace_id, submit.span_id)]
        assert reader.trace_id != submit.trace_id


def test_otlp_metrics_have_units_and_attributes_after_a_stream(otlp: tuple[Receiver, str]) -> None:
    receiver, _ = otlp
    metrics = receiver.metrics_by_name()
    units = {name: {metric.unit for _, metric in exported} for name, exported in metrics.items()}
    for name in ("fanout.time_to_first_delta", "fanout.stream.duration", "fanout.delivery.latency"):
        assert units[name] == {"s"}, name
    assert units["fanout.streams.ended"] == {"{stream}"}
    services = {name: {svc for svc, _ in exported} for name, exported in metrics.items()}
    assert services["fanout.streams.ended"] == {"fanout-worker"}
    assert services["fanout.sse.readers"] == {"fanout-publisher"}
    assert services["fanout.redis.errors"] == {"fanout-worker", "fanout-publisher"}
    ended = [(_attrs(p.attributes), p.as_int) for _, m in metrics["fanout.streams.ended"] for p in _points(m)]
    assert ({"provider": PROVIDER, "status": "completed", "category": "none"}, 1) in ended
    pending = [_attrs(p.attributes) for _, m in metrics["fanout.jobs.pending"] for p in _points(m)]
    assert {"shard": "0"} in pending
    latency = [p for _, m in metrics["fanout.delivery.latency"] for p in _points(m)]
    assert max(p.count for p in latency) >= 1
    assert {_attrs(p.attributes)["phase"] for p in latency} <= {"replay", "live"}


def test_every_exported_attribute_value_is_from_a_small_known_set(otlp: tuple[Receiver, str]) -> None:
    receiver, stream_id = otlp
    seen: set[tuple[str, str]] = set()
    for exported in receiver.metrics_by_name().values():
        for _, metric in exported:
            for point in _points(metric):
                seen |= set(_attrs(point.attributes).items())
    assert seen
    for key, value in seen:
        if key == "shard":
            assert value.isdigit(), value
        elif key == "endpoint":  # an endpoint's name: without an upstreams file, those today's variables give
            assert value in ("openai", "anthropic", "gemini"), value
        else:
            assert key in KNOWN_VALUES, key
            assert value in KNOWN_VALUES[key], (key, value)
        assert stream_id not in value
        assert MODEL not in value


def test_logs_reach_the_otlp_receiver(otlp: tuple[Receiver, str]) -> None:
    receiver, _ = otlp
    bodies = [record.body.string_value for request in receiver.logs for rl in request.resource_logs
              for sl in rl.scope_logs for record in sl.log_records]
    assert any("event=job_end" in body for body in bodies)


# -- Prometheus -----------------------------------------------------------------


async def _scrape(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


async def _prometheus_run(redis_url: str) -> dict[str, str]:
    env = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "FANOUT_METRICS_POLL_S": "0.2", **RETRY_ONCE}
    stack = Stack(redis_url, env=env)
    ports = stack.metrics_ports  # its own port for each process (tools.demo.stack.metrics_ports)
    await asyncio.to_thread(stack.__enter__)
    texts: dict[str, str] = {}
    try:
        await asyncio.to_thread(wait_for_port, ports["worker-1"])
        await _one_stream(stack)
        await _rate_limited_stream(stack)

        async def scraped() -> bool:
            for name, port in ports.items():
                texts[name] = await _scrape(f"http://127.0.0.1:{port}/metrics")
            # The reader sees the terminal event before the worker acks the job and counts its end,
            # and the group gauges are read every 0.2 s: a scrape taken in between shows the second
            # job unended, or a gauge read before the worker took it (pending 0, lag 1). Wait for
            # both jobs to have ended and for a group read taken after that.
            worker = _families(texts["worker-1"])
            if not {"fanout_jobs_pending", "fanout_jobs_ended", "fanout_stream_duration_seconds"} <= set(worker):
                return False
            settled = (_sample(worker, "fanout_jobs_ended", "fanout_jobs_ended_total", outcome="done") >= 2
                       and _sample(worker, "fanout_jobs_pending", "fanout_jobs_pending", shard="0") == 0)
            if "fanout_jobs_lag" in worker:
                settled = settled and _sample(worker, "fanout_jobs_lag", "fanout_jobs_lag", shard="0") == 0
            return settled

        deadline = time.monotonic() + GUARD_S
        while not await scraped():
            assert time.monotonic() < deadline, "the worker's scrape never showed the stream"
            await asyncio.sleep(0.2)
    finally:
        problems = await asyncio.to_thread(stack.stop)
    assert problems == []
    return texts


@pytest.fixture(scope="module")
def scrape(single_redis_url: str) -> dict[str, str]:
    return asyncio.run(_prometheus_run(single_redis_url))


def redis_has_lag(redis_url: str) -> bool:
    """Whether the Redis answers ``lag`` in ``XINFO GROUPS`` (7.0+; the embedded test server is 6.2)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7
    finally:
        client.close()


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _sample(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    return sum(s.value for s in families[family].samples
               if s.name == sample and labels.items() <= s.labels.items())


def test_worker_scrape_counts_the_stream(scrape: dict[str, str]) -> None:
    worker = _families(scrape["worker-1"])
    assert _sample(worker, "fanout_streams_ended", "fanout_streams_ended_total", provider=PROVIDER,
                   status="completed", category="none") == 1
    assert _sample(worker, "fanout_jobs_claimed", "fanout_jobs_claimed_total") == 2
    assert _sample(worker, "fanout_jobs_ended", "fanout_jobs_ended_total", outcome="done") == 2
    assert _sample(worker, "fanout_time_to_first_delta_seconds", "fanout_time_to_first_delta_seconds_count") == 1
    assert _sample(worker, "fanout_stream_duration_seconds", "fanout_stream_duration_seconds_count") == 2
    assert worker["fanout_jobs_pending"].type == "gauge"
    assert _sample(worker, "fanout_jobs_pending", "fanout_jobs_pending", shard="0") == 0
    assert _sample(worker, "fanout_upstream_ignored", "fanout_upstream_ignored_total", provider=PROVIDER) >= 1
    assert _sample(worker, "fanout_upstream_retries", "fanout_upstream_retries_total", provider="gemini",
                   category="rate_limited") == 1
    assert _sample(worker, "fanout_streams_ended", "fanout_streams_ended_total", provider="gemini",
                   status="failed", category="rate_limited") == 1


def test_publisher_scrape_counts_readers_deliveries_and_the_204(scrape: dict[str, str]) -> None:
    publisher = _families(scrape["publisher"])
    assert _sample(publisher, "fanout_sse_readers", "fanout_sse_readers") == 0
    delivered = _sample(publisher, "fanout_sse_events_delivered", "fanout_sse_events_delivered_total")
    assert delivered >= 5
    writes = _sample(publisher, "fanout_delivery_latency_seconds", "fanout_delivery_latency_seconds_count")
    assert 1 <= writes <= delivered  # one latency sample per write, and a write holds one event or more
    assert _sample(publisher, "fanout_sse_no_content", "fanout_sse_no_content_total") == 1
    assert _sample(publisher, "fanout_sse_resumes", "fanout_sse_resumes_total") == 1
    assert _sample(publisher, "fanout_redis_errors", "fanout_redis_errors_total", kind="connection") == 0


TYPES = {"counter": "counter", "up-down counter": "gauge", "observable gauge": "gauge", "histogram": "histogram"}


def documented_metrics() -> list[dict[str, str]]:
    text = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    table = text.split("<!-- metrics-table:", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[3:]:
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        rows.append(dict(zip(("name", "prometheus", "instrument", "unit", "attributes", "meaning"), cells,
                             strict=True)))
    return rows


def test_jobs_lag_gauge_per_shard(scrape: dict[str, str], redis_url: str) -> None:
    if not redis_has_lag(redis_url):
        pytest.skip("XINFO GROUPS reports lag from Redis 7.0 on; this server is older")
    worker = _families(scrape["worker-1"])
    assert _sample(worker, "fanout_jobs_lag", "fanout_jobs_lag", shard="0") == 0


def test_docs_metrics_table_matches_the_scrape(scrape: dict[str, str], redis_url: str) -> None:
    families = {**_families(scrape["worker-1"]), **_families(scrape["publisher"])}
    rows = documented_metrics()
    assert len(rows) >= 20
    documented = set()
    for row in rows:
        if row["name"] == "fanout.jobs.lag" and not redis_has_lag(redis_url):
            continue  # Redis 6.2 has no lag to report
        prometheus, kind = row["prometheus"], TYPES[row["instrument"]]
        assert prometheus == row["name"].replace(".", "_") + ("_seconds" if row["unit"] == "s" else "") + (
            "_total" if kind == "counter" else ""), row
        family = prometheus.removesuffix("_total") if kind == "counter" else prometheus
        assert family in families, f"{row['name']} is in docs/observability.md but not in the scrape"
        assert families[family].type == kind, row
        documented.add(family)
    scraped = {name for name in families if name.startswith("fanout_")}
    assert scraped - documented == set(), "scraped but not in the table of docs/observability.md"


def test_image_installs_the_otel_extra() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert 'pip install ".[otel,fast]"' in dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    otel = pyproject.split("otel = [", 1)[1].split("]", 1)[0]
    for package in ("opentelemetry-exporter-otlp", "opentelemetry-exporter-prometheus"):
        assert f'"{package}' in otel


@pytest.fixture
def busy_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_prometheus_port_in_use_is_one_warning_not_a_crash(busy_port: int, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from infra.otel_setup import providers_from_env

    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(busy_port))
    providers = providers_from_env({"OTEL_METRICS_EXPORTER": "prometheus"}, service_name="t")
    assert providers.meter_provider is None
    (message,) = [r.getMessage() for r in caplog.records if "otel_exporter_failed" in r.getMessage()]
    assert f"port {busy_port} is taken" in message
    assert "its own OTEL_EXPORTER_PROMETHEUS_PORT" in message
