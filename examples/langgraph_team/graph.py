"""The graph both members compile: research -> write -> review, each node run by one member.

State flows through the checkpointer (``BlackboardSaver``): a member runs the graph until the
next node is the other's (``interrupt_before``), and the other resumes the same thread from
the board. Findings and the approved notes are shared through the store
(``BlackboardStore``): the researcher puts each finding under ``("facts", <topic>)``, the
writer reads them from there, not from the graph's state.

The chat model is scripted (:func:`scripted_model`): langchain_core's ``FakeListChatModel``
answering from the topic, so the run needs no LLM key and always ends the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.store.base import BaseStore

__all__ = ["NODES_OF", "Member", "NotesState", "Role", "build_graph", "scripted_model", "topic_key"]

Role = Literal["researcher", "writer"]

#: Which member runs which node.
NODES_OF: dict[Role, tuple[str, ...]] = {"researcher": ("research", "review"), "writer": ("write",)}


class NotesState(TypedDict, total=False):
    topic: str
    messages: Annotated[list[AnyMessage], add_messages]
    findings: int
    draft: str
    approved: bool


def topic_key(topic: str) -> str:
    """A store namespace label for a topic (lowercase words joined by '-')."""
    return "-".join(re.findall(r"[a-z0-9]+", topic.lower()))[:64] or "topic"


def scripted_model(node: str, topic: str) -> FakeListChatModel:
    """A chat model that answers the question of ``node`` from a script (one answer a node:
    a member may run its next node in another process)."""
    answers = {
        "research": f"- {topic} keeps every shared fact on one board\n"
                    f"- {topic} signs each write with the writer's key\n"
                    f"- {topic} lets another process resume a graph thread",
        "write": "Release notes: {facts}.",
        "review": "APPROVED: the draft covers every finding.",
    }
    return FakeListChatModel(responses=[answers[node]])


@dataclass
class Member:
    """One member's side of the graph: its id (the agent) and role."""

    agent_id: str
    role: Role

    async def research(self, state: NotesState, *, store: BaseStore) -> dict[str, Any]:
        topic = state["topic"]
        question = HumanMessage(f"List what matters about {topic}.", name=self.role)
        answer = await scripted_model("research", topic).ainvoke([question])
        facts = [line.removeprefix("- ").strip() for line in str(answer.content).splitlines() if line.strip()]
        for i, fact in enumerate(facts, 1):
            await store.aput(("facts", topic_key(topic)), f"f{i}", {"text": fact, "by": self.agent_id})
        return {"messages": [question, AIMessage(str(answer.content), name=self.role)], "findings": len(facts)}

    async def write(self, state: NotesState, *, store: BaseStore) -> dict[str, Any]:
        topic = state["topic"]
        facts = await store.asearch(("facts", topic_key(topic)), limit=100)
        texts = [str(item.value["text"]) for item in sorted(facts, key=lambda i: i.key)]
        template = str((await scripted_model("write", topic).ainvoke([HumanMessage(f"Draft notes on {topic}.")])).content)
        draft = template.format(facts="; ".join(texts))
        return {"messages": [AIMessage(draft, name=self.role)], "draft": draft}

    async def review(self, state: NotesState, *, store: BaseStore) -> dict[str, Any]:
        question = HumanMessage(f"Review: {state['draft']}")
        verdict = str((await scripted_model("review", state["topic"]).ainvoke([question])).content)
        approved = verdict.startswith("APPROVED")
        if approved:
            await store.aput(("notes", topic_key(state["topic"])), "final",
                             {"text": state["draft"], "approved_by": self.agent_id})
        return {"messages": [AIMessage(verdict, name=self.role)], "approved": approved}


def build_graph(member: Member, *, saver: BaseCheckpointSaver[Any],
                store: BaseStore) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The graph as ``member`` runs it: every node, stopping before a node of the other's."""
    builder = StateGraph(NotesState)
    builder.add_node("research", member.research)
    builder.add_node("write", member.write)
    builder.add_node("review", member.review)
    builder.add_edge(START, "research")
    builder.add_edge("research", "write")
    builder.add_edge("write", "review")
    builder.add_edge("review", END)
    others = [node for role, nodes in NODES_OF.items() if role != member.role for node in nodes]
    return builder.compile(checkpointer=saver, store=store, interrupt_before=others)
