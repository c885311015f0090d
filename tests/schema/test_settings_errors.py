"""A bad setting is refused with the variable that set it, its value and what it accepts, never msgspec's words."""

from __future__ import annotations

import typing

import pytest

from publisher.settings import PublisherSettings
from schema.settings import SettingsError, load_settings
from worker.settings import WorkerSettings


@pytest.mark.parametrize(("name", "value", "why"), [
    ("FANOUT_READ_FIRST_PAGE", "0", "expected an integer >= 1"),
    ("FANOUT_READ_PAGE", "many", "expected an integer"),
    ("FANOUT_LIVE_BATCH_MS", "101", "<= 100"),
    ("FANOUT_LIVE_READ_MS", "1000.5", "<= 1000"),
    ("FANOUT_LIVE_READ_MS", "-1", ">= 0"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "-1", ">= 0"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "3600000.5", "<= 3600000"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "inf", "expected a finite number"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "nan", "expected a finite number"),
    ("FANOUT_SHUTDOWN_GRACE_S", "inf", "expected a finite number"),
    ("FANOUT_REDIS_TIMEOUT_S", "Infinity", "expected a finite number"),
    ("FANOUT_REDIS_TIMEOUT_S", "-inf", "expected a finite number"),
    ("FANOUT_REDIS_TIMEOUT_S", "0.099", ">= 0.1"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "1s", "expected a number"),
])
def test_a_bad_variable_is_named_with_its_value(name, value, why):
    with pytest.raises(SettingsError) as caught:
        load_settings(PublisherSettings, {name: value})
    message = str(caught.value)
    assert message.startswith(f"bad configuration: {name}={value!r}: ")
    assert why in message
    assert "$." not in message
    assert "Expected `" not in message


@pytest.mark.parametrize(("cls", "name", "value", "reason"), [
    (PublisherSettings, "FANOUT_DEV", "yes", "expected a boolean: 1, 0, true or false"),
    (PublisherSettings, "FANOUT_UVLOOP", "2", "expected a boolean: 1, 0, true or false"),
    (WorkerSettings, "FANOUT_CONCURRENCY", "abc", "expected an integer"),
    (WorkerSettings, "FANOUT_CONCURRENCY", "1.5", "expected an integer"),
    (WorkerSettings, "FANOUT_CONCURRENCY", "0", "expected an integer >= 1"),
    (WorkerSettings, "FANOUT_LEASE_S", "soon", "expected a number"),
    (WorkerSettings, "FANOUT_GEMINI_FRAMING", "xml", "expected one of sse, json_array"),
], ids=["bool-word", "bool-digit", "int-word", "int-fraction", "int-range", "float-word", "enum"])
def test_a_bad_value_says_what_the_variable_accepts(cls, name, value, reason):
    with pytest.raises(SettingsError) as caught:
        load_settings(cls, {name: value})
    assert str(caught.value) == f"bad configuration: {name}={value!r}: {reason}"


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("0", False), ("true", True), ("FALSE", False)])
def test_the_booleans_the_message_names_are_accepted(value, expected):
    assert load_settings(PublisherSettings, {"FANOUT_DEV": value}).dev is expected


@pytest.mark.parametrize("cls", [PublisherSettings, WorkerSettings])
def test_no_number_setting_takes_a_non_finite_value(cls):
    floats = [name for name, hint in typing.get_type_hints(cls).items() if "float" in str(hint)]
    assert floats
    for field in floats:
        with pytest.raises(SettingsError, match="expected a finite number"):
            load_settings(cls, {f"FANOUT_{field.upper()}": "inf"})


def test_the_redis_timeout_takes_its_lower_edge():
    assert load_settings(PublisherSettings, {"FANOUT_REDIS_TIMEOUT_S": "0.1"}).redis_timeout_s == 0.1


def test_a_finite_number_is_still_taken_where_its_text_looks_like_one():
    assert load_settings(PublisherSettings, {"FANOUT_REDIS_TIMEOUT_S": "1e3"}).redis_timeout_s == 1000.0
    assert load_settings(PublisherSettings, {"FANOUT_REDIS_PREFIX": "inf"}).redis_prefix == "inf"  # text, not a number


def test_a_bad_override_is_named_as_its_flag():
    with pytest.raises(SettingsError, match=r"bad configuration: --read-page=0: expected an integer >= 1"):
        load_settings(PublisherSettings, {}, read_page=0)


def test_a_flag_that_wins_over_its_variable_is_the_one_named():
    with pytest.raises(SettingsError) as caught:
        load_settings(WorkerSettings, {"FANOUT_CONCURRENCY": "4"}, concurrency=0)
    assert str(caught.value) == "bad configuration: --concurrency=0: expected an integer >= 1"


def test_the_prefix_flag_is_named_as_the_command_line_spells_it():
    with pytest.raises(SettingsError, match=r"bad configuration: --prefix=5: "):
        load_settings(WorkerSettings, {}, redis_prefix=5)


def test_the_edges_of_the_first_page_are_accepted():
    assert load_settings(PublisherSettings, {"FANOUT_READ_FIRST_PAGE": "1"}).read_first_page == 1
    assert load_settings(PublisherSettings, {}).read_first_page == 256


def test_the_edges_of_the_live_read_interval_are_accepted():
    assert load_settings(PublisherSettings, {"FANOUT_LIVE_READ_MS": "0"}).live_read_ms == 0
    assert load_settings(PublisherSettings, {"FANOUT_LIVE_READ_MS": "1000"}).live_read_ms == 1000
    assert load_settings(PublisherSettings, {}).live_read_ms == 10


def test_the_edges_of_the_read_ahead_hold_are_accepted():
    assert load_settings(PublisherSettings, {"FANOUT_READ_AHEAD_HOLD_MS": "0"}).read_ahead_hold_ms == 0  # no read-ahead
    assert load_settings(PublisherSettings, {"FANOUT_READ_AHEAD_HOLD_MS": "3600000"}).read_ahead_hold_ms == 3_600_000
    assert load_settings(PublisherSettings, {}).read_ahead_hold_ms == 1000


def test_a_value_outside_a_fixed_set_is_answered_with_the_accepted_values():
    with pytest.raises(SettingsError) as caught:
        load_settings(PublisherSettings, {"FANOUT_LIVE_PUBSUB": "CLASSIC"})
    assert str(caught.value) == ("bad configuration: FANOUT_LIVE_PUBSUB='CLASSIC': "
                                 "expected one of auto, classic, sharded")
