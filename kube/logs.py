"""Logging: per-object prefixes, and text or JSON-lines output set up once at an entry point.

Modules log through ``logging.getLogger(__name__)``; code working on one object wraps that
logger with :func:`object_logger` so every line says which object it is about, as
``Pod ns/name: message``. With the JSON format the object is also a separate field.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Hashable, MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from .settings import LoggingSettings

__all__ = ["JsonFormatter", "ObjectLogger", "object_logger", "setup_logging"]

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class ObjectLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message with ``<kind> <key>: `` and records both as ``extra`` fields."""

    def __init__(self, logger: logging.Logger, kind: str, key: Hashable) -> None:
        super().__init__(logger, {"object_kind": kind, "object_key": str(key)})
        self.kind = kind
        self.key = key

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return f"{self.kind} {self.key}: {msg}", kwargs


def object_logger(logger: logging.Logger, kind: str, key: Hashable) -> ObjectLogger:
    """A logger whose lines are about the object ``key`` of kind ``kind``."""
    return ObjectLogger(logger, kind, key)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, the object, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attr in ("object_kind", "object_key"):
            value = getattr(record, attr, None)
            if value is not None:
                entry[attr.removeprefix("object_")] = value
        task = getattr(record, "taskName", None)  # Python >= 3.12
        if task:
            entry["task"] = task
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup_logging(
    settings: LoggingSettings | None = None, *, stream: TextIO | None = None
) -> logging.Handler:
    """Configure the root logger once, at an entry point; returns the handler it installed.

    Calling it again replaces the handler it installed before, not others (pytest's, say).
    """
    settings = settings or LoggingSettings()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_gpuferry", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._gpuferry = True  # type: ignore[attr-defined]
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(settings.level.upper())
    if settings.quiet_libraries:
        for name in ("aiohttp", "asyncio", "kubernetes_asyncio"):
            logging.getLogger(name).setLevel(logging.WARNING)
    return handler
