"""One settings object for the server side and the SDK.

Built once at an entry point (CLI, worker, ``Agent.connect``) and passed down;
nothing else in the code base reads the environment. Environment variables use
the ``BLACKBOARD_`` prefix and ``__`` for nesting, e.g.
``BLACKBOARD_NATS__URL=nats://10.0.0.5:4222`` or
``BLACKBOARD_EMBEDDING__PROVIDER=openai``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The most embedding dimensions a space can index (pgvector's HNSW limit for ``halfvec``).
MAX_DIMENSIONS = 4000

__all__ = [
    "MAX_DIMENSIONS",
    "BoardSettings",
    "CliSettings",
    "DevSettings",
    "EmbeddingSettings",
    "LLMSettings",
    "MessagingSettings",
    "NatsSettings",
    "PostgresSettings",
    "SearchSettings",
    "SecuritySettings",
    "Settings",
    "WorkerSettings",
    "describe_errors",
]

_SYNC_RE = re.compile(r"^(always|\d+(ms|s|m|h))$")
_ACCOUNT_KEY_RE = re.compile(r"A[A-Z2-7]{55}")


class NatsSettings(BaseModel):
    """How to reach NATS and how the embedded server persists."""

    #: NATS server URL(s), comma-separated for a cluster: ``nats://``,
    #: ``tls://``, ``ws://`` or ``wss://`` (``host:port`` means ``nats://``).
    url: str = "nats://127.0.0.1:4222"
    #: NATS user name (with ``password``).
    user: str | None = None
    #: NATS password.
    password: SecretStr | None = None
    #: NATS auth token.
    token: SecretStr | None = None
    #: NATS credentials file (``.creds``: user JWT + nkey seed) of this process's identity.
    #: ``Agent.connect(..., credentials=...)`` wins over it; see docs/security.md.
    creds_file: Path | None = None
    #: A directory of ``<id>.creds`` files (one per identity); an agent takes ``<agent id>.creds``.
    #: Searched after ``creds_file``; then ``<dev.data_dir>/auth/creds`` (what ``blackboard dev`` writes).
    credentials_dir: Path | None = None
    #: CA certificate (PEM) to verify the NATS server's TLS certificate with (``tls://`` URLs).
    #: None: the system's CAs, or ``<credentials dir>/ca.pem`` when the credential came from a
    #: directory that holds one (what ``blackboard dev`` writes).
    tls_ca_file: Path | None = None
    #: DEV ONLY, INSECURE: connect without any credential to a server that runs without
    #: authorization, where any process can act as any agent, read every board and erase
    #: data. Never set it for a shared or production deployment (docs/security.md).
    insecure_open_bus: bool = False
    #: Seconds one connection attempt may take.
    connect_timeout: float = Field(2.0, gt=0)
    #: Seconds a request (a get, an API call) may take; reads retry until ``write_timeout``.
    request_timeout: float = Field(5.0, gt=0)
    #: Seconds a write keeps being sent again (same ``Nats-Msg-Id``) through an
    #: outage or a leader election before raising ``NotConnectedError`` (not
    #: connected) or ``OperationTimeoutError``. 0 fails at once. The default
    #: outlasts the worst stream-leader election (nats-server's Raft election
    #: timeout is 4-9 s, not a setting) twice over with margin, so no write
    #: fails while one node of three dies; at most 110, so that re-sends stay
    #: inside the streams' 2-minute duplicate window. See docs/operations.md.
    write_timeout: float = Field(30.0, ge=0, le=110)
    #: Seconds one attempt of a write waits for its ack, while connected,
    #: before the write is sent again with the same ``Nats-Msg-Id`` (a write
    #: in flight on a connection that is replaced is sent again at once): a
    #: write goes through within about this long of the server or a new
    #: stream leader being able to take it.
    write_attempt_timeout: float = Field(1.0, gt=0)
    #: Seconds between reconnect attempts.
    reconnect_time_wait: float = Field(0.25, gt=0)
    #: Attempts per server of the first connect before ``NotConnectedError``.
    connect_attempts: int = Field(3, ge=1)
    #: Reconnect attempts after a connection was lost; -1 reconnects forever.
    max_reconnect_attempts: int = -1
    #: JetStream fsync policy of the embedded server (``sync_interval``).
    #: ``always`` fsyncs every message before acknowledging it (measured here:
    #: ~20x slower pipelined writes); a duration fsyncs that often, so an OS
    #: crash or power loss can lose up to that much acknowledged data (a killed
    #: server process loses nothing: the data is in the OS page cache). The
    #: nats-server default is 2m; the dev default bounds the window to 1s. Use
    #: ``always`` (or R3 clusters) where acknowledged writes must survive power
    #: loss. See docs/operations.md.
    sync_interval: str = "1s"
    #: Maximum acknowledged-but-unfinished writes of the pipelined write path.
    max_pending_writes: int = Field(4000, ge=1)
    #: Seconds the streams remember a ``Nats-Msg-Id`` to drop a duplicate write
    #: (their ``duplicate_window``; applied by ``ensure_streams``). Must exceed
    #: ``write_timeout`` (re-sends are deduplicated) and twice ``security.max_clock_skew``
    #: (a replayed signed write is dropped within it and ``stale`` after it).
    duplicate_window: float = Field(120.0, gt=0)

    @field_validator("sync_interval")
    @classmethod
    def _check_sync(cls, value: str) -> str:
        if not _SYNC_RE.match(value):
            raise ValueError("sync_interval must be 'always' or a duration like '500ms', '10s', '2m'")
        return value


class BoardSettings(BaseModel):
    """The one KV bucket that holds every board."""

    #: Name of the KV bucket holding every board (stream ``KV_<bucket>``).
    bucket: str = Field("blackboard", pattern=r"^[A-Za-z0-9_-]+$")
    #: Revisions kept per key (JetStream KV allows at most 64).
    history: int = Field(64, ge=1, le=64)
    #: Stream replicas (3 in a production cluster).
    replicas: int = Field(1, ge=1, le=5)
    #: Largest encoded entry in bytes (the envelope, not just the value).
    max_value_size: int = Field(1024 * 1024, ge=1024)
    #: Allow per-entry TTLs (needs nats-server 2.11+).
    allow_ttl: bool = True
    #: Seconds the server keeps the delete marker it places when an entry's
    #: TTL expires (watches and views see the key go; readers treat the marker
    #: as a purge). nats-server raises any shorter entry TTL to this value.
    #: 0 (the default) places no markers: nats-server turns rollups and purges
    #: back ON for a stream with markers, and then any agent allowed to write
    #: one key could erase every board with one ``Nats-Rollup: all``
    #: (docs/security.md). Without markers an expired entry leaves the board
    #: (reads, the worker) but a live view learns it only from the entry's TTL.
    expiry_marker_ttl: float = Field(0.0, ge=0)
    #: Object store bucket for large binaries.
    objects_bucket: str = Field("blackboard-objects", pattern=r"^[A-Za-z0-9_-]+$")


class PostgresSettings(BaseModel):
    """PostgreSQL + pgvector, used by the worker (agents never connect to it)."""

    #: PostgreSQL connection string (the worker's database, as the non-superuser application
    #: role; the password from the DSN, PGPASSWORD or ~/.pgpass; docs/operations.md).
    dsn: SecretStr = SecretStr("postgresql://blackboard@127.0.0.1:5433/blackboard")
    #: Smallest connection pool of a worker.
    pool_min: int = Field(1, ge=0)
    #: Largest connection pool of a worker; a worker serving search opens a
    #: second pool of this size for it (up to 2 x pool_max connections).
    pool_max: int = Field(8, ge=1)
    #: Seconds to wait for a connection (start-up, pool checkout).
    connect_timeout: float = Field(10.0, gt=0)


class EmbeddingSettings(BaseModel):
    """The embedding model of the worker (memories and entries, search queries)."""

    #: ``local`` (offline MiniLM, shipped in a pip package) or ``openai``
    #: (any OpenAI-compatible embeddings API).
    provider: Literal["local", "openai"] = "local"
    #: Model name (the local provider has one model).
    model: str = "all-MiniLM-L6-v2"
    #: Vector dimensions (must match the model; ``blackboard reindex`` after a change).
    #: At most 4,000: the HNSW index is built on ``halfvec`` (``blackboard/db/spaces.py``).
    dimensions: int = Field(384, ge=1, le=MAX_DIMENSIONS)
    #: API base URL of the openai provider (None: api.openai.com).
    base_url: str | None = None
    #: API key of the openai provider.
    api_key: SecretStr | None = None
    #: Texts per embedding call.
    batch_size: int = Field(64, ge=1)
    #: Retries (exponential back-off) on 429 and 5xx answers.
    max_retries: int = Field(5, ge=0)
    #: Seconds one embeddings API request may take (openai provider).
    timeout: float = Field(30.0, gt=0)
    #: Send ``dimensions`` with each request (openai provider); turn off for
    #: OpenAI-compatible servers that reject the parameter.
    send_dimensions: bool = True
    #: onnxruntime intra-op threads of each local model call (0: onnxruntime
    #: picks, one per core).
    threads: int = Field(1, ge=0)
    #: Local model calls at once (0: the process's cores divided by
    #: ``threads``). On 2 cores, independent one-thread calls embedded
    #: 1.1-1.3x the texts/s of one call at a time on two threads, and 1.5x
    #: with another process busy on the side (LocalProvider).
    parallel: int = Field(0, ge=0)
    #: The local provider embeds search queries with a dynamically quantised
    #: copy of the model (int8; made from the packaged model on first use and
    #: cached in ~/.cache/blackboard; one text per call, one thread): ~2x
    #: faster per query, the same LoCoMo recall against the stored vectors.
    quantized_queries: bool = True


class LLMSettings(BaseModel):
    """OpenAI-compatible chat model (summarizing condenser, example agents)."""

    #: Chat model name.
    model: str = "gpt-4o-mini"
    #: API base URL (any OpenAI-compatible server).
    base_url: str | None = None
    #: API key.
    api_key: SecretStr | None = None
    #: Seconds one chat completion may take.
    timeout: float = Field(60.0, gt=0)


class WorkerSettings(BaseModel):
    """The persistence worker (``blackboard worker``)."""

    #: Worker name: a label in logs, the NATS and PostgreSQL connection
    #: names and the status endpoint (any name; it does not decide which
    #: messages the worker gets: ``group`` does).
    name: str = Field("worker", pattern=r"^[A-Za-z0-9_-]+$")
    #: Consumer group: workers of one group share its durable consumers
    #: (``<group>-entries``, ``-memories``, ...) and split the messages
    #: between them, whatever their names; a worker of another group gets
    #: every message again (e.g. a second database). Changing it starts new
    #: consumers at the beginning of the streams.
    group: str = Field("worker", pattern=r"^[A-Za-z0-9_-]+$")
    #: Messages fetched and written per transaction.
    batch_size: int = Field(512, ge=1)
    #: Seconds to wait for a batch to fill.
    batch_wait: float = Field(0.05, gt=0)
    #: Concurrent write transactions per stream (for streams whose writer
    #: allows it): PostgreSQL writes one batch while the next is decoded.
    ingest_writers: int = Field(2, ge=1, le=16)
    #: Compute embeddings in this worker.
    embed: bool = True
    #: Seconds between deadline checks of open proposals.
    deadline_interval: float = Field(0.5, gt=0)
    #: Seconds the worker's vote committer leaves a recorded but unapplied
    #: outcome to the committer that recorded it before finishing the commit
    #: itself (and, on an insecure open bus, a decided one to the agents).
    vote_commit_grace: float = Field(2.0, ge=0)
    #: Longest back-off while Postgres is unavailable.
    max_backoff: float = Field(5.0, gt=0)
    #: Seconds JetStream waits for an ack before redelivering (a killed
    #: worker's unacknowledged batch comes back after this).
    ack_wait: float = Field(30.0, gt=0)
    #: Unacknowledged messages a consumer may have out at once (all workers).
    max_ack_pending: int = Field(20000, ge=1)
    #: Messages larger than this go to the dead-letter table (None: the
    #: bucket's max_value_size).
    max_message_bytes: int | None = Field(None, ge=1)
    #: Characters of an item's text that are indexed for keyword search.
    max_index_chars: int = Field(100_000, ge=1000)
    #: Seconds between lag reports in the log.
    lag_interval: float = Field(10.0, gt=0)
    #: Seconds between polls of the embedding queue when idle.
    embed_poll: float = Field(1.0, gt=0)
    #: Seconds a batch of the embedding queue stays leased to the worker that took it: a worker
    #: that dies holding one leaves it to the others after this (longer than a batch's embedding).
    embed_lease: float = Field(120.0, gt=0)
    #: Items per embedding batch (None: the provider's batch_size).
    embed_batch_size: int | None = Field(None, ge=1)
    #: PostgreSQL's ``maintenance_work_mem`` for the HNSW index builds of
    #: ``blackboard reindex``: the graph is built in memory when it fits, far
    #: faster than on disk. A parallel build takes it as shared memory
    #: (``/dev/shm``; a serial build follows if that fails: docs/operations.md).
    index_build_memory: str = Field("1GB", pattern=r"^[1-9][0-9]*\s*(kB|MB|GB|TB)$")
    #: Serve the search micro service from the worker process.
    serve_search: bool = True
    #: Verify each ingested record's signature (docs/security.md, "Signatures");
    #: a record that does not verify goes to the dead-letter table.
    verify: bool = True
    #: Threads that check signatures of a batch (PyNaCl releases the GIL); 0: in the event loop's thread.
    verify_threads: int = Field(2, ge=0, le=64)
    #: Dead-letter unsigned records too (when false, or when the worker has no
    #: credential, i.e. an open bus, they are stored with the verdict ``unsigned``).
    require_signatures: bool = True


class MemorySettings(BaseModel):
    """The lifecycle of long-term memories, run by the worker (docs/memory-lifecycle.md):
    deduplication and consolidation, supersession, importance and pruning."""

    #: Merge exact duplicates at ingest: a new memory whose normalised text is that
    #: of a live memory of its scope becomes a source of that memory, not a row.
    dedup: bool = True
    #: A scope is a board and an agent (each agent's memories merged only with its
    #: own), not a board.
    dedup_per_agent: bool = False
    #: Merge near-duplicates after embedding (cosine at or above near_threshold,
    #: same scope, same embedding space, no different subject keys).
    near_duplicates: bool = True
    #: Cosine similarity from which two memories are near-duplicates.
    near_threshold: float = Field(0.95, gt=0, le=1)
    #: Seconds between the consolidator's passes over newly embedded memories.
    consolidate_interval: float = Field(2.0, gt=0)
    #: Merge near-duplicates' texts into one with the chat model (``llm.base_url``
    #: set); otherwise the older memory's text is kept.
    llm_merge: bool = False
    #: Memories of these kinds are turned into atomic facts (``semantic``
    #: memories the worker writes and signs) by the chat model (``llm.base_url`` set).
    llm_extract_kinds: list[Literal["episodic", "semantic", "procedural", "knowledge", "summary"]] = []  # MemoryKind's values (settings import nothing of ours)
    #: What a newer memory on a subject key does to the current one when their
    #: texts differ: ``supersede`` it, or open a ``vote`` between them on boards
    #: matching vote_boards (all boards when empty) and supersede with the winner.
    contradictions: Literal["supersede", "vote"] = "supersede"
    #: Board name globs whose contradictions go to a vote (contradictions = vote).
    vote_boards: list[str] = []
    #: Seconds a contradiction's vote stays open.
    vote_deadline: float = Field(300.0, gt=0)
    #: Weight of recency in the importance score (docs/memory-lifecycle.md, "Importance").
    weight_recency: float = Field(0.3, ge=0)
    #: Weight of access frequency (recall hits) in the importance score.
    weight_frequency: float = Field(0.2, ge=0)
    #: Weight of confidence in the importance score (a memory without one counts as 1).
    weight_confidence: float = Field(0.2, ge=0)
    #: Weight of the writer's importance (0..1) in the importance score.
    weight_importance: float = Field(0.3, ge=0)
    #: Seconds after which recency (since the last recall, or the write) halves.
    recency_half_life: float = Field(7 * 86400.0, gt=0)
    #: Recalls at which the frequency term reaches 1 - 1/e (1 - exp(-hits / scale)).
    frequency_scale: float = Field(5.0, gt=0)
    #: Seconds between the search service's batched writes of recall hits
    #: (hits, last_accessed), off the read path.
    access_flush_interval: float = Field(1.0, gt=0)
    #: Seconds between scheduled prunes by the worker (0: never; ``blackboard
    #: prune`` runs one on demand).
    prune_interval: float = Field(0.0, ge=0)
    #: The strategies a scheduled prune runs.
    prune_strategies: list[Literal["lru", "low_confidence", "old_age", "importance"]] = []
    #: lru: archive memories not recalled (nor written) for this many seconds.
    prune_unused_for: float = Field(90 * 86400.0, gt=0)
    #: low_confidence: archive memories whose confidence is below this.
    prune_min_confidence: float = Field(0.3, ge=0, le=1)
    #: old_age: archive memories whose event time is older than this many seconds.
    prune_max_age: float = Field(365 * 86400.0, gt=0)
    #: importance: archive memories whose importance score is below this.
    prune_min_importance: float = Field(0.2, ge=0, le=1)
    #: At most this many live memories per board (the least important are
    #: archived by each prune; None: no bound).
    max_per_board: int | None = Field(None, ge=1)


class AgentMemorySettings(BaseModel):
    """The agent's memory toolkit in the SDK (``agent.memory``; docs/memory.md): its
    layers, limits, router, episodes, stores, prompt context budget and tokenizer."""

    #: The layers ``agent.memory`` searches and routes to (short_term: the episode's
    #: items; working: the episode's notes with TTL; long_term: the agent's long-term
    #: scope; shared: the boards and long-term scopes the agent has joined).
    layers: list[Literal["short_term", "working", "long_term", "shared"]] = [
        "short_term", "working", "long_term", "shared"]
    #: Most items an episode's short-term memory keeps (the oldest are evicted).
    short_term_max_items: int | None = Field(1000, ge=1)
    #: Most bytes an episode's short-term memory keeps (None: no bound).
    short_term_max_bytes: int | None = Field(None, ge=1)
    #: Seconds a working note lives unless told otherwise (None: until removed).
    working_ttl: float | None = Field(600.0, gt=0)
    #: The board of the agent's own long-term scope (the long_term layer).
    long_term_board: str = "default"
    #: Boards whose long-term memories form the shared layer, beside the boards the
    #: agent has joined.
    shared_boards: list[str] = []
    #: Hits ``agent.memory.search`` returns when the call gives no top_k.
    top_k: int = Field(10, ge=1, le=1000)
    #: Hits scoring below this (0..1, normalised per layer) are left out.
    min_relevance: float = Field(0.0, ge=0, le=1)
    #: Which layers a search without ``layers`` reads: ``rules`` (documented,
    #: docs/memory.md "The router") or ``llm`` (asks the chat model of ``llm.*``;
    #: falls back to the rules when it fails).
    router: Literal["rules", "llm"] = "rules"
    #: Seconds a long-term or shared search result is reused for the same query and
    #: filters (0: no cache). The agent's own writes clear it; another agent's new
    #: memories are seen once the entry expires, so keep it short on a busy team.
    cache_ttl: float = Field(5.0, ge=0)
    #: Most cached search results.
    cache_size: int = Field(256, ge=0)
    #: Summarize an episode into long-term memory when it ends.
    auto_summarize: bool = True
    #: How summaries are made: ``extractive`` (offline) or ``llm`` (``llm.*``).
    summarize_strategy: Literal["extractive", "llm"] = "extractive"
    #: Target size of a summary, in tokens of the tokenizer below.
    summary_tokens: int = Field(256, ge=16)
    #: Seconds between automatic prunes of the agent's own memories (0: never).
    auto_prune_interval: float = Field(0.0, ge=0)
    #: The strategy of the automatic prune.
    auto_prune_strategy: Literal["lru", "low_confidence", "old_age"] = "low_confidence"
    #: Its threshold: a confidence (low_confidence), or seconds (lru, old_age).
    auto_prune_threshold: float = Field(0.3, ge=0)
    #: Token budget of ``agent.memory.context`` (the related-memories block).
    context_budget: int = Field(1500, ge=1)
    #: How tokens are counted: ``chars`` (characters / 4), ``model`` (the local
    #: embedding model's tokenizer, offline and exact for it) or ``tiktoken`` (needs
    #: tiktoken_cache_dir holding its encoding files: it downloads them otherwise).
    tokenizer: Literal["chars", "model", "tiktoken"] = "chars"
    #: The tiktoken encoding (tokenizer = tiktoken).
    tiktoken_encoding: str = "cl100k_base"
    #: A directory holding tiktoken's encoding files (tokenizer = tiktoken).
    tiktoken_cache_dir: Path | None = None
    #: A TOML or YAML file declaring memory stores and this agent's attachments
    #: (docs/memory.md "Stores and attachments").
    stores_file: Path | None = None
    #: Retrieval latencies kept for the metrics' percentiles.
    metrics_window: int = Field(2048, ge=16)


class SearchSettings(BaseModel):
    """The search service and the SDK's search client."""

    #: Results returned when a query gives no top_k.
    default_top_k: int = Field(10, ge=1)
    #: HNSW ef_search for semantic queries (at 100k real embeddings: 0.977 of the
    #: true top 10 found, against 0.939 at pgvector's default of 40, for 3.3
    #: instead of 1.5 ms; bench/hnsw_recall.py).
    ef_search: int = Field(100, ge=1)
    #: HNSW ef_search of the semantic half of hybrid queries (the keyword half
    #: makes up for a little ANN recall: 0.94 of the true top 50 at 100k, for
    #: 2.3 instead of 3.1 ms; at least the candidates asked for is used).
    hybrid_ef_search: int = Field(64, ge=1)
    #: PostgreSQL's ``random_page_cost`` for the search service's sessions. Its
    #: default, 4.0, prices a random read as on a spinning disk, so the planner
    #: read a whole board sequentially to find a query's keyword candidates
    #: (2.3 ms for a LoCoMo board of 2,000 turns) where the text index finds
    #: them in 0.3-0.5 ms. 1.1 suits tables in memory or on SSD.
    random_page_cost: float = Field(1.1, gt=0)
    #: Seconds a search request may take (SDK side).
    timeout: float = Field(10.0, gt=0)
    #: A semantic query filtered by boards that hold at most this many items
    #: (estimated from ANALYZE's statistics of the items' boards), and at most
    #: a fifth of them, scans their vectors exactly, one index-only pass over
    #: the covering board index, instead of searching the HNSW index, whose
    #: scan would visit about (candidates / the boards' share) vectors of
    #: every board; 0: never.
    exact_scan_max_rows: int = Field(10_000, ge=0)
    #: Hybrid search fetches top_k * hybrid_depth candidates from each retriever
    #: (at least hybrid_min_candidates) before fusing them.
    hybrid_depth: int = Field(4, ge=1)
    #: Fewest candidates hybrid search takes from each retriever.
    hybrid_min_candidates: int = Field(50, ge=1)
    #: Hybrid fusion weight of the semantic retriever.
    semantic_weight: float = Field(1.0, ge=0)
    #: Hybrid fusion weight of the keyword retriever.
    keyword_weight: float = Field(1.0, ge=0)
    #: Hybrid fusion: "convex" (each retriever's scores min-max normalised over
    #: the candidates, then their weighted mean) or "rrf" (reciprocal-rank fusion).
    fusion: Literal["convex", "rrf"] = "convex"
    #: Query words estimated (from ANALYZE statistics) to match more than this
    #: many items generate no keyword candidates when rarer words exist (they
    #: still count in the score): bounds the work of one keyword query.
    keyword_term_max_rows: int = Field(1000, ge=1)
    #: The rarest query words generate keyword candidates while their
    #: estimated matches (scaled to the filtered boards) add up to at most
    #: this many; each candidate costs a heap row read.
    keyword_candidate_budget: int = Field(500, ge=1)
    #: Most keyword candidates one query scores (a LIMIT, for when the
    #: estimates fall short: it keeps the first rows found, not the best).
    keyword_max_candidates: int = Field(1000, ge=1)
    #: Seconds the per-word statistics (from pg_stats) are cached.
    term_stats_ttl: float = Field(60.0, ge=0)
    #: Hybrid memory search: each memory borrows this share of the fused
    #: score of its best neighbour on the board (the memory just before or
    #: after it, by creation time); 0 turns it off.
    neighbour_weight: float = Field(0.2, ge=0)
    #: Hybrid memory search: each memory whose metadata names a thread
    #: (``metadata.thread``: a conversation, a document) borrows this share of
    #: its thread's best fused score (relative to the best candidate's), after
    #: the neighbours: the thread that matches a query best is likely where
    #: the other memories it asks about are. 0 turns it off. Chosen on two
    #: LoCoMo conversations (bench/locomo_recall.py --grid).
    thread_weight: float = Field(0.5, ge=0)
    #: Query embeddings kept (least recently used out) so that a repeated
    #: query skips the model; 0 turns the cache off.
    query_cache_size: int = Field(1024, ge=0)
    #: Query words whose lexemes (from PostgreSQL's text search parser) are
    #: kept, least recently used out: a keyword or hybrid query whose words
    #: were all seen needs no round trip to find its lexemes; 0 turns it off.
    lexeme_cache_size: int = Field(100_000, ge=0)
    #: Reranking of memory searches (blackboard/search/rerank.py): "off", "llm"
    #: (an OpenAI-compatible chat model reads the query and the leading
    #: candidates and orders them) or "cross-encoder" (a local ONNX
    #: cross-encoder the user provides, rerank_model_path). A reranker that
    #: fails leaves the fused order (logged); recall never fails for it.
    rerank: Literal["off", "llm", "cross-encoder"] = "off"
    #: Candidates reranked: retrieval is asked for max(top_k, rerank_depth),
    #: the reranked list is cut to top_k.
    rerank_depth: int = Field(30, ge=1, le=200)
    #: Share of the reranker's score (min-max normalised over the reranked
    #: candidates) in their final score, the rest the fused score; 1.0: the
    #: reranker's order.
    rerank_weight: float = Field(1.0, ge=0, le=1)
    #: Chat model of the llm reranker.
    rerank_model: str = "gpt-4o-mini"
    #: API base URL of the llm reranker (None: api.openai.com).
    rerank_base_url: str | None = None
    #: API key of the llm reranker.
    rerank_api_key: SecretStr | None = None
    #: Seconds one llm reranker request may take.
    rerank_timeout: float = Field(10.0, gt=0)
    #: Characters of each candidate's text the llm reranker is shown.
    rerank_max_chars: int = Field(1000, ge=50)
    #: The cross-encoder: a directory holding model.onnx and its tokenizer.json
    #: (or the .onnx file, tokenizer.json beside it), e.g. an ONNX export of
    #: cross-encoder/ms-marco-MiniLM-L-6-v2. Nothing is downloaded.
    rerank_model_path: Path | None = None


