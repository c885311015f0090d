"""The shared log setup: settings from FANOUT_LOG_LEVEL / FANOUT_LOG_FORMAT, the two line formats, the root handler."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from schema import logs
from schema.cli import EXIT_USAGE, CommandError
from schema.settings import SettingsError

TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
LOGFMT_LINE = re.compile(rf"ts=({TS}) level=(DEBUG|INFO|WARNING|ERROR) logger=(\S+) (.*)")


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards."""
    logger = logging.getLogger()
    handlers, level = list(logger.handlers), logger.level
    yield logger
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
    logger.setLevel(level)


def emit(fmt: str, level: int, msg: str, *args: object, exc: BaseException | None = None) -> str:
    """Format one record of logger ``fanout.test`` with the ``fmt`` handler; return its text."""
    out = io.StringIO()
    handler = logs.make_handler(logs.LogSettings(log_format=fmt), out)
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    handler.handle(logging.LogRecord("fanout.test", level, __file__, 1, msg, args, exc_info))
    return out.getvalue()


def test_defaults_are_info_and_logfmt():
    assert logs.load({}) == logs.LogSettings(log_level="INFO", log_format="logfmt")


def test_variables_set_the_level_and_the_format():
    settings = logs.load({"FANOUT_LOG_LEVEL": "WARNING", "FANOUT_LOG_FORMAT": "json"})
    assert (settings.log_level, settings.log_format) == ("WARNING", "json")


def test_the_flag_overrides_the_variable():
    assert logs.load({"FANOUT_LOG_LEVEL": "DEBUG"}, log_level="ERROR").log_level == "ERROR"
    assert logs.load({"FANOUT_LOG_LEVEL": "DEBUG"}, log_level=None).log_level == "DEBUG"


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("FANOUT_LOG_LEVEL", "verbose", "one of DEBUG, INFO, WARNING, ERROR"),
    ("FANOUT_LOG_LEVEL", "warning", "one of DEBUG, INFO, WARNING, ERROR"),
    ("FANOUT_LOG_FORMAT", "xml", "one of logfmt, json"),
])
def test_a_bad_value_is_named_with_the_accepted_values(name, value, accepted):
    with pytest.raises(SettingsError) as caught:
        logs.load({name: value})
    assert str(caught.value) == f"bad configuration: {name}={value!r}: expected {accepted}"


def test_a_bad_value_is_a_usage_error_for_the_command_line(root):
    with pytest.raises(CommandError) as caught:
        logs.configure_from_env({"FANOUT_LOG_LEVEL": "loud"})
    assert caught.value.exit_status == EXIT_USAGE
    assert "FANOUT_LOG_LEVEL='loud'" in caught.value.message
    assert not [h for h in root.handlers if h.get_name() == logs.HANDLER_NAME]  # nothing installed


def test_logfmt_line_is_ts_level_logger_then_the_message():
    line = emit("logfmt", logging.WARNING, "event=x n=%d", 3)
    match = LOGFMT_LINE.fullmatch(line.rstrip("\n"))
    assert match, line
    assert match.group(2, 3, 4) == ("WARNING", "fanout.test", "event=x n=3")


def test_logfmt_escapes_control_characters_so_a_record_is_one_line():
    text = emit("logfmt", logging.INFO, "submitted stream %s (%s)", "st_1", "m\nts=forged level=ERROR\r\t\x1b[31m\x7f")
    assert text.count("\n") == 1  # the handler's terminator only
    match = LOGFMT_LINE.fullmatch(text.rstrip("\n"))
    assert match
    assert match.group(4) == r"submitted stream st_1 (m\nts=forged level=ERROR\r\t\x1b[31m\x7f)"


