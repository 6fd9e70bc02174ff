"""Wrong-typed arguments raise our typed errors from every public entry point (issue 18).

LLM-driven agents pass whatever they are told. Before, ``board.put(section={})``
raised "unhashable type: 'dict'" (the subject cache was looked up with the raw
value), ``agent.send(to=1.5)`` "'float' object is not iterable",
``board.search(metadata=b"..")`` "cannot convert dictionary update sequence",
``board.vote(proposal_id=[...])`` "unhashable type", and so on: raw ``TypeError``,
``AttributeError``, ``OverflowError`` or plain ``ValueError``. Each is now an
``InvalidKeyError`` or ``InvalidPayloadError`` (both ``ValueError``), raised
before anything is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest
import pytest_asyncio

from agents_sdk import Agent, Board, InvalidKeyError, InvalidPayloadError, ProposalNotFoundError
from blackboard.client.connection import connect_nats
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio

Call = Callable[[Agent, Board], Awaitable[Any] | Any]

def _deep(depth: int) -> Any:
    """A list nested ``depth`` deep: its ``str`` or ``repr`` raises RecursionError."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


DEEP = _deep(20_000)

#: (what, the call, the error it must raise).
CALLS: list[tuple[str, Call, type[Exception]]] = [
    ("put section dict", lambda a, b: b.put({}, "k", 1), InvalidKeyError),  # type: ignore[arg-type]
    ("put section list", lambda a, b: b.put(["s"], "k", 1), InvalidKeyError),  # type: ignore[arg-type]
    ("get section dict", lambda a, b: b.get({}, "k"), InvalidKeyError),  # type: ignore[arg-type]
    ("history section list", lambda a, b: b.history(["s"], "k"), InvalidKeyError),  # type: ignore[arg-type]
    ("delete section dict", lambda a, b: b.delete({}, "k"), InvalidKeyError),  # type: ignore[arg-type]
    ("create section dict", lambda a, b: b.create({}, "k", 1), InvalidKeyError),  # type: ignore[arg-type]
    ("purge section only", lambda a, b: b.purge("s"), InvalidKeyError),
    ("put tags float", lambda a, b: b.put("s", "k", 1, tags=1.5), InvalidPayloadError),  # type: ignore[arg-type]
    ("put tags str", lambda a, b: b.put("s", "k", 1, tags="urgent"), InvalidPayloadError),
    ("put ttl dict", lambda a, b: b.put("s", "k", 1, ttl={}), InvalidPayloadError),  # type: ignore[arg-type]
    ("put ttl nan", lambda a, b: b.put("s", "k", 1, ttl=float("nan")), InvalidPayloadError),
    ("update revision dict", lambda a, b: b.update("s", "k", 1, expected_revision={}),  # type: ignore[arg-type]
     InvalidPayloadError),
    ("update revision -1", lambda a, b: b.update("s", "k", 1, expected_revision=-1), InvalidPayloadError),
    ("attach data str", lambda a, b: b.attach("s", "k", "text", content_type="a/b"),  # type: ignore[arg-type]
     InvalidPayloadError),
    ("search metadata bytes", lambda a, b: b.search("q", metadata=b".."), InvalidPayloadError),  # type: ignore[typeddict-item]
    ("search tags float", lambda a, b: b.search("q", tags_any=1.5), InvalidPayloadError),  # type: ignore[typeddict-item]
    ("recall metadata float", lambda a, b: a.recall("q", metadata=1.5), InvalidPayloadError),  # type: ignore[typeddict-item]
    ("propose section dict", lambda a, b: b.propose({}, "k", ["a", "b"], voters=["v"]),  # type: ignore[arg-type]
     InvalidKeyError),
    ("propose candidates float", lambda a, b: b.propose("s", "k", 1.5, voters=["v"]),  # type: ignore[arg-type]
     InvalidPayloadError),
    ("propose bytes candidate", lambda a, b: b.propose("s", "k", [b"x", "b"], voters=["v"]), InvalidPayloadError),
    ("propose voters float", lambda a, b: b.propose("s", "k", ["a", "b"], voters=1.5),  # type: ignore[arg-type]
     InvalidKeyError),
    ("propose deadline 1e30", lambda a, b: b.propose("s", "k", ["a", "b"], voters=["v"], deadline=10**30),
     InvalidPayloadError),
    ("propose deadline nan", lambda a, b: b.propose("s", "k", ["a", "b"], voters=["v"], deadline=float("nan")),
     InvalidPayloadError),
    ("vote proposal list", lambda a, b: b.vote(["p"], 0), InvalidKeyError),  # type: ignore[arg-type]
    ("proposal id dict", lambda a, b: b.proposal({}), InvalidKeyError),  # type: ignore[arg-type]
    ("send to float", lambda a, b: a.send(1.5, "t"), InvalidKeyError),  # type: ignore[arg-type]
    ("send to huge int", lambda a, b: a.send(10**30, "t"), InvalidKeyError),  # type: ignore[arg-type]
    ("send to list of dicts", lambda a, b: a.send([{}], "t"), InvalidKeyError),  # type: ignore[list-item]
    ("send to deep list", lambda a, b: a.send(DEEP, "t"), InvalidKeyError),
    ("put section deep list", lambda a, b: b.put(DEEP, "k", 1), InvalidKeyError),
    ("put key deep list", lambda a, b: b.put("s", DEEP, 1), InvalidKeyError),
    ("update revision deep list", lambda a, b: b.update("s", "k", 1, expected_revision=DEEP), InvalidPayloadError),
    ("propose deadline 10**5000", lambda a, b: b.propose("s", "k", ["a", "b"], voters=["v"], deadline=10**5000),
     InvalidPayloadError),
    ("propose deadline deep list", lambda a, b: b.propose("s", "k", ["a", "b"], voters=["v"], deadline=DEEP),
     InvalidPayloadError),
    ("send metadata float", lambda a, b: a.send("peer", "t", metadata=1.5), InvalidPayloadError),  # type: ignore[arg-type]
    ("send metadata str", lambda a, b: a.send("peer", "t", metadata="ab"), InvalidPayloadError),  # type: ignore[arg-type]
    ("request timeout dict", lambda a, b: a.request("peer", "t", timeout={}), InvalidPayloadError),  # type: ignore[arg-type]
    ("join dict", lambda a, b: a.join({}), InvalidKeyError),  # type: ignore[arg-type]
    ("forget ids float", lambda a, b: a.forget(1.5), InvalidPayloadError),  # type: ignore[arg-type]
    ("remember id bytes", lambda a, b: a.remember("t", id=b"m-1"), None),  # type: ignore[arg-type]
    ("board name dict", lambda a, b: a.board({}), InvalidKeyError),  # type: ignore[arg-type]
    ("inbox types float", lambda a, b: a.inbox(types=1.5), InvalidPayloadError),  # type: ignore[arg-type]
    ("inbox batch dict", lambda a, b: a.inbox(batch={}), InvalidPayloadError),  # type: ignore[arg-type]
    ("inbox batch 0", lambda a, b: a.inbox(batch=0), InvalidPayloadError),
    ("object name dict", lambda a, b: a.objects.put({}, b"d"), InvalidKeyError),  # type: ignore[arg-type]
    ("object get list", lambda a, b: a.objects.get(["n"]), InvalidKeyError),  # type: ignore[arg-type]
]