class MessagingSettings(BaseModel):
    """Agent messages: durable inboxes and request/reply (see docs/messaging.md)."""

    #: Messages fetched from the inbox consumer per pull request.
    inbox_batch: int = Field(64, ge=1, le=10_000)
    #: Seconds the server waits for an ack before it may redeliver; the SDK
    #: keeps held messages alive (in-progress) well within it.
    inbox_ack_wait: float = Field(30.0, ge=1)
    #: Delivered but unacknowledged inbox messages at most (the inbox stalls
    #: at this many until some are acknowledged).
    inbox_max_ack_pending: int = Field(1000, ge=1)
    #: Default seconds ``agent.request`` waits for a reply.
    request_timeout: float = Field(5.0, gt=0)


class DevSettings(BaseModel):
    """``blackboard dev``: the embedded stack (command-line flags win)."""

    #: Where ``blackboard dev`` keeps the servers' data.
    data_dir: Path = Path(".blackboard")
    #: Address the dev servers listen on.
    host: str = "127.0.0.1"
    #: NATS port of the dev stack (0: any free port).
    nats_port: int = Field(4222, ge=0, le=65535)
    #: PostgreSQL port of the dev stack (0: any free port).
    pg_port: int = Field(5433, ge=0, le=65535)
    #: Run a worker inside ``blackboard dev``.
    run_worker: bool = True
    #: PostgreSQL's buffer cache in the dev stack (e.g. ``512MB``); None: a
    #: quarter of the machine's memory, between 128MB and 1GB.
    pg_shared_buffers: str | None = None


