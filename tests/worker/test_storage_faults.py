"""Classifying Redis failures (:mod:`infra.redis_faults`): redis-py's classes mapped back to codes, then the table."""

from __future__ import annotations

import pytest
import redis.exceptions as rex
from redis._parsers.base import BaseParser

from infra.redis_faults import classify, readiness_cause
from infra.storage import error_code, fault_kind, storage_reason
from tests.conftest import client_for
from tests.redis_servers import redis_node
from tools.embedded_redis import redis_server_binary

WRAPPED = "Error running script (call to f_ed1ad7c602f6004de28957ef3f877f27e1fa07b3): @user_script:12: "


@pytest.mark.parametrize(("message", "code", "kind"), [
    ("WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE", "permanent"),
    (WRAPPED + "WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE", "permanent"),
    (WRAPPED + "READONLY You can't write against a read only replica.", "READONLY", "transient"),
    (WRAPPED + "LOADING Redis is loading the dataset in memory", "LOADING", "transient"),
    (WRAPPED + "MISCONF Redis is configured to save RDB snapshots", "MISCONF", "pressure"),
    (WRAPPED + "NOREPLICAS Not enough good replicas to write.", "NOREPLICAS", "transient"),
    ("Error running script: not a code", "", "permanent"),
])
def test_the_code_inside_a_wrapped_script_error_decides(message: str, code: str, kind: str) -> None:
    exc = rex.ResponseError(message)
    assert error_code(exc) == code
    assert fault_kind(exc) == kind
    assert storage_reason(exc) == f"Redis answered {code or 'ERR'}"  # redis-py strips the generic ERR


REPLIES = {
    "BUSY": "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "NOREPLICAS": "NOREPLICAS Not enough good replicas to write.",
    "LOADING": "LOADING Redis is loading the dataset in memory",
    "TRYAGAIN": "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN": "CLUSTERDOWN The cluster is down",
    "MASTERDOWN": "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "READONLY": "READONLY You can't write against a read only replica.",
    "UNBLOCKED": "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
    "NOSCRIPT": "NOSCRIPT No matching script. Please use EVAL.",
}
"""Each transient refusal as Redis 7.0 words it (``server.c`` shared errors and the commands' pages)."""


@pytest.mark.parametrize("code", sorted(REPLIES))
def test_each_transient_reply_parsed_by_redis_py_is_transient(code: str) -> None:
    exc = BaseParser.parse_error(REPLIES[code])  # the class redis-py raises for this reply, message as it keeps it
    fault = classify(exc)
    assert (fault.kind, fault.code) == ("transient", code)


@pytest.mark.parametrize("code", sorted(BaseParser.EXCEPTION_CLASSES))
def test_every_code_redis_py_turns_into_a_class_is_mapped_back(code: str) -> None:
    exc = BaseParser.parse_error(f"{code} 3999 127.0.0.1:6381" if code in ("MOVED", "ASK") else f"{code} some text")
    fault = classify(exc)
    if code in ("WRONGPASS", "NOAUTH"):  # AuthenticationError: permanent, whichever code
        assert (fault.kind, fault.cause) == ("permanent", "authentication failed")
    else:
        assert fault.code == code


@pytest.mark.parametrize(("exc", "kind", "cause"), [
    (rex.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), "transient", "unreachable"),
    (rex.TimeoutError("Timeout reading from socket"), "transient", "no answer in time"),
    (TimeoutError(), "transient", "no answer in time"),
    (ConnectionResetError(104, "Connection reset by peer"), "transient", "unreachable"),
    (rex.ClusterError("TTL exhausted."), "transient", "cluster slot map unavailable"),
    (rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "pressure",
     "refuses writes: out of memory"),
    (rex.AuthenticationError("invalid username-password pair or user is disabled."), "permanent",
     "authentication failed"),
    (rex.ResponseError("FROBNICATED by a module"), "permanent", "unknown refusal"),
    (rex.DataError("Invalid input of type: 'NoneType'"), "permanent", "client error"),
])
def test_failures_without_a_code_of_their_own(exc: BaseException, kind: str, cause: str) -> None:
    assert (classify(exc).kind, classify(exc).cause) == (kind, cause)


def test_the_readiness_cause_names_the_code_and_never_the_text() -> None:
    assert readiness_cause(rex.ResponseError(REPLIES["NOREPLICAS"])) == ("replicas missing (NOREPLICAS)", "transient")
    cause, kind = readiness_cause(rex.ConnectionError("Error 111 connecting to 10.1.2.3:6380. Connection refused."))
    assert (cause, kind) == ("unreachable", "transient")


async def test_a_redis_6_2_script_error_is_read_through_its_wrapper() -> None:
    with redis_node(binary=redis_server_binary()) as server:
        client = client_for(server.url)
        try:
            assert str((await client.info("server"))["redis_version"]).startswith("6.2.")
            await client.set("k", "not a stream")
            with pytest.raises(rex.ResponseError) as caught:
                await client.eval("return redis.call('XADD', KEYS[1], '0-1', 'e', 'x')", 1, "k")
            assert str(caught.value).startswith("Error running script")  # the 6.2 shape this module unwraps
            assert error_code(caught.value) == "WRONGTYPE"
        finally:
            await client.aclose()
