"""NATS JWTs signed with nkeys, and the ``.creds`` format (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from blackboard.protocol.errors import AuthenticationError
from blackboard.security.jwt import (
    Credentials,
    account_claims,
    decode_claims,
    encode,
    new_seed,
    operator_claims,
    public_key,
    render_creds,
    user_claims,
    verify,
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _parts(token: str) -> tuple[dict[str, str], dict[str, object], str]:
    head, payload, signature = token.split(".")

    def unb64(text: str) -> bytes:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

    return json.loads(unb64(head)), json.loads(unb64(payload)), signature


@pytest.mark.parametrize(("kind", "seed_prefix", "key_prefix"),
                         [("operator", "SO", "O"), ("account", "SA", "A"), ("user", "SU", "U")])
def test_seeds_and_public_keys(kind: str, seed_prefix: str, key_prefix: str) -> None:
    seed = new_seed(kind)
    assert seed.startswith(seed_prefix) and len(seed) == 58
    key = public_key(seed)
    assert key.startswith(key_prefix) and len(key) == 56
    assert public_key(seed) == key
    assert new_seed(kind) != seed


def test_a_bad_seed_is_an_authentication_error() -> None:
    with pytest.raises(AuthenticationError, match="not a valid nkey seed"):
        public_key("SUnotaseed")


def test_encode_then_verify_round_trips() -> None:
    account = new_seed("account")
    user = new_seed("user")
    claims = user_claims(public_key(user), "alice", issued_at=1_700_000_000, pub_allow=["a.>"], sub_allow=["b"])
    token = encode(claims, account)
    head, body, _ = _parts(token)
    assert head == {"typ": "JWT", "alg": "ed25519-nkey"}
    verified = verify(token)
    assert verified == body == decode_claims(token)
    assert verified["iss"] == public_key(account)
    assert verified["sub"] == public_key(user)
    assert verified["name"] == "alice" and verified["iat"] == 1_700_000_000
    assert isinstance(verified["jti"], str) and verified["jti"]
    nats = verified["nats"]
    assert nats["type"] == "user" and nats["version"] == 2
    assert nats["pub"] == {"allow": ["a.>"]} and nats["sub"] == {"allow": ["b"]}
    assert nats["resp"] == {"max": 1, "ttl": 0}
    # Deterministic: the same claims and key give the same token (ed25519 signatures are).
    assert encode(claims, account) == token


def test_jti_depends_on_the_claims_and_a_given_jti_is_replaced() -> None:
    account = new_seed("account")
    a = decode_claims(encode({"iat": 1, "name": "a", "jti": "mine"}, account))
    b = decode_claims(encode({"iat": 1, "name": "b"}, account))
    assert a["jti"] != "mine" and a["jti"] != b["jti"]


def test_a_tampered_payload_does_not_verify() -> None:
    token = encode({"iat": 1, "name": "alice", "nats": {"pub": {"allow": ["a"]}}}, new_seed("account"))
    head, _, signature = token.split(".")
    _, claims, _ = _parts(token)
    claims["nats"] = {"pub": {"allow": [">"]}}
    forged = f"{head}.{_b64(json.dumps(claims).encode())}.{signature}"
    assert decode_claims(forged)["nats"] == {"pub": {"allow": [">"]}}  # reads, unverified
    with pytest.raises(AuthenticationError, match="does not verify"):
        verify(forged)


def test_a_tampered_signature_does_not_verify() -> None:
    token = encode({"iat": 1, "name": "alice"}, new_seed("account"))
    head, payload, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[0] ^= 1
    for bad in (_b64(bytes(raw)), "", signature[:20]):
        with pytest.raises(AuthenticationError, match="does not verify"):
            verify(f"{head}.{payload}.{bad}")


def test_a_token_signed_by_another_key_does_not_verify() -> None:
    real, other = new_seed("account"), new_seed("account")
    token = encode({"iat": 1, "name": "alice"}, other)
    head, _, signature = token.split(".")
    _, claims, _ = _parts(token)
    claims["iss"] = public_key(real)  # claims to come from the real issuer
    with pytest.raises(AuthenticationError, match="does not verify"):
        verify(f"{head}.{_b64(json.dumps(claims).encode())}.{signature}")


@pytest.mark.parametrize("iss", [None, "", "not-a-key", "A" * 56, 42])
def test_a_bad_issuer_does_not_verify(iss: object) -> None:
    token = encode({"iat": 1, "name": "alice"}, new_seed("account"))
    head, _, signature = token.split(".")
    _, claims, _ = _parts(token)
    claims["iss"] = iss
    with pytest.raises(AuthenticationError):
        verify(f"{head}.{_b64(json.dumps(claims).encode())}.{signature}")


@pytest.mark.parametrize("garbage", [
    "", "garbage", "a.b", "a.b.c.d", "a.!!!.c", "a.é.c",
    f"x.{_b64(b'[1, 2]')}.y", f"x.{_b64(b'not json')}.y", f"x.{_b64(bytes([0xff, 0xfe]))}.y",
])
def test_decoding_garbage_is_an_authentication_error(garbage: str) -> None:
    with pytest.raises(AuthenticationError, match="not a NATS JWT"):
        decode_claims(garbage)
    with pytest.raises(AuthenticationError):
        verify(garbage)


def test_operator_and_account_claims() -> None:
    operator, account, system = new_seed("operator"), new_seed("account"), new_seed("account")
    op = verify(encode(operator_claims(operator, "op", public_key(system), issued_at=5), operator))
    assert op["sub"] == op["iss"] == public_key(operator)
    assert op["nats"] == {"type": "operator", "version": 2, "system_account": public_key(system)}
    acct = verify(encode(account_claims(account, "app", issued_at=5, jetstream=True,
                                        revocations={"UB": 3, "UA": 4}), operator))
    assert acct["iss"] == public_key(operator) and acct["sub"] == public_key(account)
    limits = acct["nats"]["limits"]
    assert limits["disk_storage"] == -1 and limits["mem_storage"] == -1 and limits["conn"] == -1
    assert acct["nats"]["revocations"] == {"UA": 4, "UB": 3}
    sys_acct = decode_claims(encode(account_claims(system, "SYS", issued_at=5, jetstream=False), operator))
    assert "disk_storage" not in sys_acct["nats"]["limits"]
    assert "revocations" not in sys_acct["nats"]


def test_user_claims_options() -> None:
    claims = user_claims("UKEY", "bob", issued_at=9, pub_allow=[], sub_allow=["x"], pub_deny=["y"],
                         responses=False, tags=["bb-kind:agent"], expires=99)
    assert claims["exp"] == 99 and claims["sub"] == "UKEY" and claims["name"] == "bob"
    assert claims["nats"]["pub"] == {"allow": [], "deny": ["y"]}
    assert claims["nats"]["tags"] == ["bb-kind:agent"]
    assert "resp" not in claims["nats"]


# --------------------------------------------------------------------- .creds files
def _credentials(name: str = "alice") -> Credentials:
    user = new_seed("user")
    token = encode(user_claims(public_key(user), name, issued_at=1, pub_allow=[], sub_allow=[]), new_seed("account"))
    return Credentials(token, user)


def test_creds_render_then_parse_round_trips() -> None:
    creds = _credentials()
    text = creds.render()
    assert text == render_creds(creds.jwt, creds.seed)
    assert text.startswith("-----BEGIN NATS USER JWT-----\n" + creds.jwt + "\n------END NATS USER JWT------\n")
    assert "-----BEGIN USER NKEY SEED-----\n" + creds.seed + "\n------END USER NKEY SEED------\n" in text
    assert Credentials.parse(text) == creds
    assert creds.principal == "alice"
    assert creds.public_key == public_key(creds.seed) == creds.claims["sub"]


def test_creds_as_nsc_writes_them_parse() -> None:
    creds = _credentials("bob")
    nsc = (  # nsc's layout, with CRLF line ends and indentation some tools add
        "-----BEGIN NATS USER JWT-----\r\n"
        f"  {creds.jwt}\r\n"
        "------END NATS USER JWT------\r\n\r\n"
        "************************* IMPORTANT *************************\r\n"
        "-----BEGIN USER NKEY SEED-----\r\n"
        f"{creds.seed}\r\n"
        "------END USER NKEY SEED------\r\n"
    )
    parsed = Credentials.parse(nsc)
    assert parsed == creds and parsed.principal == "bob"


@pytest.mark.parametrize("text", [
    "", "garbage",
    "-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n",
    "-----BEGIN USER NKEY SEED-----\nSUABC\n------END USER NKEY SEED------\n",
])
def test_text_that_is_not_a_creds_file_is_refused(text: str) -> None:
    with pytest.raises(AuthenticationError, match=r"creds/x\.creds is not a NATS \.creds file"):
        Credentials.parse(text, source="creds/x.creds")


def test_the_principal_is_the_jwts_name() -> None:
    user = new_seed("user")
    account = new_seed("account")
    for claims in ({"iat": 1}, {"iat": 1, "name": ""}, {"iat": 1, "name": 7}):
        with pytest.raises(AuthenticationError, match="names no identity"):
            _ = Credentials(encode(claims, account), user).principal
    with pytest.raises(AuthenticationError, match="not a NATS JWT"):
        _ = Credentials("garbage", user).principal