@pytest.mark.parametrize(("value", "written"), [
    ("gpt-4o", "gpt-4o"),
    ("gpt level=ERROR logger=x", '"gpt level=ERROR logger=x"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("a\\b", '"a\\\\b"'),
    ("one\ntwo\r", '"one\\ntwo\\r"'),
    ("", '""'),
])
def test_quoted_keeps_a_value_from_a_request_one_logfmt_value(value, written):
    assert logs.quoted(value) == written
    assert logs.logfmt_pairs(f"event=submitted model={logs.quoted(value)} provider=openai_chat") == {
        "event": "submitted", "model": value, "provider": "openai_chat"}


def test_logfmt_escaping_leaves_the_record_as_it_was():
    record = logging.LogRecord("fanout.test", logging.INFO, __file__, 1, "a%s", ("\nb",), None)
    logs.LogfmtFormatter().format(record)
    assert record.message == "a\nb"


def test_logfmt_timestamp_is_utc_with_milliseconds():
    record = logging.LogRecord("fanout.test", logging.INFO, __file__, 1, "m", None, None)
    record.created, record.msecs = 1_700_000_000.25, 250.0
    assert logs.timestamp(record) == "2023-11-14T22:13:20.250Z"


def test_logfmt_puts_a_traceback_on_the_following_lines():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        text = emit("logfmt", logging.ERROR, "event=failed", exc=exc)
    first, *rest = text.rstrip("\n").split("\n")
    assert LOGFMT_LINE.fullmatch(first)
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"


def test_json_line_holds_ts_level_logger_and_msg_only():
    text = emit("json", logging.INFO, "listening on %s", "http://127.0.0.1:1")
    assert text.endswith("\n")
    assert text.count("\n") == 1
    line = json.loads(text)
    assert set(line) == {"ts", "level", "logger", "msg"}
    assert re.fullmatch(TS, line["ts"])
    assert (line["level"], line["logger"], line["msg"]) == ("INFO", "fanout.test", "listening on http://127.0.0.1:1")


def test_json_gives_the_pairs_of_a_logfmt_message_as_fields():
    text = emit("json", logging.WARNING, 'event=append_refused stream_id=%s error=%s message="%s" level=x',
                "st_1", "SeqConflictError", 'seq 3 \\"stored\\"')
    line = json.loads(text)
    assert line["msg"] == ('event=append_refused stream_id=st_1 error=SeqConflictError '
                           'message="seq 3 \\"stored\\"" level=x')
    assert (line["event"], line["stream_id"], line["error"]) == ("append_refused", "st_1", "SeqConflictError")
    assert line["message"] == 'seq 3 "stored"'
    assert line["level"] == "WARNING"  # a pair never replaces a field of every line


@pytest.mark.parametrize("message", ["listening on http://127.0.0.1:1", "event=x and some prose",
                                     'event=x message="unterminated', "=x", ""])
def test_json_keeps_a_message_that_is_not_only_pairs_as_msg_alone(message):
    line = json.loads(emit("json", logging.INFO, "%s", message))
    assert set(line) == {"ts", "level", "logger", "msg"}
    assert line["msg"] == message


def test_json_exception_text_stays_on_the_one_line():
    try:
        raise RuntimeError("two\nlines")
    except RuntimeError as exc:
        text = emit("json", logging.ERROR, "event=failed", exc=exc)
    assert text.count("\n") == 1
    line = json.loads(text)
    assert line["msg"] == "event=failed"
    assert line["event"] == "failed"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert line["exc"].endswith("RuntimeError: two\nlines")


def test_json_keeps_non_ascii_text_readable():
    assert json.loads(emit("json", logging.INFO, "Καλημέρα"))["msg"] == "Καλημέρα"
    assert "Καλημέρα" in emit("json", logging.INFO, "Καλημέρα")


def test_configure_sets_the_root_level_and_replaces_only_its_own_handler(root):
    foreign = logging.NullHandler()  # e.g. the OpenTelemetry log handler
    root.addHandler(foreign)
    first, second = io.StringIO(), io.StringIO()
    logs.configure(logs.LogSettings(log_level="DEBUG"), first)
    logs.configure(logs.LogSettings(log_level="WARNING", log_format="json"), second)
    assert [h.get_name() for h in root.handlers].count(logs.HANDLER_NAME) == 1
    assert foreign in root.handlers
    assert root.level == logging.WARNING
    logging.getLogger("fanout.test").info("dropped")
    logging.getLogger("fanout.test").warning("kept")
    assert first.getvalue() == ""
    assert [json.loads(line)["msg"] for line in second.getvalue().splitlines()] == ["kept"]


def test_the_flag_accepts_exactly_the_levels():
    parser = argparse.ArgumentParser()
    logs.add_arguments(parser)
    assert parser.parse_args(["--log-level", "WARNING"]).log_level == "WARNING"
    assert parser.parse_args([]).log_level is None
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--log-level", "warning"])
    assert caught.value.code == EXIT_USAGE
