"""Classifying Redis errors by their code, also where Redis 6.2 wraps an error raised inside a script."""

from __future__ import annotations

import pytest
import redis.exceptions as rex

from tests.conftest import client_for
from tests.redis_servers import redis_node
from worker.embedded_redis import redis_server_binary
from worker.storage import error_code, fault_kind, storage_reason

WRAPPED = "Error running script (call to f_ed1ad7c602f6004de28957ef3f877f27e1fa07b3): @user_script:12: "


@pytest.mark.parametrize(("message", "code", "kind"), [
    ("WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE", "permanent"),
    (WRAPPED + "WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE", "permanent"),
    (WRAPPED + "READONLY You can't write against a read only replica.", "READONLY", "transient"),
    (WRAPPED + "LOADING Redis is loading the dataset in memory", "LOADING", "transient"),
    (WRAPPED + "MISCONF Redis is configured to save RDB snapshots", "MISCONF", "pressure"),
    ("Error running script: not a code", "", "permanent"),
])
def test_the_code_inside_a_wrapped_script_error_decides(message: str, code: str, kind: str) -> None:
    exc = rex.ResponseError(message)
    assert error_code(exc) == code
    assert fault_kind(exc) == kind
    assert storage_reason(exc) == f"Redis answered {code or 'ERR'}"  # redis-py strips the generic ERR


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
