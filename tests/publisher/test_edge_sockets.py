"""Hostile connections on raw sockets: header and body timeouts at their edge, the socket cap,
parse errors answered as problems and never logged with their values, repeated headers refused."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest

from publisher.api.edge import SERVER_LOGGER, ParseErrorFilter, install_log_filter
from schema import logs
from tests.publisher.helpers import API_KEY, GUARD_S, StreamWriter, bearer, make_settings, start

PROBLEM = b"application/problem+json"


async def _connect(base_url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base_url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """Read to EOF; a reset counts as EOF (the server aborted the socket)."""
    try:
        return await asyncio.wait_for(reader.read(), GUARD_S)
    except ConnectionResetError:
        return b""


async def test_socket_that_never_finishes_its_headers_is_closed_at_the_header_timeout(start_app):
    server = await start_app(make_settings(header_timeout_s=0.5))
    reader, writer = await _connect(server.base_url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
    await writer.drain()
    assert await _read_all(reader) == b""  # closed, nothing answered
    writer.close()


async def test_headers_finished_inside_the_header_timeout_are_served(start_app):
    server = await start_app(make_settings(header_timeout_s=1.0))
    reader, writer = await _connect(server.base_url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    await asyncio.sleep(0.5)  # half the timeout
    writer.write(b"Connection: close\r\n\r\n")
    await writer.drain()
    assert (await _read_all(reader)).startswith(b"HTTP/1.1 200 ")
    writer.close()


async def _post_slowly(base_url: str, body: bytes, declared: int, pause_s: float) -> bytes:
    reader, writer = await _connect(base_url)
    head = (b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (API_KEY.encode(), declared))
    writer.write(head + body[:10])
    await writer.drain()
    await asyncio.sleep(pause_s)
    writer.write(body[10:])
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)  # then aiohttp may linger
    writer.close()
    return head


BODY = json.dumps({"provider": "openai_chat", "model": "m", "request": {}}).encode()


async def test_body_not_received_within_the_body_timeout_is_408(start_app):
    server = await start_app(make_settings(body_timeout_s=0.4))
    answer = await _post_slowly(server.base_url, BODY[:20], len(BODY), 0.0)  # the rest never comes
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"Content-Type: " + PROBLEM in answer


async def test_body_received_inside_the_body_timeout_is_accepted(start_app):
    server = await start_app(make_settings(body_timeout_s=1.0))
    answer = await _post_slowly(server.base_url, BODY, len(BODY), 0.5)
    assert answer.startswith(b"HTTP/1.1 201 ")


async def _healthz(base_url: str) -> bytes:
    reader, writer = await _connect(base_url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        await writer.drain()
    except ConnectionResetError:
        return b""
    answer = await _read_all(reader)
    writer.close()
    return answer


async def test_socket_cap_counts_every_socket_and_refuses_one_past(start_app):
    server = await start_app(make_settings(max_sockets=3))
    silent = [await _connect(server.base_url) for _ in range(2)]
    assert (await _healthz(server.base_url)).startswith(b"HTTP/1.1 200 ")  # the third socket: at the cap
    silent.append(await _connect(server.base_url))
    await asyncio.sleep(0.05)
    assert await _healthz(server.base_url) == b""  # the fourth: aborted before any byte is read
    for _, writer in silent:
        writer.close()
    for _ in range(200):
        if (answer := await _healthz(server.base_url)).startswith(b"HTTP/1.1 200 "):
            break
        await asyncio.sleep(0.01)
    assert answer.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("path", [b"/v1/streams/st_x/events", b"/healthz"])
async def test_malformed_authorization_header_is_a_problem_and_its_value_is_never_logged(start_app, caplog, path):
    caplog.set_level(logging.DEBUG)
    server = await start_app()
    reader, writer = await _connect(server.base_url)
    writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\x01tail\r\n\r\n" % path)
    await writer.drain()
    answer = await _read_all(reader)
    writer.close()
    assert answer.split(b" ")[1] == b"400"  # aiohttp answers an unparsed request as HTTP/1.0
    assert b"Content-Type: " + PROBLEM in answer
    assert b"sekrit" not in answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["status"] == 400
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.exc_info or ''}" for r in caplog.records)
    assert "sekrit" not in logged
    assert any("malformed request" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["Last-Event-ID", "Authorization"])
async def test_repeated_header_is_400(ctx, name):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    reader, writer = await _connect(ctx.server.base_url)
    auth = b"Authorization: Bearer %s\r\n" % API_KEY.encode()
    extra = auth if name == "Authorization" else b"Last-Event-ID: 0\r\n"
    writer.write(b"GET /v1/streams/%s/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sLast-Event-ID: 0\r\n%s\r\n"
                 % (ctx.sid.encode(), auth, extra))
    await writer.drain()
    answer = await _read_all(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    problem = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert problem["errors"] == [{"field": name, "detail": "sent more than once"}]


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/streams"), ("GET", "/v1/streams/{sid}"), ("GET", "/v1/streams/{sid}/events"),
    ("GET", "/v1/streams/{sid}/ui"), ("POST", "/v1/streams/{sid}/cancel"), ("POST", "/v1/streams/{sid}/tokens"),
])
async def test_repeated_authorization_is_400_on_every_route(ctx, method, path):
    """openapi.json lists this 400 on each of these routes (test_openapi checks the document)."""
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    reader, writer = await _connect(ctx.server.base_url)
    auth = b"Authorization: Bearer %s\r\n" % API_KEY.encode()
    body = b"{}" if method == "POST" else b""
    writer.write(b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n%s%s\r\n%s"
                 % (method.encode(), path.format(sid=ctx.sid).encode(), len(body), auth, auth, body))
    await writer.drain()
    answer = await _read_all(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    problem = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert problem["errors"] == [{"field": "Authorization", "detail": "sent more than once"}]


async def test_single_headers_are_accepted(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    headers = {**bearer(API_KEY), "Last-Event-ID": "0"}
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200


def test_parse_error_filter_drops_values_and_traceback_from_aiohttp_records():
    try:
        raise ValueError("Invalid header value char: b'Authorization: Bearer sekrit'")
    except ValueError as exc:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("10.0.0.1",), (type(exc), exc, exc.__traceback__))
    assert ParseErrorFilter().filter(record)
    assert "sekrit" not in record.getMessage()
    assert "ValueError" in record.getMessage()
    assert record.exc_info is None
    other = logging.LogRecord("aiohttp.server", logging.INFO, __file__, 1, "something else %s", ("kept",), None)
    ParseErrorFilter().filter(other)
    assert other.getMessage() == "something else kept"


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_parse_error_record_reaches_the_shared_log_handler_without_values(fmt):
    """aiohttp's own "Error handling request" record, logged as aiohttp logs it, through the process's handler."""
    install_log_filter()
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = logs.configure(logs.LogSettings(log_level="DEBUG", log_format=fmt), out)
    try:
        try:
            raise ValueError("Invalid header value char: b'Authorization: Bearer sekrit'")
        except ValueError as exc:
            logging.getLogger(SERVER_LOGGER).exception("Error handling request from %s", "10.0.0.1", exc_info=exc)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text = out.getvalue()
    assert "sekrit" not in text
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1
    if fmt == "json":
        line = json.loads(text)
        assert (line["level"], line["logger"]) == ("ERROR", SERVER_LOGGER)
        assert "exc" not in line
    else:
        assert re.match(rf"ts=\S+ level=ERROR logger={SERVER_LOGGER} ", text), text
    assert "malformed request (ValueError); values not logged" in text


def test_log_filter_is_installed_on_aiohttp_server_logger(server):
    assert any(isinstance(f, ParseErrorFilter) for f in logging.getLogger("aiohttp.server").filters)
