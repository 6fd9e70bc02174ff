"""LangGraph on the blackboard: a ``BaseStore`` (:class:`BlackboardStore`) backed by board
entries and their search, and a checkpointer (:class:`BlackboardSaver`) on the board, so
several processes can run and resume one graph thread (docs/langgraph.md).

Needs the ``langgraph`` extra: ``pip install 'blackboard[langgraph]'``.
"""

try:
    import langgraph.checkpoint.base
    import langgraph.store.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("agents_sdk.langgraph needs LangGraph: pip install 'blackboard[langgraph]'") from exc

from agents_sdk.langgraph.checkpoint import BlackboardSaver
from agents_sdk.langgraph.store import BlackboardStore

__all__ = ["BlackboardSaver", "BlackboardStore"]
