"""Every service logs through one set-up: text for a terminal, or JSON lines (time, level, logger, message and any
exception) for a log pipeline, chosen by --log-format / HOSS_LOG_FORMAT."""

from __future__ import annotations

import datetime
import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from hoss.logs import configure_logging
from hoss.settings import run_service
from workers.settings import WorkerSettings


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    """The root logger as it was before the test, whatever configure_logging did to it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


def lose_redis() -> None:
    raise ConnectionError("redis went away")


def test_json_lines_carry_time_level_logger_message_and_the_exception() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log = logging.getLogger("hoss.test")
    log.info("bound %s to %s", "pod-a", "node-1")
    try:
        lose_redis()
    except ConnectionError:
        log.exception("cannot reserve pod-b")
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("level", "logger", "message")} == {
        "level": "INFO", "logger": "hoss.test", "message": "bound pod-a to node-1"}
    assert datetime.datetime.fromisoformat(first["time"]).tzinfo is not None
    assert "exception" not in first
    assert second["level"] == "ERROR"
    assert second["exception"].startswith("Traceback")
    assert "ConnectionError: redis went away" in second["exception"]


def test_text_lines_and_the_level_are_as_set() -> None:
    out = io.StringIO()
    configure_logging("WARNING", "text", stream=out)
    logging.getLogger("hoss.test").info("not shown")
    logging.getLogger("hoss.test").warning("node-1 is full")
    (line,) = out.getvalue().splitlines()
    assert line.endswith(" WARNING hoss.test: node-1 is full")


def test_configuring_again_replaces_the_handler_instead_of_doubling_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", "text", stream=first)
    configure_logging("INFO", "json", stream=second)
    logging.getLogger("hoss.test").info("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


def test_a_service_started_with_log_format_json_logs_json(capsys: pytest.CaptureFixture[str]) -> None:
    async def serve(settings: WorkerSettings) -> int:
        logging.getLogger("workers.main").warning("worker %s started", settings.id)
        return 0

    assert run_service(WorkerSettings, ["--id=w1", "--log-format=json"], prog="hoss-worker", description="",
                       serve=serve) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert {"level": "WARNING", "logger": "workers.main", "message": "worker w1 started"}.items() <= lines[-1].items()
