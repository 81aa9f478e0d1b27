"""How every hoss service logs: one handler on the root logger, writing to stderr as plain text or as JSON lines.

Text is for a person reading a terminal; JSON is for a log pipeline: one object per line with ``time`` (UTC, ISO
8601), ``level``, ``logger`` and ``message``, and ``exception`` (the formatted traceback) when the record carries
one. Either way a record is one event, written once.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Literal, TextIO

import orjson

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line).decode()


class _ServiceHandler(logging.StreamHandler[TextIO]):
    """The handler `configure_logging` installs; told apart from handlers others put on the root logger."""


def configure_logging(level: LogLevel, fmt: LogFormat, *, stream: TextIO | None = None) -> None:
    """Log records of ``level`` and above from every logger to ``stream`` (stderr) in ``fmt``.

    Calling it again replaces the handler it installed before, so a process never writes a record twice; handlers
    others added to the root logger stay.
    """
    handler = _ServiceHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ServiceHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
