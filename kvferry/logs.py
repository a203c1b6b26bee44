"""How the serving processes (nodes and router) log: one handler on stderr, at the level asked for, as text
or as JSON lines, every line carrying the id of the request it was written for (kvferry/request_id.py).

JSON is what a log pipeline (Loki, Elasticsearch, Cloud Logging) parses without a pattern: one object a line,
`time`, `level`, `logger`, `message`, `request_id` when serving one, the fields a line was given
(`extra={"fields": {...}}`, e.g. the router's line per request) and `exception` with a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import orjson

from kvferry.request_id import current_request_id

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error")
LEVEL_ENV, FORMAT_ENV = "KVFERRY_LOG_LEVEL", "KVFERRY_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_id_part)s: %(message)s%(fields_part)s"


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=os.environ.get(LEVEL_ENV, "warning"),
                        help=f"default ${LEVEL_ENV}, else warning; info adds the router's line per request")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=os.environ.get(FORMAT_ENV, "text"),
                        help=f"text, or json: one object a line (default ${FORMAT_ENV}, else text)")


def configure_logging(level: LogLevel, log_format: LogFormat, stream: TextIO | None = None) -> None:
    """The root logger's one handler, on `stream` (default stderr). uvicorn's loggers propagate to it (the
    servers run with log_config=None)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(_with_request_id)
    handler.setFormatter(JsonFormatter() if log_format == "json" else _TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())


def _with_request_id(record: logging.LogRecord) -> bool:
    record.request_id = current_request_id()
    return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None) is not None:
            line["request_id"] = record.request_id
        line.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_id_part = f" [{request_id}]" if request_id else ""
        fields = getattr(record, "fields", None)
        record.fields_part = "".join(f" {key}={value}" for key, value in fields.items()) if fields else ""
        return super().format(record)
