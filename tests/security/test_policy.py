"""The declared access policy (pure) and the rights source that re-reads it (files)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from blackboard.protocol.errors import ConfigurationError
from blackboard.security import source as source_module
from blackboard.security.policy import (
    ALL_BOARDS,
    DEFAULT_POLICY,
    OPEN_RIGHTS,
    AccessPolicy,
    Right,
    Rights,
)
from blackboard.security.source import RightsSource
from blackboard.settings import DevSettings, NatsSettings, SecuritySettings, Settings

POLICY = """
version = 1

[roles.member]
boards = { "*" = ["read", "write", "vote"] }
topics = [">"]
objects = "write"

[roles.reader]
boards = { "*" = ["read"] }
objects = "read"

[roles.builds]
topics = ["build.*"]

[agents.planner]
roles = ["member"]
boards = { "secret" = ["admin"] }

[agents.auditor]
roles = ["reader"]

[agents.solo]
boards = { "b1" = ["read", "write"] }
topics = ["build.>", "deploy.done"]

[agents."ci-*"]
roles = ["reader"]
topics = ["ci.>"]

[agents."ci-untrusted-*"]
boards = { "sandbox" = ["write"] }
topics = []

[agents.ci-special]
roles = ["member"]

[agents.mixed]
roles = ["reader", "builds"]
boards = { "notes" = ["vote"] }
objects = "none"

