"""A small graph for the checkpointer's tests: draft -> review (interrupts for approval) -> publish.

Run as ``python -m tests.langgraph._review_graph AGENT BOARD THREAD (start|history)`` it
is the other process of the two-process test: ``start`` runs the graph with a
saver built by ``BlackboardSaver.connect_sync`` until the review interrupts,
``history`` prints the thread's history; each prints one JSON line.
Settings come from the ``BLACKBOARD_*`` environment.
"""

from __future__ import annotations

import json
import operator
import os
import sys
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import interrupt


class ReviewState(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def _draft(state: ReviewState) -> dict[str, Any]:
    return {"log": [f"draft by pid {os.getpid()}"]}


def _review(state: ReviewState) -> dict[str, Any]:
    answer = interrupt({"question": "approve?", "drafts": len(state.get("log", []))})
    return {"answer": answer, "log": [f"reviewed: {answer}"]}


def _publish(state: ReviewState) -> dict[str, Any]:
    return {"log": [f"published by pid {os.getpid()}"]}


def review_graph(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The graph, compiled with ``saver``."""
    builder = StateGraph(ReviewState)
    builder.add_node("draft", _draft)
    builder.add_node("review", _review)
    builder.add_node("publish", _publish)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=saver)


def main(argv: list[str]) -> int:
    from agents_sdk.langgraph import BlackboardSaver

    agent_id, board, thread, action = argv
    config = {"configurable": {"thread_id": thread}}
    with BlackboardSaver.connect_sync(agent_id, board=board) as saver:
        graph = review_graph(saver)
        if action == "start":
            result = graph.invoke({"log": []}, config)
            interrupts = [i.value for i in result.get("__interrupt__", [])]
            print(json.dumps({"log": result["log"], "interrupts": interrupts, "next": list(graph.get_state(config).next)}))
        else:
            history = [{"step": s.metadata["step"] if s.metadata else None, "next": list(s.next),
                        "log": s.values.get("log", []), "id": s.config["configurable"]["checkpoint_id"]}
                       for s in graph.get_state_history(config)]
            print(json.dumps({"history": history}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