@pytest_asyncio.fixture
async def agent(settings: Settings) -> AsyncIterator[Agent]:
    async with Agent.connect("wrong-types", settings=settings) as a:
        yield a


@pytest.mark.parametrize(("what", "call", "error"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_wrong_typed_argument_raises_a_typed_error(agent: Agent, what: str, call: Call,
                                                           error: type[Exception] | None) -> None:
    board = agent.board("wrongtypes")
    if error is None:  # accepted as the schema coerces it, and nothing raw escapes
        result = call(agent, board)
        if isinstance(result, Awaitable):
            await result
        return
    with pytest.raises(error):
        result = call(agent, board)
        if isinstance(result, Awaitable):
            await result


async def test_a_stored_proposal_with_a_bytes_candidate_reads_as_no_proposal(agent: Agent, settings: Settings,
                                                                             unique: str) -> None:
    """Another writer's proposal with a bytes candidate: before, ``board.proposal`` raised
    json's raw TypeError ("Object of type bytes is not JSON serializable")."""
    nc = await connect_nats(settings.nats, name="mallory")
    try:
        record = {"v": 1, "id": "p", "board": unique, "section": "s", "key": "k", "candidates": [b"x", "b"],
                  "voters": ["v1"], "proposer": "v1", "created_at": "2026-01-01T00:00:00+00:00"}
        await nc.jetstream().publish(Subjects.vote(unique, "p", "proposal"), msgpack.packb(record))
    finally:
        await nc.close()
    with pytest.raises(ProposalNotFoundError):
        await agent.board(unique).proposal("p")