class CliSettings(BaseModel):
    """The commands for people: ``blackboard get``, ``put``, ``ls``, ... (docs/cli.md)."""

    #: Agent id the commands act as when ``--as`` is not given; its credential is found as
    #: ``Agent.connect`` finds it. None: the agent whose credential ``nats.creds_file`` holds.
    agent: str | None = None


class ContainerSettings(BaseModel):
    """The stacks ``blackboard.testing`` starts for a test suite (docs/testing.md): embedded
    processes by default, or containers (testcontainers and a Docker engine) with these images.
    The defaults are the official images a user's machine pulls; a machine without a registry
    points them at locally built ones (``docker/images``)."""

    #: How the stacks run: ``embedded`` (nats-server and PostgreSQL from the pip packages,
    #: as processes) or ``containers`` (these images, through testcontainers).
    mode: Literal["embedded", "containers"] = "embedded"
    #: The NATS server image (JetStream on).
    nats_image: str = "nats:2.15-alpine"
    #: The PostgreSQL image with pgvector.
    postgres_image: str = "pgvector/pgvector:pg18"
    #: The blackboard image (``docker/Dockerfile``) that runs the worker.
    worker_image: str = "blackboard:latest"
    #: Seconds a container may take to become healthy.
    start_timeout: float = Field(120.0, gt=0)


