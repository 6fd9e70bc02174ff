"""What a principal's search may read (pure): blackboard.search.access and the message scope's SQL."""

from __future__ import annotations

import re

import pytest

from blackboard.db.messages_sql import message_search
from blackboard.protocol.errors import PermissionDeniedError
from blackboard.protocol.schemas.message_search import MessageSearchRequest
from blackboard.protocol.schemas.search import EntrySearchRequest, MemorySearchRequest
from blackboard.protocol.subjects import Subjects, pattern_regex, subject_matches
from blackboard.search.access import message_scope, scoped_search
from blackboard.security.policy import OPEN_RIGHTS, Right, Rights

READ = frozenset({Right.READ})
ALICE = Rights("alice", "agent", {"x": READ, "y": frozenset({Right.WRITE})}, ("ops.>",))


def test_a_search_naming_no_board_is_restricted_to_the_readable_ones() -> None:
    scoped = scoped_search(MemorySearchRequest(query="q", kinds=["episodic"]), ALICE)
    assert scoped is not None and scoped.boards == ["x"] and scoped.filters.boards == ["x"]
    assert scoped.kinds == ["episodic"] and scoped.query == "q"
    entries = scoped_search(EntrySearchRequest(query="q", sections=["s"]), ALICE)
    assert entries is not None and entries.filters.boards == ["x"] and entries.filters.sections == ["s"]


def test_a_search_naming_readable_boards_runs_as_asked() -> None:
    req = MemorySearchRequest(query="q", boards=["x"])
    assert scoped_search(req, ALICE) is req
    unrestricted = MemorySearchRequest(query="q")
    assert scoped_search(unrestricted, OPEN_RIGHTS("anyone")) is unrestricted
    assert scoped_search(unrestricted, Rights("w", "worker")) is unrestricted


@pytest.mark.parametrize("boards", [["y"], ["x", "y"], ["z"]])
def test_a_board_it_may_not_read_is_refused(boards: list[str]) -> None:
    with pytest.raises(PermissionDeniedError, match="may not read board") as caught:
        scoped_search(EntrySearchRequest(query="q", boards=boards), ALICE)
    assert caught.value.operation is not None and caught.value.operation.startswith("search entries on board ")


def test_no_readable_board_finds_nothing() -> None:
    assert scoped_search(MemorySearchRequest(query="q"), Rights("nobody", "agent")) is None


def test_the_message_scope_is_by_subject_and_rights() -> None:
    scope = message_scope(ALICE)
    assert scope is not None
    assert scope.direct == Subjects.direct("alice") and scope.boards == frozenset({"x"})
    assert scope.topics == (pattern_regex(Subjects.topic("ops.>")),)
    assert message_scope(Rights("w", "worker")) is None
    assert message_scope(OPEN_RIGHTS("bob")) is not None  # the open bus: every board, but only bob's own directs
    query, params = message_search(MessageSearchRequest(senders=["alice"]), scope)
    assert Subjects.direct("alice") in params and ["alice"] in params and ["x"] in params
    text = query.as_string(None)
    assert "m.subject = %s" in text and "m.subject ~ ANY" in text and "m.board = ANY" in text
    _, unscoped = message_search(MessageSearchRequest(senders=["alice"]))
    assert unscoped == [["alice"], 50]


@pytest.mark.parametrize("pattern", ["bb.msg.topic.>", "bb.msg.topic.a.*", "bb.msg.topic.a.>", "bb.msg.topic.a-b_c",
                                     "bb.msg.topic.*.x.>"])
@pytest.mark.parametrize("subject", ["bb.msg.topic.a", "bb.msg.topic.a.b", "bb.msg.topic.a.b.c", "bb.msg.topic.a-b_c",
                                     "bb.msg.topic.z.x.y", "bb.msg.topic.z.x", "bb.msg.topicXa", "bb.msg.board.a"])
def test_pattern_regex_matches_what_the_pattern_matches(pattern: str, subject: str) -> None:
    assert bool(re.search(pattern_regex(pattern), subject)) == subject_matches(subject, pattern)
