"""Credential discovery (docs/security.md "Credentials"): the order, the binding of an id to
its credential, and the errors that name what was searched. Pure and file IO only."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from blackboard.protocol.errors import AuthenticationError, InvalidKeyError
from blackboard.security import credentials as credentials_module
from blackboard.security.credentials import (
    CA_FILE_NAME,
    credential_kind,
    credential_principal,
    find_credentials,
    resolve_credentials,
    search_paths,
)
from blackboard.security.jwt import (
    Credentials,
    encode,
    new_seed,
    public_key,
    render_creds,
    user_claims,
)
from blackboard.settings import DevSettings, NatsSettings, Settings

ACCOUNT = new_seed("account")


def _creds(name: str, *, kind: str = "agent") -> Credentials:
    seed = new_seed("user")
    claims = user_claims(public_key(seed), name, issued_at=1, pub_allow=[">"], sub_allow=[">"],
                         tags=[f"bb-kind:{kind}"])
    return Credentials(encode(claims, ACCOUNT), seed)


def _write(path: Path, creds: Credentials) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(creds.render(), encoding="utf-8")
    return path


def _settings(tmp_path: Path, **nats: object) -> Settings:
    return Settings().model_copy(update={"nats": NatsSettings(**nats),
                                         "dev": DevSettings(data_dir=tmp_path / "dev")})


def _fake_jwt(claims: dict[str, object]) -> str:
    """A JWT-shaped token (header.payload.signature) that nobody signed: the client reads only the claims."""
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'typ': 'JWT', 'alg': 'ed25519-nkey'})}.{part(claims)}.c2lnbmF0dXJl"


# -- parsing -----------------------------------------------------------------------

def test_a_creds_file_text_is_read_for_its_jwt_name_and_tags() -> None:
    seed = new_seed("user")
    text = render_creds(_fake_jwt({"name": "alice", "nats": {"tags": ["bb-kind:agent"]}}), seed)
    creds = Credentials.parse(text)
    assert creds.seed == seed
    assert credential_principal(creds, "test") == "alice"
    assert credential_kind(creds) == "agent"
    assert credential_kind(Credentials(_fake_jwt({"name": "a"}), seed)) is None


@pytest.mark.parametrize("jwt", [_fake_jwt({"sub": "U"}), _fake_jwt({"name": "not an id!"}), "not.a-jwt",
                                 "onlyonepart"])
def test_a_jwt_without_a_valid_name_is_an_authentication_error(jwt: str) -> None:
    with pytest.raises(AuthenticationError, match="origin-x"):
        credential_principal(Credentials(jwt, new_seed("user")), "origin-x")


# -- the order -------------------------------------------------------------------

def test_search_paths_follow_the_documented_order(tmp_path: Path) -> None:
    s = _settings(tmp_path, creds_file=tmp_path / "me.creds", credentials_dir=tmp_path / "dir")
    assert [p for _, p in search_paths("alice", s)] == [
        tmp_path / "me.creds", tmp_path / "dir" / "alice.creds", tmp_path / "dev" / "auth" / "creds" / "alice.creds"]
    assert [p for _, p in search_paths("alice", _settings(tmp_path))] == [
        tmp_path / "dev" / "auth" / "creds" / "alice.creds"]


def test_the_explicit_argument_wins_as_a_path_or_an_object(tmp_path: Path) -> None:
    mine = _creds("alice")
    s = _settings(tmp_path, creds_file=_write(tmp_path / "env.creds", _creds("alice")))
    by_path = find_credentials("alice", s, _write(tmp_path / "x" / "mine.creds", mine))
    assert by_path is not None and by_path.credentials == mine and by_path.path == tmp_path / "x" / "mine.creds"
    assert "credentials argument" in by_path.origin
    by_str = find_credentials("alice", s, str(tmp_path / "x" / "mine.creds"))
    assert by_str is not None and by_str.credentials == mine
    by_object = find_credentials("alice", s, mine)
    assert by_object is not None and by_object.credentials == mine and by_object.path is None
    assert resolve_credentials("alice", s, mine) == mine


def test_settings_then_the_directory_then_the_dev_directory(tmp_path: Path) -> None:
    in_file, in_dir, in_dev = _creds("alice"), _creds("alice"), _creds("alice")
    dev = _write(tmp_path / "dev" / "auth" / "creds" / "alice.creds", in_dev)
    _write(tmp_path / "dir" / "alice.creds", in_dir)
    _write(tmp_path / "env.creds", in_file)
    full = _settings(tmp_path, creds_file=tmp_path / "env.creds", credentials_dir=tmp_path / "dir")
    assert resolve_credentials("alice", full) == in_file
    assert resolve_credentials("alice", _settings(tmp_path, credentials_dir=tmp_path / "dir")) == in_dir
    found = find_credentials("alice", _settings(tmp_path, credentials_dir=tmp_path / "empty"))
    assert found is not None and found.credentials == in_dev and found.path == dev
    assert "blackboard dev" in found.origin


def test_a_ca_beside_the_credential_is_found_with_it(tmp_path: Path) -> None:
    _write(tmp_path / "dir" / "alice.creds", _creds("alice"))
    s = _settings(tmp_path, credentials_dir=tmp_path / "dir")
    found = find_credentials("alice", s)
    assert found is not None and found.ca_file is None
    (tmp_path / "dir" / CA_FILE_NAME).write_text("-----BEGIN CERTIFICATE-----\n")
    found = find_credentials("alice", s)
    assert found is not None and found.ca_file == tmp_path / "dir" / CA_FILE_NAME


# -- binding -----------------------------------------------------------------------

def test_an_explicit_credential_of_another_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError) as err:
        find_credentials("alice", _settings(tmp_path), _creds("bob"))
    assert "'bob'" in str(err.value) and "'alice'" in str(err.value)
    assert err.value.principal == "alice"
    with pytest.raises(AuthenticationError, match="'bob'"):
        find_credentials("alice", _settings(tmp_path), _write(tmp_path / "b.creds", _creds("bob")))


def test_a_file_named_for_the_id_that_holds_another_ids_credential_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "dir" / "alice.creds", _creds("bob"))
    _write(tmp_path / "dev" / "auth" / "creds" / "alice.creds", _creds("alice"))
    with pytest.raises(AuthenticationError, match="'bob'"):
        find_credentials("alice", _settings(tmp_path, credentials_dir=tmp_path / "dir"))


def test_the_process_wide_creds_file_of_another_id_is_passed_over(tmp_path: Path) -> None:
    alice = _creds("alice")
    _write(tmp_path / "env.creds", _creds("bob"))
    _write(tmp_path / "dir" / "alice.creds", alice)
    s = _settings(tmp_path, creds_file=tmp_path / "env.creds", credentials_dir=tmp_path / "dir")
    assert resolve_credentials("alice", s) == alice
    assert resolve_credentials("bob", s) is not None
    # ... and named in the error when nothing else is found
    with pytest.raises(AuthenticationError, match="credential of 'bob'"):
        find_credentials("carol", s)


# -- nothing found -----------------------------------------------------------------

def test_no_credential_anywhere_names_the_places_searched_and_the_fix(tmp_path: Path) -> None:
    s = _settings(tmp_path, creds_file=tmp_path / "none.creds", credentials_dir=tmp_path / "dir")
    with pytest.raises(AuthenticationError) as err:
        find_credentials("alice", s)
    text = str(err.value)
    for place in (tmp_path / "none.creds", tmp_path / "dir" / "alice.creds",
                  tmp_path / "dev" / "auth" / "creds" / "alice.creds"):
        assert str(place) in text
    assert "blackboard auth add alice" in text and "blackboard dev --agent alice" in text
    assert "INSECURE_OPEN_BUS" in text
    assert err.value.principal == "alice"


def test_the_open_bus_connects_without_a_credential_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(credentials_module, "_warned_open_bus", False)
    s = _settings(tmp_path, insecure_open_bus=True)
    with caplog.at_level(logging.WARNING, logger="blackboard.security.credentials"):
        assert find_credentials("alice", s) is None
        assert resolve_credentials("bob", s) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "INSECURE" in warnings[0].getMessage()
    # a credential that is there is still used on an open bus
    alice = _creds("alice")
    _write(tmp_path / "dev" / "auth" / "creds" / "alice.creds", alice)
    assert resolve_credentials("alice", s) == alice


# -- bad files -----------------------------------------------------------------------

def test_a_file_that_is_not_a_creds_file_names_itself(tmp_path: Path) -> None:
    bad = tmp_path / "dir" / "alice.creds"
    bad.parent.mkdir()
    bad.write_text("hello\n")
    with pytest.raises(AuthenticationError, match=str(bad)):
        find_credentials("alice", _settings(tmp_path, credentials_dir=tmp_path / "dir"))
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AuthenticationError, match="not text"):
        find_credentials("alice", _settings(tmp_path, credentials_dir=tmp_path / "dir"))


def test_an_explicit_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError, match="no credential file"):
        find_credentials("alice", _settings(tmp_path), tmp_path / "missing.creds")


def test_an_invalid_principal_is_refused_before_any_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(InvalidKeyError):
        find_credentials("../etc/passwd", _settings(tmp_path, insecure_open_bus=True))


def test_found_credentials_do_not_show_the_seed(tmp_path: Path) -> None:
    creds = _creds("alice")
    found = find_credentials("alice", _settings(tmp_path), creds)
    assert creds.seed not in repr(found)


# -- the authority this host holds -------------------------------------------------------

_AUTHORITY_POLICY = """\
version = 1
[agents."team-*"]
boards = { "*" = ["read"] }
[operators.operator]
"""


def _authority_settings(tmp_path: Path, *, explicit: bool, **nats: object) -> Settings:
    from blackboard.settings import SecuritySettings

    s = _settings(tmp_path, **nats)
    if explicit:
        s = s.model_copy(update={"security": SecuritySettings(authority_dir=tmp_path / "authority")})
    return s


@pytest.mark.parametrize("explicit", [True, False])
def test_a_host_that_holds_the_authority_is_issued_a_declared_ids_credential(tmp_path: Path,
                                                                             explicit: bool) -> None:
    from blackboard.protocol.subjects import Grants
    from blackboard.security.authority import Authority

    directory = tmp_path / "authority" if explicit else tmp_path / "dev" / "auth"  # the dev one: its keys exist
    authority = Authority(directory, Grants())
    authority.init(policy=_AUTHORITY_POLICY)
    s = _authority_settings(tmp_path, explicit=explicit)
    found = find_credentials("team-x-planner", s)
    assert found is not None and found.principal == "team-x-planner"
    assert found.path == directory / "creds" / "team-x-planner.creds"
    assert "identity authority" in found.origin
    again = find_credentials("team-x-planner", s)  # the same key, not a new one each time
    assert again is not None and again.credentials == found.credentials
    with pytest.raises(AuthenticationError, match="not declared"):
        find_credentials("stranger", s)
    # on an open bus an undeclared id connects without a credential instead
    assert find_credentials("stranger", s.model_copy(
        update={"nats": NatsSettings(insecure_open_bus=True)})) is None


def test_an_authority_dir_without_keys_is_an_authentication_error(tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError, match="from the identity authority"):
        find_credentials("team-x", _authority_settings(tmp_path, explicit=True))
    # the dev directory without keys is simply not an authority
    with pytest.raises(AuthenticationError, match="no credential for 'team-x'"):
        find_credentials("team-x", _authority_settings(tmp_path, explicit=False))