[workers.worker]
[operators.admin]
"""


@pytest.fixture
def policy() -> AccessPolicy:
    return AccessPolicy.parse(POLICY)


def rights(policy: AccessPolicy, principal: str) -> Rights:
    found = policy.rights(principal)
    assert found is not None, principal
    return found


# ---------------------------------------------------------------------- parsing
def test_a_role_gives_its_rights_on_every_board(policy: AccessPolicy) -> None:
    r = rights(policy, "auditor")
    assert r.kind == "agent" and not r.system
    assert r.can("anything", Right.READ)
    assert not r.can("anything", Right.WRITE) and not r.can("anything", Right.VOTE)
    assert r.boards(Right.READ) is None  # every board
    assert r.boards(Right.WRITE) == frozenset()
    assert r.objects == "read"
    assert r.topics == (">",)  # no topics named anywhere: every topic


def test_an_agents_own_grants_add_to_its_roles(policy: AccessPolicy) -> None:
    r = rights(policy, "planner")
    assert r.can("x", Right.WRITE) and r.can("x", Right.VOTE)
    assert not r.can("x", Right.ADMIN)
    assert r.can("secret", Right.ADMIN)
    assert r.boards(Right.ADMIN) == frozenset({"secret"})
    assert r.objects == "write"


def test_admin_implies_read_write_and_vote() -> None:
    p = AccessPolicy.parse('[agents.a]\nboards = { "b" = ["admin"] }\n')
    r = rights(p, "a")
    assert r.grants["b"] == frozenset(Right)
    for right in Right:
        assert r.can("b", right)
        assert r.boards(right) == frozenset({"b"})
        assert not r.can("other", right)


def test_an_agent_with_one_board(policy: AccessPolicy) -> None:
    r = rights(policy, "solo")
    assert r.can("b1", Right.READ) and r.can("b1", Right.WRITE)
    assert not r.can("b1", Right.VOTE)
    assert not r.can("b2", Right.READ)
    assert r.boards(Right.READ) == frozenset({"b1"}) == r.boards(Right.WRITE)
    assert r.boards(Right.VOTE) == frozenset()
    assert r.objects == "none"  # the default
    assert r.topics == ("build.>", "deploy.done")


def test_the_all_boards_grant_and_a_named_board_combine() -> None:
    p = AccessPolicy.parse('[agents.a]\nboards = { "*" = ["read"], "mine" = ["write"] }\n')
    r = rights(p, "a")
    assert r.grants == {ALL_BOARDS: frozenset({Right.READ}), "mine": frozenset({Right.WRITE})}
    assert r.boards(Right.READ) is None
    assert r.boards(Right.WRITE) == frozenset({"mine"})
    assert r.can("mine", Right.READ) and r.can("elsewhere", Right.READ)
    assert not r.can("elsewhere", Right.WRITE)


def test_topics_of_roles_and_the_agent_are_a_union(policy: AccessPolicy) -> None:
    r = rights(policy, "mixed")
    assert r.topics == ("build.*",)
    assert r.topic_allowed("build.failed")
    assert not r.topic_allowed("build.failed.twice")
    assert not r.topic_allowed("deploy")
    assert not r.topic_allowed("build.>")  # a subscription pattern wider than the grant
    assert r.can("notes", Right.VOTE) and not r.can("notes", Right.WRITE)
    assert r.can("notes", Right.READ)  # from the reader role
    # objects = "none" on the agent does not lower what its role gives
    assert r.objects == "read"


def test_topic_patterns(policy: AccessPolicy) -> None:
    r = rights(policy, "solo")
    assert r.topic_allowed("build.x")
    assert r.topic_allowed("build.x.y")
    assert r.topic_allowed("build.*")
    assert r.topic_allowed("build.x.>")
    assert not r.topic_allowed("build")
    assert r.topic_allowed("deploy.done")
    assert not r.topic_allowed("deploy.*")
    assert not r.topic_allowed("deploy.started")
    assert not r.topic_allowed(">")
    assert rights(policy, "planner").topic_allowed("any.topic.at.all")


def test_objects_levels_take_the_highest() -> None:
    base = '[roles.r]\nobjects = "read"\n[roles.w]\nobjects = "write"\n'
    p = AccessPolicy.parse(base + '[agents.a]\nroles = ["r"]\n[agents.b]\nroles = ["r", "w"]\n'
                                  '[agents.c]\n[agents.d]\nroles = ["w"]\nobjects = "none"\n')
    assert rights(p, "a").objects == "read"
    assert rights(p, "b").objects == "write"
    assert rights(p, "c").objects == "none"
    assert rights(p, "d").objects == "write"


def test_an_empty_topic_list_grants_no_topics() -> None:
    r = rights(AccessPolicy.parse("[agents.a]\ntopics = []\n"), "a")
    assert r.topics == ()
    assert not r.topic_allowed("x")


# ------------------------------------------------------------------ globs and ids
def test_the_longest_matching_glob_declares_an_id(policy: AccessPolicy) -> None:
    ci = rights(policy, "ci-runner")
    assert ci.can("any", Right.READ) and ci.topics == ("ci.>",)
    untrusted = rights(policy, "ci-untrusted-7")
    # "ci-untrusted-*" is longer than "ci-*": it alone declares the id (no reader role).
    assert not untrusted.can("any", Right.READ)
    assert untrusted.can("sandbox", Right.WRITE)
    assert untrusted.topics == ()
    assert policy.kind_of("ci-untrusted-7") == "agent"


def test_an_exact_id_beats_any_glob(policy: AccessPolicy) -> None:
    special = rights(policy, "ci-special")
    assert special.can("x", Right.WRITE)
    assert special.topics == (">",)


def test_unknown_principals_have_no_rights(policy: AccessPolicy) -> None:
    assert policy.rights("stranger") is None
    assert policy.kind_of("stranger") is None
    assert policy.rights("ci") is None  # "ci-*" needs the dash


def test_workers_and_operators_are_the_system(policy: AccessPolicy) -> None:
    for principal, kind in (("worker", "worker"), ("admin", "operator")):
        r = rights(policy, principal)
        assert r.kind == kind and r.system
        assert policy.kind_of(principal) == kind
        for right in Right:
            assert r.can("whatever", right)
            assert r.boards(right) is None
        assert r.topic_allowed("any.thing") and r.topic_allowed(">")
        assert r.objects == "write"


def test_a_worker_glob_is_the_system_too() -> None:
    p = AccessPolicy.parse('[workers."w-*"]\n[agents."*"]\n')
    assert rights(p, "w-1").system
    assert not rights(p, "someone").system


def test_declared_and_principals_list_the_tables(policy: AccessPolicy) -> None:
    declared = policy.declared()
    assert declared["agent"] == sorted(["planner", "auditor", "solo", "ci-*", "ci-untrusted-*", "ci-special",
                                        "mixed"])
    assert declared["worker"] == ["worker"] and declared["operator"] == ["admin"]
    assert set(policy.principals("worker")) == {("worker", "worker")}
    assert ("operator", "admin") in set(policy.principals())


def test_open_rights_allow_everything() -> None:
    r = OPEN_RIGHTS("anyone")
    assert r.principal == "anyone" and r.kind == "agent"
    for right in Right:
        assert r.can("b", right) and r.boards(right) is None
    assert r.topic_allowed("a.b.>") and r.objects == "write"


def test_the_default_policy_declares_the_dev_principals() -> None:
    p = AccessPolicy.parse(DEFAULT_POLICY)
    assert rights(p, "planner").can("any", Right.VOTE)
    assert rights(p, "team-abc-planner").can("any", Right.WRITE)
    assert rights(p, "worker").system and p.kind_of("worker") == "worker"
    assert rights(p, "operator").system and p.kind_of("operator") == "operator"
    assert p.rights("someone-else") is None


def test_load_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[agents.a]\n")
    assert AccessPolicy.load(path).kind_of("a") == "agent"
    path.write_text("[agents.a]\nroles = ['nope']\n")
    with pytest.raises(ConfigurationError, match=r"policy\.toml"):
        AccessPolicy.load(path)
    with pytest.raises(ConfigurationError, match="cannot read the access policy"):
        AccessPolicy.load(tmp_path / "missing.toml")


# --------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("text", "message"), [
    ("[agents.a\n", "not valid TOML"),
    ("version = 2\n", "version 2 is not supported"),
    ('version = "1"\n', "version '1' is not supported"),
    ("[groups.a]\n", "unknown section.*groups"),
    ('[agents.a]\nboards = { b = ["read", "own"] }\n', "unknown right 'own'"),
    ('[agents.a]\nboards = { b = "read" }\n', "rights must be a list"),
    ('[agents.a]\nboards = ["b"]\n', "boards must be a table"),
    ('[agents.a]\nboards = { "b.c" = ["read"] }\n', r"agents\.a\.boards.*board must be"),
    ('[agents.a]\nboards = { "b*" = ["read"] }\n', "board must be"),
    ('[agents.a]\nboards = { ">" = ["read"] }\n', "board must be"),
    ('[agents.a]\nroles = ["ghost"]\n', "unknown role 'ghost'"),
    ('[agents.a]\nroles = "member"\n', "roles must be a list"),
    ("[agents.a]\ncolour = 1\n", "unknown field.*colour"),
    ('[roles.r]\nroles = ["x"]\n', "a role cannot name roles"),
    ("[roles.r]\nsize = 3\n", "unknown field.*size"),
    ('[agents.a]\nobjects = "all"\n', "objects must be one of none, read, write"),
    ("[agents.a]\nobjects = true\n", "objects must be one of"),
    ('[agents.a]\ntopics = "x"\n', "topics must be a list"),
    ('[agents.a]\ntopics = [""]\n', "topics must be a list"),
    ('[agents.a]\ntopics = ["a..b"]\n', "topics"),
    ('[agents.a]\ntopics = ["a.>.b"]\n', "topics"),
    ('[agents."a.b"]\n', "agents.a.b"),
    ('[workers."w x"]\n', "worker id"),
    ("agents = 3\n", r"\[agents\] must be a table"),
    ("roles = 3\n", r"\[roles\] must be a table"),
    ("[agents]\na = 3\n", "agents.a must be a table"),
    ("[agents.x]\n[workers.x]\n", "'x' is declared as both agent and worker"),
])
def test_invalid_policies_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        AccessPolicy.parse(text)


def test_an_unknown_role_names_the_principal_and_the_source() -> None:
    with pytest.raises(ConfigurationError) as info:
        AccessPolicy.parse('[operators.op]\nroles = ["root"]\n', source="/etc/bb/policy.toml")
    text = str(info.value)
    assert "/etc/bb/policy.toml" in text and "'op'" in text and "'root'" in text


# ---------------------------------------------------------------- the rights source
@pytest.fixture
def check_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look at the policy file at every call (not at most once a second)."""
    monkeypatch.setattr(source_module, "_CHECK_EVERY", 0.0)


