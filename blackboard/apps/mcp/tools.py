"""The MCP tools: the board, search and memory, messages, votes and task claims.

Every tool acts as the agent of the request's identity (``AgentSource.agent_for``),
so NATS enforces that identity's permissions; a blackboard error comes back as a
tool error (``results.error_result``) naming what went wrong.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import AwareDatetime, Field

from agents_sdk import Agent, Entry
from agents_sdk.messaging.inbox import Message
from agents_sdk.search import EntrySearchArgs, RecallArgs
from blackboard.apps.mcp.results import (
    AckResult,
    BoardsResult,
    ClaimResult,
    DeleteResult,
    EntriesResult,
    EntryOut,
    HistoryResult,
    InboxResult,
    KeysResult,
    MemoryHits,
    OutcomeResult,
    ProposeResult,
    ReleaseResult,
    RememberResult,
    ReplyResult,
    SearchHits,
    SectionsResult,
    SentResult,
    ToolFailure,
    VoteResult,
    WriteResult,
    entry_out,
    guarded,
    message_out,
)
from blackboard.protocol.errors import ConflictError, NotFoundError, OutcomeTimeoutError
from blackboard.protocol.filters import Where as ParsedWhere
from blackboard.protocol.filters import parse_where
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.vote import Policy

if TYPE_CHECKING:
    from blackboard.apps.mcp.server import AgentSource, BlackboardMCP

__all__ = ["AgentInbox", "list_entries", "register_tools"]

# ------------------------------------------------------------------ argument types (the schemas an LLM reads)
BoardName = Annotated[str, Field(description="Board name, e.g. 'project-x' (letters, digits, '-', '_').",
                                 min_length=1, max_length=128)]
SectionName = Annotated[str, Field(description="Section of the board, e.g. 'tasks'.", min_length=1, max_length=128)]
KeyName = Annotated[str, Field(description="Key within the section, e.g. 't1'.", min_length=1, max_length=256)]
JsonValue = Annotated[Any, Field(description='Any JSON value, e.g. {"title": "write docs", "status": "open"}.')]
Tags = Annotated[list[str] | None, Field(description="Labels, e.g. ['urgent'].", max_length=64)]
Metadata = Annotated[dict[str, Any] | None,
                     Field(description='A JSON object stored beside the value, e.g. {"confidence": 0.9}.')]
Ttl = Annotated[float | None, Field(description="Seconds after which the server removes the entry (>= 1).",
                                    ge=1, le=365 * 86400)]
Where = Annotated[dict[str, Any] | None, Field(
    description='Comparison filters, ANDed. Key: a dotted path under "metadata" (or "value" for entries); '
                'condition: a JSON value (equality) or operators $eq $ne $gt $gte $lt $lte $in $nin $exists. '
                'e.g. {"metadata.confidence": {"$gt": 0.8}, "value.status": {"$in": ["open", "blocked"]}}.')]
TopK = Annotated[int | None, Field(description="Most hits to return (default 10).", ge=1, le=100)]
MinScore = Annotated[float | None, Field(description="Drop hits scoring below this.", ge=0)]
Mode = Annotated[Literal["hybrid", "semantic", "keyword"],
                 Field(description="'hybrid' (default: words and meaning), 'semantic' or 'keyword'.")]
Since = Annotated[datetime | None, Field(description="Only items written at or after this time, "
                                                     "ISO 8601, e.g. '2026-01-31T12:00:00Z'.")]
Until = Annotated[datetime | None, Field(description="Only items written before this time (ISO 8601).")]
AgentName = Annotated[str, Field(description="An agent id, e.g. 'reviewer'.", min_length=1, max_length=128)]
MessageType = Annotated[str, Field(description="What the message is, e.g. 'task.done' or 'question'.",
                                   min_length=1, max_length=128)]

_READ = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
_WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
_DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
_MESSAGE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                           open_world_hint=False)

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])

#: Messages remembered for ``message_reply`` after they were read (per agent).
_SEEN = 1000


class AgentInbox:
    """One agent's inbox as the MCP tools read it: the messages read and not yet
    acknowledged (so ``inbox_ack`` can settle them) and those recently read (``message_reply``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.pending: dict[str, Message] = {}
        self.seen: OrderedDict[str, Message] = OrderedDict()
        self.lock = asyncio.Lock()

    async def read(self, limit: int, wait: float) -> list[Message]:
        """Up to ``limit`` messages, waiting at most ``wait`` seconds with none arriving.

        Messages read before and not acknowledged come first again (a new reader
        rewinds to the first unacknowledged message)."""
        out: list[Message] = []
        async with self.lock, self.agent.inbox(limit=limit, timeout=wait, batch=limit) as inbox:
            async for msg in inbox:
                out.append(msg)
                self.pending[msg.id] = msg
                self.seen[msg.id] = msg
                self.seen.move_to_end(msg.id)
                while len(self.seen) > _SEEN:
                    self.seen.popitem(last=False)
        return out

    async def ack(self, ids: list[str]) -> list[str]:
        """Acknowledge messages read through this inbox (waiting for the server's confirmation).

        Raises:
            ToolFailure: an id that was not read (or is already acknowledged); nothing is acknowledged then.
        """
        unknown = [i for i in ids if i not in self.pending]
        if unknown:
            raise ToolFailure(f"not read through inbox_read or already acknowledged: {', '.join(unknown)} "
                              f"(pending: {', '.join(self.pending) or 'none'})")
        done: list[str] = []
        for i in dict.fromkeys(ids):
            await self.pending[i].ack(wait=True)
            del self.pending[i]
            done.append(i)
        return done


def _where(where: dict[str, Any] | None) -> ParsedWhere | None:
    """``where`` parsed once (InvalidPayloadError naming the path and operator); the SDK takes
    the parsed form as it is."""
    return parse_where(where) or None


def register_tools(server: BlackboardMCP, source: AgentSource) -> None:
    """Register every tool on ``server``; each acts as ``await source.agent_for(request context)``."""
    inboxes: dict[int, AgentInbox] = {}

    async def agent_of(ctx: Context[Any, Any]) -> Agent:
        return await source.agent_for(ctx.request_context)

    def inbox_of(agent: Agent) -> AgentInbox:
        box = inboxes.get(id(agent))
        if box is None or box.agent is not agent:
            box = inboxes[id(agent)] = AgentInbox(agent)
        return box

    def tool(name: str, annotations: ToolAnnotations, title: str) -> Callable[[_F], _F]:
        def register(fn: _F) -> _F:
            server.add_tool(guarded(fn), name=name, title=title, annotations=annotations,
                            description=inspect.cleandoc(fn.__doc__ or ""))
            return fn
        return register

    # -------------------------------------------------------------- the board
    @tool("board_get", _READ, "Read a board entry")
    async def board_get(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                        revision: Annotated[int | None, Field(description="An older revision to read "
                                                                          "(default: the latest).", ge=1)] = None,
                        ) -> EntryOut:
        """Read one entry of a board: its JSON value, revision, author, tags and metadata.

        Example: {"board": "project-x", "section": "tasks", "key": "t1"}.
        A missing or deleted key is a NotFoundError tool error.
        """
        agent = await agent_of(ctx)
        return entry_out(await agent.board(board).get(section, key, revision=revision))

    @tool("board_put", _WRITE, "Write a board entry")
    async def board_put(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                        value: JsonValue, tags: Tags = None, metadata: Metadata = None, ttl: Ttl = None,
                        ) -> WriteResult:
        """Write an entry unconditionally (last writer wins); returns its new revision.

        Example: {"board": "project-x", "section": "notes", "key": "plan", "value": {"steps": ["a", "b"]}}.
        To change an entry others may be changing too, use board_update with the revision you read.
        """
        agent = await agent_of(ctx)
        rev = await agent.board(board).put(section, key, value, tags=tags or (), metadata=metadata, ttl=ttl)
        return WriteResult(board=board, section=section, key=key, revision=rev)

    @tool("board_create", _WRITE, "Create a board entry if absent")
    async def board_create(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                           value: JsonValue, tags: Tags = None, metadata: Metadata = None, ttl: Ttl = None,
                           ) -> WriteResult:
        """Write an entry only if the key does not exist yet (or was deleted).

        Example: {"board": "project-x", "section": "tasks", "key": "t2", "value": {"title": "review"}}.
        An existing key is a ConflictError tool error carrying its current_revision.
        """
        agent = await agent_of(ctx)
        rev = await agent.board(board).create(section, key, value, tags=tags or (), metadata=metadata, ttl=ttl)
        return WriteResult(board=board, section=section, key=key, revision=rev)

    @tool("board_update", _WRITE, "Update a board entry at a known revision")
    async def board_update(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                           value: JsonValue,
                           expected_revision: Annotated[int, Field(description="The revision you read "
                                                                               "(board_get).", ge=1)],
                           tags: Tags = None, metadata: Metadata = None, ttl: Ttl = None) -> WriteResult:
        """Compare-and-set: write only if the entry is still at expected_revision.

        Example: {"board": "project-x", "section": "tasks", "key": "t1", "value": {"status": "done"},
        "expected_revision": 42}. If someone wrote first, a ConflictError tool error carries the
        current_revision: read the entry again, merge, and retry with that revision.
        """
        agent = await agent_of(ctx)
        rev = await agent.board(board).update(section, key, value, expected_revision=expected_revision,
                                              tags=tags or (), metadata=metadata, ttl=ttl)
        return WriteResult(board=board, section=section, key=key, revision=rev)

    @tool("board_delete", _DELETE, "Delete a board entry")
    async def board_delete(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                           expected_revision: Annotated[int | None, Field(
                               description="Delete only if the entry is still at this revision.", ge=1)] = None,
                           ) -> DeleteResult:
        """Delete an entry (its history stays readable with board_history); returns the delete's revision.

        Example: {"board": "project-x", "section": "tasks", "key": "t1", "expected_revision": 43}.
        """
        agent = await agent_of(ctx)
        rev = await agent.board(board).delete(section, key, expected_revision=expected_revision)
        return DeleteResult(board=board, section=section, key=key, revision=rev)

    @tool("board_history", _READ, "Revisions of a board entry")
    async def board_history(ctx: Context[Any, Any], board: BoardName, section: SectionName,
                            key: KeyName) -> HistoryResult:
        """The revisions kept of one entry, oldest first, deletes included (deleted: true).

        Example: {"board": "project-x", "section": "tasks", "key": "t1"}.
        """
        agent = await agent_of(ctx)
        history = await agent.board(board).history(section, key)
        if not history:
            raise NotFoundError(f"{board}/{section}/{key}", f"{board}/{section}/{key}: no revision kept")
        return HistoryResult(entries=[entry_out(e) for e in history])

    @tool("board_list", _READ, "List the boards")
    async def board_list(ctx: Context[Any, Any]) -> BoardsResult:
        """The boards holding at least one entry that you may read, sorted. Takes no arguments."""
        agent = await agent_of(ctx)
        return BoardsResult(boards=await agent.boards())

    @tool("board_sections", _READ, "List a board's sections")
    async def board_sections(ctx: Context[Any, Any], board: BoardName) -> SectionsResult:
        """The sections of a board that hold a live entry, sorted. Example: {"board": "project-x"}."""
        agent = await agent_of(ctx)
        return SectionsResult(board=board, sections=await agent.board(board).sections())

    @tool("board_keys", _READ, "List a section's keys")
    async def board_keys(ctx: Context[Any, Any], board: BoardName, section: SectionName) -> KeysResult:
        """The live keys of one section, sorted. Example: {"board": "project-x", "section": "tasks"}."""
        agent = await agent_of(ctx)
        return KeysResult(board=board, section=section, keys=await agent.board(board).keys(section))

    @tool("board_entries", _READ, "List live entries, optionally filtered")
    async def board_entries(ctx: Context[Any, Any], board: BoardName,
                            section: Annotated[str | None, Field(description="Only this section "
                                                                             "(default: the whole board).")] = None,
                            where: Where = None,
                            limit: Annotated[int, Field(description="Most entries to return.", ge=1, le=1000)] = 100,
                            ) -> EntriesResult:
        """The current entries of a board or a section, sorted by (section, key), filtered by `where`.

        Example: {"board": "project-x", "section": "tasks", "where": {"value.status": "open"}}.
        """
        agent = await agent_of(ctx)
        entries = await list_entries(agent, board, section, _where(where))
        return EntriesResult(board=board, section=section, entries=[entry_out(e) for e in entries[:limit]])

    # -------------------------------------------------------------- search and memory
    @tool("board_search", _READ, "Search board entries")
    async def board_search(ctx: Context[Any, Any],
                           query: Annotated[str, Field(description="What to look for, in words.", min_length=1)],
                           board: Annotated[str | None, Field(description="Search this board "
                                                                          "(default: every board you may read).")] = None,
                           section: Annotated[str | None, Field(description="Only this section.")] = None,
                           tags_any: Tags = None, tags_all: Tags = None,
                           author: Annotated[str | None, Field(description="Only entries written by this agent.")] = None,
                           since: Since = None, until: Until = None, where: Where = None,
                           top_k: TopK = None, min_score: MinScore = None, mode: Mode = "hybrid") -> SearchHits:
        """Search the current board entries by words and meaning, best first (needs a running worker;
        entries are found once the worker has stored them).

        Example: {"query": "database migration risks", "board": "project-x",
        "where": {"metadata.confidence": {"$gte": 0.5}}}.
        """
        agent = await agent_of(ctx)
        args: EntrySearchArgs = {"board": board, "section": section, "tags_any": tags_any or [],
                                 "tags_all": tags_all or [], "author": author, "since": since, "until": until,
                                 "where": _where(where), "top_k": top_k, "min_score": min_score, "mode": mode}
        return SearchHits(hits=await agent.search.search_entries(query, **args))

    @tool("memory_recall", _READ, "Recall long-term memories")
    async def memory_recall(ctx: Context[Any, Any],
                            query: Annotated[str, Field(description="What to recall, in words.", min_length=1)],
                            board: Annotated[str | None, Field(description="Only memories of this board.")] = None,
                            kind: Annotated[MemoryKind | None,
                                            Field(description="Only this kind of memory.")] = None,
                            tags_any: Tags = None, tags_all: Tags = None,
                            author: Annotated[str | None, Field(description="Only memories of this agent.")] = None,
                            since: Since = None, until: Until = None, where: Where = None,
                            top_k: TopK = None, min_score: MinScore = None, mode: Mode = "hybrid",
                            include_superseded: Annotated[bool, Field(
                                description="Also older versions that a newer memory on the same key replaced, "
                                            "and contested ones.")] = False,
                            include_archived: Annotated[bool, Field(
                                description="Also archived memories (pruned or merged).")] = False,
                            as_of: Annotated[datetime | None, Field(
                                description="The versions valid at this instant (ISO 8601), e.g. what the "
                                            "price was then.")] = None,
                            known_at: Annotated[datetime | None, Field(
                                description="What the board knew at this instant (ISO 8601): memories written "
                                            "by then, the newest version of each key.")] = None,
                            occurred_after: Annotated[datetime | None, Field(
                                description="Only events at or after this instant (event time, else "
                                            "write time; ISO 8601).")] = None,
                            occurred_before: Annotated[datetime | None, Field(
                                description="Only events before this instant (ISO 8601).")] = None,
                            min_confidence: Annotated[float | None, Field(
                                description="Only memories with a confidence of at least this (0 to 1).",
                                ge=0, le=1)] = None) -> MemoryHits:
        """Search the shared long-term memory, best first (needs a running worker; a memory is found
        once embedded). Only current memories unless include_superseded / include_archived / as_of /
        known_at say otherwise.

        Example: {"query": "how did we fix the flaky deploy?", "kind": "episodic",
        "where": {"metadata.confidence": {"$gt": 0.8}}}; {"query": "price of sku-1",
        "as_of": "2026-01-31T00:00:00Z"}.
        """
        agent = await agent_of(ctx)
        args: RecallArgs = {"board": board, "kind": kind, "tags_any": tags_any or [], "tags_all": tags_all or [],
                            "author": author, "since": since, "until": until, "where": _where(where),
                            "top_k": top_k, "min_score": min_score, "mode": mode,
                            "include_superseded": include_superseded, "include_archived": include_archived,
                            "as_of": as_of, "known_at": known_at, "occurred_after": occurred_after,
                            "occurred_before": occurred_before, "min_confidence": min_confidence}
        return MemoryHits(hits=await agent.recall(query, **args))

    @tool("memory_remember", _WRITE, "Store a long-term memory")
    async def memory_remember(ctx: Context[Any, Any],
                              text: Annotated[str, Field(description="The memory, in words.", min_length=1)],
                              kind: Annotated[MemoryKind, Field(
                                  description="'episodic' (what happened), 'semantic' (a fact), 'procedural' "
                                              "(how to do something), 'knowledge' (reference material) or "
                                              "'summary' (a digest of other memories).")] = "episodic",
                              board: Annotated[str | None, Field(description="Scope it to this board "
                                                                             "(default 'default').")] = None,
                              tags: Tags = None, metadata: Metadata = None,
                              importance: Annotated[float, Field(description="0 to 1.", ge=0, le=1)] = 0.5,
                              key: Annotated[str | None, Field(
                                  description="What the memory is about, e.g. 'price:shop.example.com:sku-1': a "
                                              "newer memory on the same key (of the board) supersedes the older "
                                              "ones, which recall then leaves out.",
                                  min_length=1, max_length=256)] = None,
                              occurred_at: Annotated[AwareDatetime | None, Field(
                                  description="When what it says happened, ISO 8601 with an offset, e.g. "
                                              "'2026-01-31T12:00:00Z' (default: now).")] = None,
                              confidence: Annotated[float | None, Field(
                                  description="How sure you are of it, 0 to 1.", ge=0, le=1)] = None,
                              ) -> RememberResult:
        """Store a long-term memory that any agent can recall later; returns its id.

        Example: {"text": "The deploy failed because the migration locked the users table.",
        "kind": "episodic", "tags": ["deploy"], "occurred_at": "2026-01-30T17:05:00Z"}; a fact that
        may change: {"text": "SKU-1 costs 12 EUR", "kind": "semantic", "key": "price:sku-1",
        "confidence": 0.9}.
        """
        agent = await agent_of(ctx)
        return RememberResult(id=await agent.remember(text, kind=kind, board=board, tags=tags or (),
                                                      metadata=metadata, importance=importance, key=key,
                                                      occurred_at=occurred_at, confidence=confidence))

    # -------------------------------------------------------------- messages
    @tool("message_send", _MESSAGE, "Send a message to an agent")
    async def message_send(ctx: Context[Any, Any],
                           to: Annotated[str | list[str], Field(description="Agent id, or a list of agent ids.")],
                           type: MessageType, body: JsonValue = None,
                           board: Annotated[str | None, Field(description="The board it is about.")] = None,
                           correlation_id: Annotated[str | None, Field(
                               description="The id of a message this one answers.")] = None) -> SentResult:
        """Send a direct message; it waits in the recipients' inboxes until they read it.

        Example: {"to": "reviewer", "type": "review.request", "body": {"entry": "project-x/tasks/t1"}}.
        """
        agent = await agent_of(ctx)
        sent = await agent.send(to, type, body, board=board, correlation_id=correlation_id)
        return SentResult(id=sent.id, seq=sent.seq)

    @tool("inbox_read", _MESSAGE, "Read your inbox")
    async def inbox_read(ctx: Context[Any, Any],
                         max: Annotated[int, Field(description="Most messages to return.", ge=1, le=100)] = 10,
                         wait: Annotated[float, Field(description="Return after this many seconds without "
                                                                  "a new message.", gt=0, le=30)] = 1.0,
                         ) -> InboxResult:
        """Read messages sent to you (direct, boards you joined, topics you follow), oldest first.

        Acknowledge each one with inbox_ack once handled; one not acknowledged is returned again
        by a later inbox_read. Example: {"max": 5, "wait": 2}.
        """
        agent = await agent_of(ctx)
        box = inbox_of(agent)
        messages = await box.read(max, wait)
        return InboxResult(messages=[message_out(m) for m in messages], unacknowledged=len(box.pending))

    @tool("inbox_ack", _MESSAGE, "Acknowledge inbox messages")
    async def inbox_ack(ctx: Context[Any, Any],
                        ids: Annotated[list[str], Field(description="Ids of messages read with inbox_read.",
                                                        min_length=1, max_length=100)]) -> AckResult:
        """Mark messages as handled: they are not delivered again. Example: {"ids": ["3f2a..."]}."""
        agent = await agent_of(ctx)
        return AckResult(acknowledged=await inbox_of(agent).ack(ids))

    @tool("message_reply", _MESSAGE, "Reply to an inbox message")
    async def message_reply(ctx: Context[Any, Any],
                            message_id: Annotated[str, Field(description="The id of a message you read.")],
                            body: JsonValue = None,
                            type: Annotated[str, Field(description="The reply's type.", min_length=1,
                                                       max_length=128)] = "reply") -> SentResult:
        """Answer a message read with inbox_read: a direct message to its sender whose
        correlation_id is that message's id. Example: {"message_id": "3f2a...", "body": {"ok": true}}.
        """
        agent = await agent_of(ctx)
        original = inbox_of(agent).seen.get(message_id)
        if original is None:
            raise ToolFailure(f"no message {message_id!r} was read by this session (inbox_read first)")
        sent = await agent.send(original.sender, type, body, board=original.board, correlation_id=original.id)
        return SentResult(id=sent.id, seq=sent.seq)

    @tool("message_request", _MESSAGE, "Ask an agent and wait for its answer")
    async def message_request(ctx: Context[Any, Any], to: AgentName, type: MessageType, body: JsonValue = None,
                              timeout: Annotated[float, Field(description="Seconds to wait for the answer.",
                                                              gt=0, le=120)] = 10.0) -> ReplyResult:
        """Send a request to an agent that answers requests (a running program) and wait for its reply.

        Example: {"to": "calculator", "type": "add", "body": {"a": 1, "b": 2}}. No agent answering
        is a NoResponderError tool error; a slow one a RequestTimeoutError.
        """
        agent = await agent_of(ctx)
        return ReplyResult(reply=await agent.request(to, type, body, timeout=timeout))

    # -------------------------------------------------------------- votes
    @tool("vote_propose", _WRITE, "Propose a value for a vote")
    async def vote_propose(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                           candidates: Annotated[list[Any], Field(
                               description="The values to choose from (distinct JSON values).",
                               min_length=1, max_length=100)],
                           question: Annotated[str, Field(description="What is being decided.")] = "",
                           policy: Annotated[Literal["majority", "unanimous", "threshold"], Field(
                               description="'majority' (more than half of the ballots), 'unanimous', or "
                                           "'threshold' (at least `threshold` of the ballots).")] = "majority",
                           threshold: Annotated[float | None, Field(description="For 'threshold': the share "
                                                                                "a candidate needs, e.g. 0.66.",
                                                                    gt=0, le=1)] = None,
                           quorum: Annotated[int | None, Field(description="Fewest ballots for a decision "
                                                                           "(default 1).", ge=1)] = None,
                           voters: Annotated[list[str] | None, Field(description="Agent ids allowed to vote "
                                                                                 "(default: anyone; then a "
                                                                                 "deadline is required).")] = None,
                           deadline: Annotated[float | None, Field(description="Seconds from now until the vote "
                                                                               "closes.", gt=0)] = None,
                           ) -> ProposeResult:
        """Open a vote on the value of an entry; the accepted candidate is written to that entry.

        Example: {"board": "project-x", "section": "decisions", "key": "db", "candidates": ["postgres",
        "sqlite"], "voters": ["ana", "bo", "cy"], "question": "Which database?"}.
        """
        agent = await agent_of(ctx)
        rule = Policy(kind=policy, threshold=threshold, quorum=quorum)
        handle = await agent.board(board).propose(section, key, candidates, policy=rule, voters=voters,
                                                  deadline=deadline, question=question)
        return ProposeResult(proposal_id=handle.id, board=board, section=section, key=key)

    @tool("vote_cast", _WRITE, "Vote on a proposal")
    async def vote_cast(ctx: Context[Any, Any], board: BoardName,
                        proposal_id: Annotated[str, Field(description="The proposal's id.")],
                        choice: Annotated[Any, Field(description="A candidate's value, 'reject' or 'abstain'.")],
                        reason: Annotated[str | None, Field(description="Why (kept on record).")] = None,
                        ) -> VoteResult:
        """Cast (or replace) your ballot. Example: {"board": "project-x", "proposal_id": "9c1e...",
        "choice": "postgres", "reason": "we need concurrent writers"}."""
        agent = await agent_of(ctx)
        receipt = await agent.board(board).vote(proposal_id, choice, reason=reason)
        return VoteResult(proposal_id=receipt.proposal_id, ballot_id=receipt.ballot_id, decided=receipt.decided,
                          outcome=receipt.outcome)

    @tool("vote_outcome", _READ, "Read a proposal's outcome")
    async def vote_outcome(ctx: Context[Any, Any], board: BoardName,
                           proposal_id: Annotated[str, Field(description="The proposal's id.")],
                           wait: Annotated[float, Field(description="Seconds to wait for a decision "
                                                                    "(0: answer at once).", ge=0, le=60)] = 0,
                           ) -> OutcomeResult:
        """The outcome of a proposal (accepted value, rejected, no quorum), or 'open' with the tally so far.

        Example: {"board": "project-x", "proposal_id": "9c1e...", "wait": 5}.
        """
        agent = await agent_of(ctx)
        handle = await agent.board(board).proposal(proposal_id)
        if wait > 0:
            try:
                outcome = await handle.outcome(timeout=wait)
            except OutcomeTimeoutError:
                outcome = None
        else:
            outcome = await handle.commit()
        if outcome is None:
            return OutcomeResult(proposal_id=proposal_id, status="open", counts=await handle.counts())
        return OutcomeResult(proposal_id=proposal_id, status=outcome.status, outcome=outcome)

    # -------------------------------------------------------------- task claims
    @tool("task_claim", _WRITE, "Claim a task")
    async def task_claim(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                         ttl: Annotated[float, Field(description="Seconds the claim holds unless released "
                                                                 "(it lapses by itself after).",
                                                     ge=1, le=7 * 86400)] = 300,
                         note: Annotated[str | None, Field(description="What you are doing.")] = None,
                         ) -> ClaimResult:
        """Claim a task so no other agent works on it: creates the claim entry only if nobody holds it.

        Example: {"board": "project-x", "section": "claims", "key": "t1", "ttl": 600}.
        Held by another agent: a tool error naming the holder. Release it with task_release when done.
        """
        agent = await agent_of(ctx)
        b = agent.board(board)
        value = {"owner": agent.id, "claimed_at": datetime.now(UTC).isoformat(), "ttl": ttl, "note": note}
        try:
            rev = await b.create(section, key, value, ttl=ttl)
        except ConflictError as exc:
            holder = "another agent"
            try:
                current = await b.get(section, key)
                holder = current.author or holder
            except NotFoundError:
                pass
            raise ToolFailure(f"{board}/{section}/{key} is already claimed by {holder} (revision "
                              f"{exc.current_revision}); wait for its release or its time-to-live") from exc
        return ClaimResult(board=board, section=section, key=key, revision=rev, owner=agent.id, ttl=ttl)

    @tool("task_release", _DELETE, "Release a task you claimed")
    async def task_release(ctx: Context[Any, Any], board: BoardName, section: SectionName, key: KeyName,
                           revision: Annotated[int | None, Field(description="The claim's revision "
                                                                             "(task_claim's).", ge=1)] = None,
                           ) -> ReleaseResult:
        """Release your claim (deletes the claim entry, only if it is still yours).

        Example: {"board": "project-x", "section": "claims", "key": "t1", "revision": 17}.
        """
        agent = await agent_of(ctx)
        b = agent.board(board)
        current = await b.get(section, key)
        if current.author != agent.id:
            raise ToolFailure(f"{board}/{section}/{key} is claimed by {current.author}, not by you ({agent.id})")
        await b.delete(section, key, expected_revision=revision or current.revision)
        return ReleaseResult(board=board, section=section, key=key, released=True)


async def list_entries(agent: Agent, board: str, section: str | None,
                       where: ParsedWhere | None) -> list[Entry]:
    """The live entries of a board or section, sorted by (section, key), filtered by ``where``
    (``Board.entries``: read from JetStream, no worker needed).

    Raises:
        InvalidKeyError, InvalidPayloadError: a bad section name or ``where``.
    """
    return await agent.board(board).entries(section, where=where)
