"""Two agents, two identities, one LangGraph thread: a researcher and a writer share the
graph's checkpoints (``BlackboardSaver``) and long-term memory (``BlackboardStore``) on the
blackboard, each resuming the thread where the other stopped.

Run it with ``python -m examples.langgraph_team`` against ``blackboard dev``; see README.md.
"""

from examples.langgraph_team.graph import Member, NotesState, build_graph, scripted_model
from examples.langgraph_team.team import (
    TeamConfig,
    TeamResult,
    TurnResult,
    member_id,
    run_team,
    run_turn,
)

__all__ = [
    "Member",
    "NotesState",
    "TeamConfig",
    "TeamResult",
    "TurnResult",
    "build_graph",
    "member_id",
    "run_team",
    "run_turn",
    "scripted_model",
]
