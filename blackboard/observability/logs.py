"""Log set-up of the entry points (the worker, the CLI): level and format from settings.

``text`` writes one line an event (``time level logger: message``); ``json`` writes one
JSON object a line for log shippers, with the fields ``ts`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, ``exc`` (a traceback, when there is one) and any ``extra=`` fields
the call passed. Progress bars are drawn only on a terminal (``observability.progress``):
a log file gets one line per step instead (see :func:`progress_enabled`).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

from blackboard.settings import ObservabilitySettings

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging", "progress_enabled"]

#: The ``text`` format of a log line.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The attributes every :class:`logging.LogRecord` has: anything else was passed as ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, ``exc``, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in out:
                out[name] = value
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(settings: ObservabilitySettings, *, level: int | str | None = None,
                      stream: IO[str] | None = None, force: bool = True) -> logging.Handler | None:
    """Send the process's logs to ``stream`` (stderr) at ``settings.log_level`` in
    ``settings.log_format`` (an entry point's job: a library never calls this).

    Args:
        settings: the ``observability`` section.
        level: overrides ``settings.log_level`` (a command's ``-v``).
        stream: where the lines go (default: ``sys.stderr``).
        force: replace the root logger's handlers; when False, do nothing if it already has
            some (like :func:`logging.basicConfig`: an application embedding the CLI, or a
            test runner, configured logging already).

    Returns:
        The handler installed on the root logger (None: left as it was).
    """
    root = logging.getLogger()
    if root.handlers and not force:
        return None
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else logging.Formatter(TEXT_FORMAT))
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if level is not None else settings.log_level)
    return handler


def progress_enabled(mode: Literal["auto", "always", "never"], stream: IO[str] | None = None) -> bool:
    """Whether to draw a progress bar on ``stream`` (default: stderr): ``auto`` only when it
    is a terminal, so that a log never fills with a bar's redraws."""
    if mode != "auto":
        return mode == "always"
    out = stream if stream is not None else sys.stderr
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
