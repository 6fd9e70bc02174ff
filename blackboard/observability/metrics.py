"""The worker's Prometheus metrics (docs/observability.md has the table of names).

Each worker holds a :class:`WorkerMetrics` of its own, on a registry of its own (never
prometheus-client's global one: several workers may share a process, as in the tests).
Counters and histograms are moved where the work happens (ingest, the embedder, the
vote committer, the search service); the gauges (lag, backlog, consumer counts) are
read when ``/metrics`` is scraped (:class:`~blackboard.observability.health.ObservabilityServer`
calls the worker's refresh first), so an idle worker does no work for them.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["METRICS_CONTENT_TYPE", "WorkerMetrics", "dead_letter_reason"]

#: The content type of :meth:`WorkerMetrics.render` (Prometheus text format).
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Latency buckets (seconds) of batches and searches: 1 ms to 10 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def dead_letter_reason(reason: str) -> str:
    """The label of a dead letter's reason (a bounded set; the row in ``bb_dead_letters``
    keeps the full text): ``signature_<verdict>`` (e.g. ``signature_bad_signature``),
    ``unexpected`` (an exception no decoder names: a bug), ``refused`` (PostgreSQL refused
    the row) or ``invalid`` (the payload does not decode or validate)."""
    if reason.startswith("signature "):
        verdict = reason[len("signature "):].split(":", 1)[0].strip()
        return "signature_" + "".join(c if c.isalnum() else "_" for c in verdict)[:32]
    if reason.startswith("unexpected "):
        return "unexpected"
    if reason.startswith("refused by PostgreSQL"):
        return "refused"
    return "invalid"


class WorkerMetrics:
    """One worker's metrics, on :attr:`registry`.

    Args:
        registry: where they are registered (default: a new registry of their own).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        # -- ingest ----------------------------------------------------------------------
        self.ingest_messages = Counter("blackboard_ingest_messages", "Messages ingested (stored or dead-lettered)",
                                       ["stream"], registry=r)
        self.ingest_rows = Counter("blackboard_ingest_rows", "Messages stored in PostgreSQL", ["stream"], registry=r)
        self.ingest_batch_seconds = Histogram("blackboard_ingest_batch_seconds",
                                              "Seconds from a batch's fetch to its commit and ack",
                                              ["stream"], buckets=_BUCKETS, registry=r)
        self.dead_letters = Counter("blackboard_dead_letters", "Messages dead-lettered, by reason",
                                    ["stream", "reason"], registry=r)
        self.ingest_retries = Counter("blackboard_ingest_retries",
                                      "Batches retried (PostgreSQL unavailable)", ["stream"], registry=r)
        self.consumer_pending = Gauge("blackboard_consumer_pending",
                                      "Messages not yet delivered to the worker group (lag)",
                                      ["stream", "consumer"], registry=r)
        self.consumer_ack_pending = Gauge("blackboard_consumer_ack_pending",
                                          "Messages delivered and not yet acknowledged",
                                          ["stream", "consumer"], registry=r)
        self.consumer_max_ack_pending = Gauge("blackboard_consumer_max_ack_pending",
                                              "The consumer's limit of unacknowledged messages",
                                              ["stream", "consumer"], registry=r)
        # -- streams and the account ---------------------------------------------------------
        self.stream_consumers = Gauge("blackboard_stream_consumers", "Consumers of a stream (every client's)",
                                      ["stream"], registry=r)
        self.stream_messages = Gauge("blackboard_stream_messages", "Messages a stream holds", ["stream"],
                                     registry=r)
        self.account_consumers = Gauge("blackboard_account_consumers",
                                       "JetStream consumers of the worker's account", registry=r)
        self.account_consumer_limit = Gauge("blackboard_account_consumer_limit",
                                            "The account's limit of consumers (-1: none)", registry=r)
        # -- embedding -------------------------------------------------------------------
        self.embedding_backlog = Gauge("blackboard_embedding_backlog",
                                       "Items waiting for an embedding (queue: leased by the embedder; "
                                       "inbox: handed over by ingest)", ["stage"], registry=r)
        self.embedded = Counter("blackboard_embedded_items", "Items embedded and written", registry=r)
        self.embedding_failures = Counter("blackboard_embedding_failures", "Items the model failed on",
                                          registry=r)
        # -- search ----------------------------------------------------------------------
        self.search_seconds = Histogram("blackboard_search_seconds",
                                        "Seconds to answer a search service request, by endpoint and mode",
                                        ["endpoint", "mode"], buckets=_BUCKETS, registry=r)
        self.search_errors = Counter("blackboard_search_errors", "Search service requests answered with an error",
                                     ["endpoint", "error"], registry=r)
        # -- votes -----------------------------------------------------------------------
        self.vote_commits = Counter("blackboard_vote_commits", "Vote outcomes committed", registry=r)
        self.vote_deadline_expiries = Counter("blackboard_vote_deadline_expiries",
                                              "Proposals closed at their deadline (close requests)", registry=r)
        self.vote_open_proposals = Gauge("blackboard_vote_open_proposals",
                                         "Proposals followed without a committed outcome", registry=r)
        # -- the process -----------------------------------------------------------------
        self.ready = Gauge("blackboard_ready", "1 when /readyz answers ready", registry=r)
        self.nats_connected = Gauge("blackboard_nats_connected", "1 while connected to NATS", registry=r)

    def ingested(self, stream: str, messages: int, rows: int, dead_reasons: Iterable[str], seconds: float) -> None:
        """Count one ingested batch of ``stream``: its messages, stored rows, dead letters
        (by their reason's text) and its latency."""
        self.ingest_messages.labels(stream).inc(messages)
        if rows:
            self.ingest_rows.labels(stream).inc(rows)
        for reason in dead_reasons:
            self.dead_letters.labels(stream, dead_letter_reason(reason)).inc()
        self.ingest_batch_seconds.labels(stream).observe(seconds)

    def render(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return generate_latest(self.registry)
