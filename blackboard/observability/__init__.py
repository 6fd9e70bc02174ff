"""Observability: logs, metrics, health endpoints and tracing (docs/observability.md).

A layer beside :mod:`blackboard.security`: it imports settings and protocol only; the
client, the SDK, the worker, search and the apps may import it. Importing it costs
nothing beyond the logging set-up: prometheus-client is loaded by the metrics and health
modules only.
"""

from __future__ import annotations

from blackboard.observability.logs import (
    TEXT_FORMAT,
    JsonFormatter,
    configure_logging,
    progress_enabled,
)

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging", "progress_enabled"]
