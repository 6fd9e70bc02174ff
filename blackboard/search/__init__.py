"""Search over what the worker stored, served by the search micro service (``bb.search.<principal>.*``).

Server side: runs in the worker next to PostgreSQL; agents reach it through the
service. One module per concept:

* :mod:`~blackboard.search.fusion`: rank fusion and the result cut (pure);
* :mod:`~blackboard.search.planning`: query planning from table statistics (pure);
* :mod:`~blackboard.search.hits`: rows to wire hits (pure);
* :mod:`~blackboard.search.engine`: :class:`SearchEngine`, semantic, keyword and
  hybrid search of memories and entries, and its caches;
* :mod:`~blackboard.search.maintenance`: the upkeep searches leave (ANALYZE);
* :mod:`~blackboard.search.usage`: :class:`~blackboard.search.usage.AccessRecorder`, recall hits
  written off the read path;
* :mod:`~blackboard.search.history`: :class:`EntryHistory`, history and as-of reads (not search);
* :mod:`~blackboard.search.detail`: one memory by id, its provenance and versions (not search);
* :mod:`~blackboard.search.messages`: message search;
* :mod:`~blackboard.search.rerank`: rerankers (the :class:`Reranker` protocol, an
  OpenAI-compatible LLM, a local ONNX cross-encoder) of memory searches;
* :mod:`~blackboard.search.archive`: the memory lifecycle's writes: prune (by a strategy,
  optionally of one author), archive by id, restore;
* :mod:`~blackboard.search.lifecycle`: the prune, archive and restore endpoints with the
  principal's rights;
* :mod:`~blackboard.search.pool`: reads through the search pool (one retry on a broken connection);
* :mod:`~blackboard.search.service`: :class:`SearchService`, the NATS micro service.
"""

from blackboard.search.engine import SearchEngine
from blackboard.search.fusion import (
    Fused,
    cut,
    fuse_convex,
    fuse_hybrid,
    neighbour_map,
    rrf,
    smooth_neighbours,
)
from blackboard.search.history import EntryHistory
from blackboard.search.maintenance import Upkeep
from blackboard.search.messages import search_messages
from blackboard.search.planning import (
    BoardStats,
    TermStats,
    board_rows,
    candidate_lexemes,
    exact_scan,
)
from blackboard.search.rerank import (
    CrossEncoderReranker,
    LLMReranker,
    Reranker,
    reranker_from_settings,
)
from blackboard.search.service import SearchService
from blackboard.search.usage import AccessRecorder

__all__ = [
    "AccessRecorder",
    "BoardStats",
    "CrossEncoderReranker",
    "EntryHistory",
    "Fused",
    "LLMReranker",
    "Reranker",
    "SearchEngine",
    "SearchService",
    "TermStats",
    "Upkeep",
    "board_rows",
    "candidate_lexemes",
    "cut",
    "exact_scan",
    "fuse_convex",
    "fuse_hybrid",
    "neighbour_map",
    "reranker_from_settings",
    "rrf",
    "search_messages",
    "smooth_neighbours",
]