class ObservabilitySettings(BaseModel):
    """Logs, metrics, health endpoints and tracing (docs/observability.md)."""

    #: The level of the worker's and the CLI's logs.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``text`` (one line an event) or ``json`` (one JSON object a line, for log shippers).
    log_format: Literal["text", "json"] = "text"
    #: Progress bars (``blackboard reindex``, ``ingest``): ``auto`` draws them only on a
    #: terminal (a log gets one line per step instead).
    progress: Literal["auto", "always", "never"] = "auto"
    #: Serve ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` from the worker.
    http_enabled: bool = True
    #: The address they are served on.
    http_host: str = "127.0.0.1"
    #: Their port (0: a free port, told in the worker's ready line).
    http_port: int = Field(9464, ge=0, le=65535)
    #: ``/readyz`` answers ready when every stream's pending messages are at most this.
    ready_max_lag: int = Field(1000, ge=0)
    #: OpenTelemetry spans (needs the ``tracing`` extra): writes followed across the bus
    #: with W3C trace context in NATS headers. Off: no cost beyond a flag test.
    tracing: bool = False
    #: Where spans go: ``otlp`` (OTLP over HTTP to otlp_endpoint), ``console``, or
    #: ``none`` (an application that sets its own tracer provider).
    tracing_exporter: Literal["otlp", "console", "none"] = "none"
    #: The OTLP HTTP endpoint (tracing_exporter = otlp), e.g. http://127.0.0.1:4318.
    otlp_endpoint: str | None = None
    #: The share of traces recorded (otlp and console): each trace begun in this process is
    #: kept with this probability, and a span under a remote parent (a worker's under the
    #: writer's) follows the parent's decision. 1.0 records every one.
    tracing_sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    #: The ``service.name`` resource of this process's spans.
    service_name: str = "blackboard"


