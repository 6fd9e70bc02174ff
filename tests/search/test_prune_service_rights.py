"""The rights of the search service's prune, archive and restore (pure: no server).

docs/security.md, "Who may prune": own memories need ``write`` on the board, every author's
(``scope="all"``) or another agent's by id need ``admin``; the wire models refuse what the
service would; the layers' copies of the strategies and of the importance weights agree.
"""

from __future__ import annotations

import typing

import pytest

from blackboard.db import prune_sql
from blackboard.protocol.errors import InvalidPayloadError, PermissionDeniedError
from blackboard.protocol.schemas import validate_wire
from blackboard.protocol.schemas.prune import (
    MAX_ARCHIVE_IDS,
    MAX_PRUNE_LIMIT,
    PRUNE_STRATEGIES,
    MemoryArchiveRequest,
    MemoryPruneRequest,
    PruneStrategy,
)
from blackboard.search.lifecycle import check_authors, check_prune
from blackboard.security.policy import AccessPolicy, Rights
from blackboard.settings import MemorySettings
from blackboard.worker.importance import ImportanceWeights

POLICY = AccessPolicy.parse("""
version = 1
[agents.writer]
boards = { "team" = ["read", "write"] }
[agents.reader]
boards = { "team" = ["read"] }
[agents.boss]
boards = { "team" = ["admin"], "other" = ["read", "write"] }
[workers.worker]
""")


def rights(principal: str) -> Rights:
    found = POLICY.rights(principal)
    assert found is not None
    return found


def test_own_needs_write_and_all_needs_admin() -> None:
    check_prune(rights("writer"), "team", "own")
    check_prune(rights("boss"), "team", "all")
    check_prune(rights("boss"), "other", "own")
    check_prune(rights("worker"), "anything", "all")  # the system holds every right
    with pytest.raises(PermissionDeniedError) as caught:
        check_prune(rights("writer"), "team", "all")
    assert "team" in str(caught.value) and "admin" in str(caught.value)
    assert caught.value.operation == "prune all on board team"
    with pytest.raises(PermissionDeniedError) as caught:
        check_prune(rights("boss"), "other", "all")  # admin on team only
    assert caught.value.operation == "prune all on board other"
    with pytest.raises(PermissionDeniedError) as caught:
        check_prune(rights("reader"), "team", "own", "archive")
    assert caught.value.operation == "archive on board team" and "may not write" in str(caught.value)


def test_another_agents_memory_by_id_needs_admin() -> None:
    check = check_authors(rights("writer"), "team", "archive")
    check({"m1": "writer", "m2": "writer"})
    check({})
    with pytest.raises(PermissionDeniedError) as caught:
        check({"m1": "writer", "m2": "boss", "m3": "other"})
    message = str(caught.value)
    assert "m2" in message and "m3" in message and "m1" not in message and "'team'" in message
    assert caught.value.operation == "archive another agent's memories on board team"
    check_authors(rights("boss"), "team", "restore")({"m1": "writer"})
    with pytest.raises(PermissionDeniedError):
        check_authors(rights("boss"), "other", "restore")({"m1": "writer"})
    many = {f"m{i}": "boss" for i in range(8)}
    with pytest.raises(PermissionDeniedError, match="and 3 more"):
        check_authors(rights("writer"), "team", "archive")(many)


def test_prune_request_validation() -> None:
    req = validate_wire(MemoryPruneRequest, {"v": 1, "board": "team", "strategy": "lru", "threshold": 60})
    assert (req.scope, req.dry_run, req.limit) == ("own", False, None)
    for bad in ({"board": "team", "strategy": "random"}, {"board": "team", "scope": "everyone"},
                {"board": "no such board"}, {"board": "team", "threshold": -1},
                {"board": "team", "limit": 0}, {"board": "team", "limit": MAX_PRUNE_LIMIT + 1}):
        with pytest.raises(InvalidPayloadError):
            validate_wire(MemoryPruneRequest, {"v": 1, **bad})


def test_archive_request_validation() -> None:
    req = validate_wire(MemoryArchiveRequest, {"v": 1, "board": "team", "ids": ["a"]})
    assert req.reason == "archived"
    for bad in ({"ids": []}, {"ids": ["x"] * (MAX_ARCHIVE_IDS + 1)}, {"ids": ["a"], "reason": "merged"},
                {"ids": ["a"], "reason": "conflict"}, {"ids": ["a"], "reason": "two words"}):
        with pytest.raises(InvalidPayloadError):
            validate_wire(MemoryArchiveRequest, {"v": 1, "board": "team", **bad})


def test_the_layers_agree_on_strategies_and_weights() -> None:
    assert PRUNE_STRATEGIES == prune_sql.STRATEGIES == typing.get_args(PruneStrategy)
    assert typing.get_args(prune_sql.PruneStrategy) == typing.get_args(PruneStrategy)
    for memory in (MemorySettings(), MemorySettings(weight_recency=3, weight_frequency=0, weight_confidence=1,
                                                    weight_importance=2, recency_half_life=60, frequency_scale=4),
                   MemorySettings(weight_recency=0, weight_frequency=0, weight_confidence=0, weight_importance=0)):
        w = ImportanceWeights.from_settings(memory)
        assert prune_sql.importance_params(memory) == {
            "w_recency": w.recency, "w_frequency": w.frequency, "w_confidence": w.confidence,
            "w_importance": w.importance, "half_life": w.half_life, "frequency_scale": w.frequency_scale}
