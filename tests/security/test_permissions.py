"""The NATS permissions derived from rights (pure): the exact allow lists of the contract
(docs/security.md), and what no agent's lists may ever allow."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackboard.protocol.subjects import Grants, subject_matches
from blackboard.security.permissions import Permissions, permissions_for
from blackboard.security.policy import ALL_BOARDS, AccessPolicy, ObjectAccess, Right, Rights

GRANTS = Grants("blackboard", "blackboard-objects")

#: What every agent may publish, whatever its rights (here for the agent "alice").
ALWAYS_PUB = [
    "$JS.API.INFO",
    "bb.msg.agent.*",
    "bb.rpc.*",
    "bb.search.alice.*",
    "bb.inbox.alice",
    "$JS.API.CONSUMER.MSG.NEXT.BB_MSG.inbox-alice",
    "$JS.API.CONSUMER.INFO.BB_MSG.inbox-alice",
    "$JS.API.CONSUMER.RESET.BB_MSG.inbox-alice",
    "$JS.ACK.BB_MSG.inbox-alice.>",
    "$JS.API.DIRECT.GET.BB_KEYS.bb.keys.>",
    "$JS.API.CONSUMER.CREATE.BB_KEYS.*.bb.keys.cert.*",
]
ALWAYS_SUB = ["_INBOX.alice.>", "bb.rpc.alice", "bb.msg.agent.alice", "bb.keys.revocations"]
#: alice's and bob's user keys (only the form matters here).
ALICE_KEY = "U" + "A" * 55
BOB_KEY = "U" + "B" * 55


def read_pub(board: str) -> list[str]:
    return [f"$JS.API.DIRECT.GET.KV_blackboard.$KV.blackboard.{board}.>",
            f"$JS.API.CONSUMER.CREATE.KV_blackboard.*.$KV.blackboard.{board}.>",
            f"$JS.API.DIRECT.GET.BB_VOTE.bb.vote.{board}.>",
            f"$JS.API.CONSUMER.CREATE.BB_VOTE.*.bb.vote.{board}.>",
            f"$JS.API.CONSUMER.CREATE.BB_MEMORY.*.bb.mem.{board}.>",
            f"$JS.API.DIRECT.GET.BB_MEMORY.bb.mem.{board}.>"]


def write_pub(board: str, me: str = "alice") -> list[str]:
    return [f"$KV.blackboard.{board}.>", f"bb.mem.{board}.{me}", f"bb.msg.board.{board}"]


def vote_pub(board: str, me: str = "alice") -> list[str]:
    return [f"bb.vote.{board}.*.proposal", f"bb.vote.{board}.*.ballot.{me}"]


OBJECT_READS = [
    "$JS.API.STREAM.INFO.OBJ_blackboard-objects",
    "$JS.API.STREAM.MSG.GET.OBJ_blackboard-objects",
    "$JS.API.DIRECT.GET.OBJ_blackboard-objects",
    "$JS.API.DIRECT.GET.OBJ_blackboard-objects.>",
    "$JS.API.CONSUMER.CREATE.OBJ_blackboard-objects",
    "$JS.API.CONSUMER.CREATE.OBJ_blackboard-objects.>",
    "$JS.API.CONSUMER.DELETE.OBJ_blackboard-objects.*",
]
OBJECT_WRITES = ["$O.blackboard-objects.>", "$JS.API.STREAM.PURGE.OBJ_blackboard-objects"]


def agent(grants: dict[str, set[Right]], *, topics: tuple[str, ...] = (">",), objects: ObjectAccess = "none",
          principal: str = "alice") -> Rights:
    return Rights(principal, "agent", {b: frozenset(r) for b, r in grants.items()}, topics, objects)


EVERY = {Right.READ, Right.WRITE, Right.VOTE}


def expected(*parts: str | list[str]) -> tuple[str, ...]:
    """The patterns, in order: single patterns and lists of them."""
    return tuple(p for part in parts for p in ([part] if isinstance(part, str) else part))


# ------------------------------------------------------------- exact allow lists
def test_a_member_on_every_board() -> None:
    perms = permissions_for(agent({ALL_BOARDS: EVERY}, objects="write"), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB, "bb.msg.topic.>", read_pub("*"), write_pub("*"), vote_pub("*"),
                                     OBJECT_READS, OBJECT_WRITES)
    assert perms.subscribe == expected(ALWAYS_SUB, ["bb.msg.topic.>", "bb.msg.board.*", "bb.vote.*.>"])
    assert perms.responses


def test_a_member_from_the_policy_matches_the_contract() -> None:
    policy = AccessPolicy.parse('[roles.member]\nboards = { "*" = ["read", "write", "vote"] }\n'
                                'objects = "write"\n[agents.alice]\nroles = ["member"]\n')
    rights = policy.rights("alice")
    assert rights is not None
    assert permissions_for(rights, GRANTS) == permissions_for(agent({ALL_BOARDS: EVERY}, objects="write"), GRANTS)


def test_a_reader_may_publish_nothing_that_writes() -> None:
    perms = permissions_for(agent({ALL_BOARDS: {Right.READ}}), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB, "bb.msg.topic.>", read_pub("*"))
    assert perms.subscribe == expected(ALWAYS_SUB, ["bb.msg.topic.>", "bb.msg.board.*", "bb.vote.*.>"])
    for subject in ("$KV.blackboard.b.s.k", "bb.mem.b.alice", "bb.msg.board.b", "bb.vote.b.p.proposal",
                    "bb.vote.b.p.ballot.alice", "$O.blackboard-objects.C.x"):
        assert not allows(perms.publish, subject), subject


def test_an_agent_with_one_board_only() -> None:
    perms = permissions_for(agent({"b1": EVERY}), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB, "bb.msg.topic.>", read_pub("b1"), write_pub("b1"), vote_pub("b1"))
    assert perms.subscribe == expected(ALWAYS_SUB, ["bb.msg.topic.>", "bb.msg.board.b1", "bb.vote.b1.>"])
    for subject in ("$KV.blackboard.b2.s.k", "bb.msg.board.b2", "bb.vote.b2.p.proposal",
                    "$JS.API.DIRECT.GET.KV_blackboard.$KV.blackboard.b2.s.k",
                    "$JS.API.CONSUMER.CREATE.KV_blackboard.c.$KV.blackboard.b2.>",
                    "$JS.API.CONSUMER.CREATE.BB_VOTE.c.bb.vote.b2.>"):
        assert not allows(perms.publish, subject), subject
    assert allows(perms.publish, "$KV.blackboard.b1.s.k")
    assert allows(perms.publish, "$JS.API.CONSUMER.CREATE.KV_blackboard.c.$KV.blackboard.b1.>")
    assert not allows(perms.subscribe, "bb.msg.board.b2")


def test_rights_per_board_give_patterns_per_board() -> None:
    perms = permissions_for(agent({"a": {Right.READ}, "b": {Right.WRITE}, "c": {Right.VOTE}}), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB, "bb.msg.topic.>", read_pub("a"), write_pub("b"), vote_pub("c"))
    assert perms.subscribe == expected(ALWAYS_SUB, ["bb.msg.topic.>", "bb.msg.board.a", "bb.vote.a.>"])


def test_narrowed_topics() -> None:
    perms = permissions_for(agent({}, topics=("build.*", "deploy.>")), GRANTS)
    topics = ["bb.msg.topic.build.*", "bb.msg.topic.deploy.>"]
    assert perms.publish == expected(ALWAYS_PUB, topics)
    assert perms.subscribe == expected(ALWAYS_SUB, topics)
    assert not allows(perms.publish, "bb.msg.topic.other")
    assert allows(perms.publish, "bb.msg.topic.deploy.x.y")


def test_no_topics() -> None:
    perms = permissions_for(agent({}, topics=()), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB) and perms.subscribe == expected(ALWAYS_SUB)


@pytest.mark.parametrize(("objects", "extra"), [
    ("none", []), ("read", OBJECT_READS), ("write", OBJECT_READS + OBJECT_WRITES)])
def test_object_store_levels(objects: ObjectAccess, extra: list[str]) -> None:
    perms = permissions_for(agent({}, topics=(), objects=objects), GRANTS)
    assert perms.publish == expected(ALWAYS_PUB, extra)
    assert perms.subscribe == expected(ALWAYS_SUB)


def test_other_buckets_are_named_in_the_patterns() -> None:
    grants = Grants("bb2", "files")
    perms = permissions_for(agent({"b": EVERY}, objects="write"), grants)
    assert "$KV.bb2.b.>" in perms.publish
    assert "$JS.API.DIRECT.GET.KV_bb2.$KV.bb2.b.>" in perms.publish
    assert "$O.files.>" in perms.publish and "$JS.API.STREAM.INFO.OBJ_files" in perms.publish
    assert not any("blackboard" in p for p in perms.publish)


@pytest.mark.parametrize("kind", ["worker", "operator"])
def test_the_system_may_use_everything(kind: str) -> None:
    rights = Rights("sys", kind, {}, (), "none")  # type: ignore[arg-type]
    assert permissions_for(rights, GRANTS) == Permissions((">",), (">",))


def test_an_identity_may_publish_only_its_own_keys_certificate() -> None:
    perms = permissions_for(agent({ALL_BOARDS: EVERY}), GRANTS, ALICE_KEY)
    assert f"bb.keys.cert.{ALICE_KEY}" in perms.publish
    assert allows(perms.publish, f"bb.keys.cert.{ALICE_KEY}")
    for subject in (f"bb.keys.cert.{BOB_KEY}", "bb.keys.revocations", "bb.keys.cert"):
        assert not allows(perms.publish, subject), subject
    assert allows(perms.publish, f"$JS.API.DIRECT.GET.BB_KEYS.bb.keys.cert.{BOB_KEY}")
    assert allows(perms.publish, "$JS.API.DIRECT.GET.BB_KEYS.bb.keys.revocations")
    # a one-shot consumer of a certificate (a replica behind answered 404), not of the revocations
    assert allows(perms.publish, f"$JS.API.CONSUMER.CREATE.BB_KEYS.c1.bb.keys.cert.{BOB_KEY}")
    assert not allows(perms.publish, "$JS.API.CONSUMER.CREATE.BB_KEYS.c1.bb.keys.revocations")
    assert not allows(perms.publish, "$JS.API.CONSUMER.CREATE.BB_KEYS.c1.bb.keys.>")
    assert allows(perms.subscribe, "bb.keys.revocations")
    assert not allows(perms.subscribe, f"bb.keys.cert.{BOB_KEY}")


def test_no_duplicates() -> None:
    perms = permissions_for(agent({ALL_BOARDS: EVERY, "b": EVERY}, topics=(">", ">")), GRANTS)
    assert len(perms.publish) == len(set(perms.publish))
    assert len(perms.subscribe) == len(set(perms.subscribe))


# ------------------------------------------------------------ what is never allowed
def allows(patterns: tuple[str, ...], subject: str) -> bool:
    return any(subject_matches(subject, p) for p in patterns)


#: Subjects no agent may publish to, whatever its rights: stream and consumer administration,
#: reads around the per-board patterns, and everything of another agent ("bob").
NEVER_PUB = [
    "anything", "$SYS.REQ.SERVER.PING", "$JS.API.ACCOUNT.PURGE", "$JS.API.META.LEADER.STEPDOWN",
    "$JS.API.STREAM.CREATE.X", "$JS.API.STREAM.UPDATE.BB_MSG", "$JS.API.STREAM.DELETE.KV_blackboard",
    "$JS.API.STREAM.PURGE.KV_blackboard", "$JS.API.STREAM.PURGE.BB_MSG", "$JS.API.STREAM.PURGE.BB_VOTE",
    "$JS.API.STREAM.INFO.KV_blackboard", "$JS.API.STREAM.MSG.GET.KV_blackboard",
    "$JS.API.STREAM.MSG.DELETE.KV_blackboard", "$JS.API.STREAM.MSG.DELETE.OBJ_blackboard-objects",
    "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.STREAM.DELETE.OBJ_blackboard-objects",
    "$JS.API.CONSUMER.DELETE.KV_blackboard.c", "$JS.API.CONSUMER.DELETE.BB_MSG.inbox-alice",
    "$JS.API.CONSUMER.DELETE.BB_VOTE.c", "$JS.API.CONSUMER.DELETE.BB_MEMORY.c",
    "$JS.API.CONSUMER.CREATE.BB_MSG", "$JS.API.CONSUMER.CREATE.BB_MSG.inbox-alice",
    "$JS.API.CONSUMER.CREATE.BB_MSG.inbox-alice.bb.msg.agent.alice",
    "$JS.API.CONSUMER.DURABLE.CREATE.BB_MSG.inbox-alice", "$JS.API.CONSUMER.CREATE.KV_blackboard",
    "$JS.API.CONSUMER.CREATE.BB_VOTE", "$JS.API.CONSUMER.CREATE.BB_MEMORY", "$JS.API.DIRECT.GET.BB_MEMORY",
    "$JS.API.CONSUMER.INFO.KV_blackboard.c", "$JS.API.CONSUMER.INFO.BB_VOTE.c",
    "$JS.API.CONSUMER.LIST.BB_MSG", "$JS.API.CONSUMER.NAMES.KV_blackboard",
    "$JS.API.DIRECT.GET.KV_blackboard", "$JS.API.DIRECT.GET.BB_VOTE", "$JS.API.DIRECT.GET.BB_MSG",
    "$JS.API.DIRECT.GET.BB_MSG.bb.msg.agent.bob",
    "bb.vote.b.p.outcome", "bb.vote.b.p.close", "bb.vote.b.p.applied", "bb.vote.b.p.ballot",
    # bob's
    "_INBOX.bob.x", "bb.inbox.bob", "bb.search.bob.knn", "bb.mem.b.bob", "bb.vote.b.p.ballot.bob",
    "$JS.API.CONSUMER.MSG.NEXT.BB_MSG.inbox-bob", "$JS.API.CONSUMER.INFO.BB_MSG.inbox-bob",
    "$JS.API.CONSUMER.RESET.BB_MSG.inbox-bob", "$JS.ACK.BB_MSG.inbox-bob.1.1.1.1.1.1.1",
    # the key registry: another key's certificate, the revocations, its stream's administration
    f"bb.keys.cert.{BOB_KEY}", "bb.keys.revocations", "bb.keys.cert.*", "$JS.API.STREAM.PURGE.BB_KEYS",
    "$JS.API.CONSUMER.CREATE.BB_KEYS", "$JS.API.DIRECT.GET.BB_KEYS",
]
NEVER_SUB = [
    "anything", "_INBOX.bob.x", "_INBOX.x", "bb.rpc.bob", "bb.msg.agent.bob", "bb.inbox.alice",
    "bb.search.alice.knn", "bb.mem.b.alice", "$KV.blackboard.b.s.k", "$JS.API.INFO",
    "$JS.ACK.BB_MSG.inbox-alice.1.1.1.1.1.1.1", "$O.blackboard-objects.C.x", "$SYS.ACCOUNT.x.CONNECT",
]

boards = st.sampled_from(["*", "b", "b1", "other"])
right_sets = st.frozensets(st.sampled_from(list(Right)), max_size=4)
topic_patterns = st.lists(st.sampled_from([">", "build.*", "deploy.>", "a.b.c", "*"]), max_size=3, unique=True)


@st.composite
def agent_rights(draw: st.DrawFn) -> Rights:
    grants = draw(st.dictionaries(boards, right_sets, max_size=3))
    expanded = {b: (frozenset(Right) if Right.ADMIN in r else r) for b, r in grants.items()}
    return Rights("alice", "agent", expanded, tuple(draw(topic_patterns)),
                  draw(st.sampled_from(["none", "read", "write"])))


@settings(max_examples=300, deadline=None)
@given(agent_rights())
def test_no_agent_is_ever_allowed_the_forbidden_subjects(rights: Rights) -> None:
    perms = permissions_for(rights, GRANTS, ALICE_KEY)
    everything = perms.publish + perms.subscribe
    assert ">" not in everything and "$JS.API.>" not in everything and "$JS.>" not in everything
    for subject in NEVER_PUB:
        assert not allows(perms.publish, subject), (subject, perms.publish)
    for subject in NEVER_SUB:
        assert not allows(perms.subscribe, subject), (subject, perms.subscribe)
    streams = [p for p in perms.publish if p.startswith("$JS.API.STREAM.")]
    if rights.objects == "none":
        assert streams == []
        assert not any("OBJ_" in p or p.startswith("$O.") for p in everything)
    else:
        allowed = {"$JS.API.STREAM.INFO.OBJ_blackboard-objects", "$JS.API.STREAM.MSG.GET.OBJ_blackboard-objects"}
        if rights.objects == "write":
            allowed.add("$JS.API.STREAM.PURGE.OBJ_blackboard-objects")
        assert set(streams) == allowed
    deletes = [p for p in perms.publish if p.startswith("$JS.API.CONSUMER.DELETE.")]
    assert all(p.startswith("$JS.API.CONSUMER.DELETE.OBJ_blackboard-objects.") for p in deletes)
    # Its own requests and replies, always.
    for subject in ("bb.search.alice.knn", "bb.inbox.alice", "$JS.API.CONSUMER.MSG.NEXT.BB_MSG.inbox-alice",
                    "$JS.ACK.BB_MSG.inbox-alice.1.1.1.1.1.1.1", "bb.msg.agent.bob", "bb.rpc.bob"):
        assert allows(perms.publish, subject), subject
    for subject in ("_INBOX.alice.x.y", "bb.rpc.alice", "bb.msg.agent.alice"):
        assert allows(perms.subscribe, subject), subject


@settings(max_examples=200, deadline=None)
@given(agent_rights())
def test_the_patterns_follow_the_rights(rights: Rights) -> None:
    perms = permissions_for(rights, GRANTS)
    for board in ("b", "b1", "other"):
        assert allows(perms.publish, f"$KV.blackboard.{board}.s.k") == rights.can(board, Right.WRITE)
        assert allows(perms.publish, f"bb.mem.{board}.alice") == rights.can(board, Right.WRITE)
        assert allows(perms.publish, f"bb.vote.{board}.p.ballot.alice") == rights.can(board, Right.VOTE)
        assert allows(perms.publish, f"bb.vote.{board}.p.proposal") == rights.can(board, Right.VOTE)
        assert allows(perms.publish, f"$JS.API.DIRECT.GET.KV_blackboard.$KV.blackboard.{board}.s.k") \
            == rights.can(board, Right.READ)
        assert allows(perms.subscribe, f"bb.msg.board.{board}") == rights.can(board, Right.READ)
        assert allows(perms.subscribe, f"bb.vote.{board}.p.outcome") == rights.can(board, Right.READ)
    for topic in ("build.x", "deploy.a.b", "a.b.c", "zzz"):
        assert allows(perms.publish, f"bb.msg.topic.{topic}") == rights.topic_allowed(topic)
        assert allows(perms.subscribe, f"bb.msg.topic.{topic}") == rights.topic_allowed(topic)
