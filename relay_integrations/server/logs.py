"""Structured logs: one JSON object per line, each carrying the request id it belongs to.

The request id is set once per request (``request_id.set(...)``) and every log record made
while that request runs carries it, including records of the relay::

    configure_logging("json", "info")
    log.info("request done", extra={"fields": {"status": 200, "seconds": 1.2}})
    # {"ts": "...", "level": "info", "logger": "relay_integrations.server", "msg": "request done",
    #  "request_id": "chatcmpl-...", "status": 200, "seconds": 1.2}

With several worker processes (``relaygen serve --workers N``) every record also carries the
``pid`` of the process that wrote it (``configure_logging("json", "info", with_pid=True)``), so
that the lines of the workers, which share one stderr, can be told apart.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "relay_request_id", default=None
)
log = logging.getLogger("relay_integrations.server")


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line, with the request id and the record's ``fields`` (and the
    process id, `with_pid`)."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.with_pid:
            entry["pid"] = record.process
        current = getattr(record, "request_id", None) or request_id.get()
        if current:
            entry["request_id"] = current
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines for a terminal: the request id and fields after the message (and
    the process id before it, `with_pid`)."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def format(self, record: logging.LogRecord) -> str:
        current = request_id.get()
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        line = f"{record.levelname:7} {record.getMessage()}"
        if self.with_pid:
            line = f"[{record.process}] {line}"
        return " ".join(part for part in (line, f"[{current}]" if current else "", fields) if part)


def configure_logging(fmt: str, level: str, *, with_pid: bool = False) -> None:
    """Send the server's, the relay's and uvicorn's logs to stderr in one format (`with_pid`:
    each record names the process that wrote it)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    handler.setFormatter(formatter(with_pid))
    for name in ("relay_integrations", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # the server logs each request itself