def _rewrite(path: Path, text: str, *, bump: int) -> None:
    """Write the file and move its mtime on (a filesystem's clock may be coarser than the test)."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


@pytest.mark.usefixtures("check_always")
def test_the_rights_source_reads_a_changed_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[agents.a]\nboards = { b1 = ["read"] }\n')
    src = RightsSource(path)
    assert not src.open_bus
    assert rights_of(src, "a").can("b1", Right.READ)
    assert not rights_of(src, "a").can("b2", Right.READ)
    assert src.rights("b") is None
    _rewrite(path, '[agents.a]\nboards = { b2 = ["read"] }\n[agents.b]\n', bump=1)
    assert rights_of(src, "a").can("b2", Right.READ)
    assert not rights_of(src, "a").can("b1", Right.READ)
    assert src.rights("b") is not None


def rights_of(src: RightsSource, principal: str) -> Rights:
    found = src.rights(principal)
    assert found is not None
    return found


@pytest.mark.usefixtures("check_always")
def test_the_rights_source_keeps_the_last_good_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[agents.a]\nboards = { b1 = ["read"] }\n')
    src = RightsSource(path)
    _rewrite(path, "[agents.a\n", bump=1)
    with caplog.at_level(logging.ERROR, logger="blackboard.security.source"):
        assert rights_of(src, "a").can("b1", Right.READ)
        assert rights_of(src, "a").can("b1", Right.READ)
    # Said once per change of the file, not at every look.
    assert sum("invalid" in r.getMessage() for r in caplog.records) == 1
    path.unlink()
    assert rights_of(src, "a").can("b1", Right.READ)  # gone: still the last good one
    _rewrite(path, '[agents.a]\nboards = { b3 = ["write"] }\n', bump=2)
    assert rights_of(src, "a").can("b3", Right.WRITE)


def test_the_rights_source_checks_at_most_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[agents.a]\n")
    src = RightsSource(path)
    assert src.rights("a") is not None
    _rewrite(path, "[agents.b]\n", bump=1)
    assert src.rights("a") is not None  # not looked at again yet


def test_a_rights_source_needs_a_valid_policy_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the access policy"):
        RightsSource(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agents.a]\nroles = ['x']\n")
    with pytest.raises(ConfigurationError, match="unknown role"):
        RightsSource(bad)
    with pytest.raises(ConfigurationError, match="no access policy"):
        RightsSource(None)


def test_an_open_rights_source_allows_everyone() -> None:
    src = RightsSource(None, open_bus=True)
    r = rights_of(src, "anyone")
    assert r == OPEN_RIGHTS("anyone")


def _settings(tmp_path: Path, *, open_bus: bool = False, policy_file: Path | None = None,
              authority_dir: Path | None = None) -> Settings:
    return Settings().model_copy(update={
        "nats": NatsSettings(insecure_open_bus=open_bus),
        "security": SecuritySettings(policy_file=policy_file, authority_dir=authority_dir),
        "dev": DevSettings(data_dir=tmp_path / "data"),
    })


def test_from_settings_reads_the_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[agents.a]\n")
    src = RightsSource.from_settings(_settings(tmp_path, policy_file=path))
    assert src.policy_file == path and src.rights("a") is not None and src.rights("b") is None
    # A policy file wins over the open bus: its rights are what the service checks.
    src = RightsSource.from_settings(_settings(tmp_path, policy_file=path, open_bus=True))
    assert src.rights("b") is None


def test_from_settings_finds_the_authoritys_policy(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no access policy"):
        RightsSource.from_settings(_settings(tmp_path))
    dev_policy = tmp_path / "data" / "auth" / "policy.toml"
    dev_policy.parent.mkdir(parents=True)
    dev_policy.write_text("[agents.dev]\n")
    assert RightsSource.from_settings(_settings(tmp_path)).rights("dev") is not None
    authority = tmp_path / "authority"
    authority.mkdir()
    (authority / "policy.toml").write_text("[agents.prod]\n")
    src = RightsSource.from_settings(_settings(tmp_path, authority_dir=authority))
    assert src.rights("prod") is not None and src.rights("dev") is None


def test_from_settings_open_bus_without_a_policy_allows_everyone(tmp_path: Path) -> None:
    dev_policy = tmp_path / "data" / "auth" / "policy.toml"
    dev_policy.parent.mkdir(parents=True)
    dev_policy.write_text("[agents.dev]\n")
    src = RightsSource.from_settings(_settings(tmp_path, open_bus=True))
    assert src.open_bus and src.policy_file is None
    assert src.rights("anyone") == OPEN_RIGHTS("anyone")
