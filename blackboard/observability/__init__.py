"""Observability: logs, metrics, health endpoints and tracing (docs/observability.md).

A layer beside :mod:`blackboard.security`: it imports settings and protocol only; the
client, the SDK, the worker, search and the apps may import it. Importing it costs
nothing beyond the logging set-up: prometheus-client is loaded by the metrics and health
modules only.
"""

from __future__ import annotations

from blackboard.observability import tracing
from blackboard.observability.logs import (
    TEXT_FORMAT,
    JsonFormatter,
    configure_logging,
    progress_enabled,
)

# tracing: the module (its flag is read as ``tracing.enabled``); nothing of OpenTelemetry
# is imported until tracing is turned on.
__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging", "progress_enabled", "tracing"]
