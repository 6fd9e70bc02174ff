"""The persistence worker: JetStream -> PostgreSQL, embeddings, and the search service."""

from blackboard.worker.decode import DeadLetter, EntryRow, MemoryRow, RawMessage
from blackboard.worker.embedder import Embedder, EmbeddingProvider, load_provider
from blackboard.worker.handlers import StreamHandler, default_handlers
from blackboard.worker.ingest import ConsumerLag, IngestLoop
from blackboard.worker.runner import Worker, run_worker

__all__ = [
    "ConsumerLag",
    "DeadLetter",
    "Embedder",
    "EmbeddingProvider",
    "EntryRow",
    "IngestLoop",
    "MemoryRow",
    "RawMessage",
    "StreamHandler",
    "Worker",
    "default_handlers",
    "load_provider",
    "run_worker",
]
