"""A graph that exercises namespaces and parallel writes: a fan-out (``Send``) to parallel
workers, then a subgraph (its own checkpoint namespace) that interrupts for approval."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send, interrupt


class FanState(TypedDict, total=False):
    items: list[str]
    done: Annotated[list[str], operator.add]
    verdict: str


class Job(TypedDict):
    item: str


def _plan(state: FanState) -> dict[str, Any]:
    return {}


def _fan_out(state: FanState) -> list[Send]:
    return [Send("work", {"item": item}) for item in state["items"]]


def _work(job: Job) -> dict[str, Any]:
    return {"done": [job["item"].upper()]}


def _ask(state: FanState) -> dict[str, Any]:
    return {"verdict": str(interrupt({"done": sorted(state.get("done", []))}))}


def fanout_graph(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    review = StateGraph(FanState)
    review.add_node("ask", _ask)
    review.add_edge(START, "ask")
    review.add_edge("ask", END)
    builder = StateGraph(FanState)
    builder.add_node("plan", _plan)
    builder.add_node("work", _work)
    builder.add_node("review", review.compile())
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", _fan_out, ["work"])
    builder.add_edge("work", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)