class SecuritySettings(BaseModel):
    """Identities and rights (docs/security.md)."""

    #: The declared policy (TOML) the system service reads each principal's rights from
    #: (search over granted boards, inbox subscriptions). None: ``<authority_dir>/policy.toml``.
    policy_file: Path | None = None
    #: Where ``blackboard auth`` keeps the signing keys, the policy and the registry of
    #: identities. None: ``<dev.data_dir>/auth``.
    authority_dir: Path | None = None
    #: Sign every record this process writes with its credential's key (docs/security.md,
    #: "Signatures"). Without a credential (an open bus) nothing is signed.
    sign: bool = True
    #: Verify the signatures of the records this process reads.
    verify: bool = True
    #: What a read does with a record that does not verify: ``hide`` (views, watches and
    #: lists skip it, strict reads raise ``UnverifiedRecordError``) or ``flag`` (it is
    #: returned with its ``verdict``).
    unverified: Literal["hide", "flag"] = "hide"
    #: Seconds a record's stored time may differ from its signed time before it is
    #: ``stale`` (a replay of an old write); less than ``nats.duplicate_window``.
    max_clock_skew: float = Field(30.0, gt=0)
    #: Verdicts kept per stored message (stream, sequence), least recently used out; 0: none.
    verified_cache: int = Field(100_000, ge=0)
    #: Account public keys (``A...``) whose certificates are trusted besides the issuer of
    #: this process's own credential.
    trusted_accounts: list[str] = []

    @field_validator("trusted_accounts")
    @classmethod
    def _check_accounts(cls, value: list[str]) -> list[str]:
        for key in value:
            if not _ACCOUNT_KEY_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not an account public key (A and 55 base32 characters)")
        return value


