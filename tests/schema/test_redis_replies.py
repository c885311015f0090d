"""The table of Redis error replies: codes read from reply texts, and each code's kind."""

from __future__ import annotations

import re

import pytest

from schema.redis_replies import REPLY_RULES, UNKNOWN_RULE, reply_code, rule_for

WRAPPED_6_2 = "Error running script (call to f_ed1ad7c602f6004de28957ef3f877f27e1fa07b3): @user_script:12: "
SCRIPT_7_0 = " script: fe63ed36924e6070ea742f63256e8c26a2c6406b, on @user_script:1."


@pytest.mark.parametrize(("text", "code"), [
    ("NOREPLICAS Not enough good replicas to write.", "NOREPLICAS"),
    ("NOREPLICAS Not enough good replicas to write." + SCRIPT_7_0, "NOREPLICAS"),  # raised inside a script, 7.0
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", "BUSY"),
    (WRAPPED_6_2 + "WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE"),
    ("ERR " + WRAPPED_6_2 + "READONLY You can't write against a read only replica.", "READONLY"),
    ("ERR unknown command 'FOO'", "ERR"),
    ("no such key", ""),  # redis-py strips the generic ERR
    ("Error running script: not a code", ""),
    ("", ""),
    ("  UNBLOCKED the stream key no longer exists", "UNBLOCKED"),
])
def test_the_code_is_the_first_uppercase_word_also_inside_a_script_error(text: str, code: str) -> None:
    assert reply_code(text) == code


@pytest.mark.parametrize("code", ["NOREPLICAS", "BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY"])
def test_every_refusal_a_retry_cures_is_transient(code: str) -> None:
    assert rule_for(code).kind == "transient"


@pytest.mark.parametrize(("code", "kind"), [
    ("OOM", "pressure"), ("MISCONF", "pressure"), ("WRONGTYPE", "permanent"), ("NOPERM", "permanent"),
    ("MOVED", "permanent"), ("ERR", "permanent"), ("", "permanent"),
])
def test_pressure_and_permanent_codes(code: str, kind: str) -> None:
    assert rule_for(code).kind == kind


def test_an_unknown_code_is_permanent_and_says_so() -> None:
    assert rule_for("FROBNICATED") is UNKNOWN_RULE
    assert UNKNOWN_RULE.kind == "permanent"


def test_every_cause_is_short_and_names_no_address() -> None:
    for code, rule in REPLY_RULES.items():
        assert 0 < len(rule.cause) <= 40, code
        assert not re.search(r"\d|://|:\d", rule.cause), code
