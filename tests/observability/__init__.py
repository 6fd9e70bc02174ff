"""Tests of logs, metrics, health endpoints and tracing (docs/observability.md)."""