class Settings(BaseSettings):
    """Every setting of the system, from ``BLACKBOARD_*`` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="BLACKBOARD_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    nats: NatsSettings = NatsSettings()
    board: BoardSettings = BoardSettings()
    postgres: PostgresSettings = PostgresSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    llm: LLMSettings = LLMSettings()
    worker: WorkerSettings = WorkerSettings()
    memory: MemorySettings = MemorySettings()
    agent_memory: AgentMemorySettings = AgentMemorySettings()
    search: SearchSettings = SearchSettings()
    messaging: MessagingSettings = MessagingSettings()
    dev: DevSettings = DevSettings()
    security: SecuritySettings = SecuritySettings()
    cli: CliSettings = CliSettings()
    containers: ContainerSettings = ContainerSettings()
    observability: ObservabilitySettings = ObservabilitySettings()

    @model_validator(mode="after")
    def _check_windows(self) -> Settings:
        window = self.nats.duplicate_window
        if 2 * self.security.max_clock_skew >= window:
            # A write stored up to the skew after its signed time and replayed just after the
            # window is stale only if the window is over twice the skew.
            raise ValueError(f"security.max_clock_skew ({self.security.max_clock_skew:g}) must be less than half "
                             f"of nats.duplicate_window ({window:g}): a replayed signed write must be either "
                             "dropped as a duplicate or stale")
        if self.nats.write_timeout >= window:
            raise ValueError(f"nats.write_timeout ({self.nats.write_timeout:g}) must be less than "
                             f"nats.duplicate_window ({window:g}): a write's re-sends must be deduplicated")
        return self


#: Settings whose values an error message must not repeat.
_SECRET_FIELDS = frozenset({"password", "token", "dsn", "api_key"})


def describe_errors(exc: ValidationError) -> str:
    """One line naming each invalid setting of ``exc`` (raised building :class:`Settings`):
    its path, its environment variable, why, and the value given (secrets left out)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(part) for part in err["loc"]]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across settings (its message names them); the input is every setting
            parts.append(msg)
            continue
        given = "" if _SECRET_FIELDS & set(loc) else f" (got {err.get('input')!r})"
        parts.append(f"{'.'.join(loc)} (BLACKBOARD_{'__'.join(loc).upper()}): {msg}{given}")
    return "invalid setting " + "; ".join(parts)
