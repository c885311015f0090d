"""A bad setting is refused with the variable that set it and its value, never msgspec's field path."""

from __future__ import annotations

import pytest

from publisher.settings import PublisherSettings
from schema.settings import SettingsError, load_settings


@pytest.mark.parametrize(("name", "value", "why"), [
    ("FANOUT_READ_FIRST_PAGE", "0", ">= 1"),
    ("FANOUT_READ_PAGE", "many", "Expected `int`"),
    ("FANOUT_LIVE_BATCH_MS", "101", "<= 100"),
    ("FANOUT_LIVE_READ_MS", "1000.5", "<= 1000"),
    ("FANOUT_LIVE_READ_MS", "-1", ">= 0"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "-1", ">= 0"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "3600000.5", "<= 3600000"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "inf", "<= 3600000"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "nan", ">= 0"),
    ("FANOUT_READ_AHEAD_HOLD_MS", "1s", "Expected `float`"),
])
def test_a_bad_variable_is_named_with_its_value(name, value, why):
    with pytest.raises(SettingsError) as caught:
        load_settings(PublisherSettings, {name: value})
    message = str(caught.value)
    assert message.startswith(f"bad configuration: {name}={value!r}: ")
    assert why in message
    assert "$." not in message


def test_a_bad_override_is_named_as_its_field():
    with pytest.raises(SettingsError, match=r"read_page=0: Expected `int` >= 1"):
        load_settings(PublisherSettings, {}, read_page=0)


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
    assert str(caught.value) == ("bad configuration: FANOUT_LIVE_PUBSUB='CLASSIC': Invalid enum value 'CLASSIC'; "
                                 "one of auto, classic, sharded")
