"""docs/protocol.md stays true: generated schemas, key-encoding table, envelope example."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import pytest

from blackboard.protocol import codec
from blackboard.protocol.entries import encode_entry
from blackboard.protocol.schemas import (
    Ballot,
    BallotRejection,
    CountedBallot,
    EntryEnvelope,
    MemoryForget,
    MemoryRecord,
    MessageEnvelope,
    Outcome,
    Policy,
    Proposal,
    SourceRef,
    TallyCounts,
    WireModel,
    json_schemas,
    validate_wire,
)
from blackboard.protocol.schemas.__main__ import (
    BEGIN_MARKER,
    END_MARKER,
    doc_section,
    main,
    render_schemas,
    splice_doc,
)
from blackboard.protocol.subjects import Header, decode_key, encode_key

if TYPE_CHECKING:
    from blackboard.security.signer import Signer
    from blackboard.security.verifier import Verifier

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_generated_schema_section_is_current(doc: str) -> None:
    assert doc_section(doc) == render_schemas(json_schemas()), (
        "docs/protocol.md is stale: run python -m blackboard.protocol.schemas --write-doc docs/protocol.md"
    )


def test_every_wire_model_has_a_generated_heading(doc: str) -> None:
    section = doc_section(doc)
    for name in json_schemas():
        assert f"\n### {name}\n" in section


def test_splice_replaces_only_the_generated_section() -> None:
    text = f"intro\n{BEGIN_MARKER}\nold stuff\n{END_MARKER}\noutro\n"
    out = splice_doc(text, "new\n")
    assert out == f"intro\n{BEGIN_MARKER}\nnew\n{END_MARKER}\noutro\n"
    assert doc_section(out) == "new\n"
    assert splice_doc(out, "new\n") == out


def test_splice_refuses_a_document_without_markers() -> None:
    with pytest.raises(ValueError):
        splice_doc("no markers here", "x")
    with pytest.raises(ValueError):
        doc_section(f"{END_MARKER}\n{BEGIN_MARKER}")


def test_write_doc_refreshes_a_stale_copy_and_check_doc_detects_it(tmp_path: Path, doc: str) -> None:
    stale = tmp_path / "protocol.md"
    stale.write_text(splice_doc(doc, "stale\n"), encoding="utf-8")
    assert main(["--check-doc", str(stale)]) == 1
    assert main(["--write-doc", str(stale)]) == 0
    fresh = stale.read_text(encoding="utf-8")
    assert doc_section(fresh) == render_schemas(json_schemas())
    assert fresh.split(BEGIN_MARKER)[0] == doc.split(BEGIN_MARKER)[0]
    assert fresh.split(END_MARKER)[1] == doc.split(END_MARKER)[1]
    assert main(["--check-doc", str(stale)]) == 0


def test_key_encoding_table_matches_encode_key(doc: str) -> None:
    start = doc.index("| Key | Token |")
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", doc[start:doc.index("Reference implementations", start)],
                      re.MULTILINE)
    assert len(rows) >= 8
    for key, token in rows:
        assert encode_key(key) == token
        assert decode_key(token) == key


def test_envelope_hex_example_matches_the_codec(doc: str) -> None:
    match = re.search(r"\(110 bytes; what the Python SDK writes[^)]*\)\):\n\n```\n([0-9a-f \n]+)```", doc)
    assert match is not None
    example = bytes.fromhex(match.group(1).replace("\n", " "))
    encoded = encode_entry("hi", author="a1", tags=["x"], created_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert example == encoded
    assert msgpack.unpackb(example)["content_type"] == "text/plain"


def test_every_header_is_documented(doc: str) -> None:
    table = doc[doc.index("## 3. Headers"):doc.index("## 4. The entry envelope")]
    for header in Header:
        assert f"| `{header.value}` |" in table, header.value


def _canonical_table(doc: str) -> dict[str, list[str]]:
    start = doc.index("### 13.2 Fields per record")
    table = doc[start:doc.index("### 13.3", start)]
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \| [^|]+ \|$", table, re.MULTILINE)
    return {name: re.findall(r"`(\w+)`", fields) for name, fields in rows}


def test_canonical_field_table_matches_the_schemas(doc: str) -> None:
    table = _canonical_table(doc)
    records: list[type[WireModel]] = [EntryEnvelope, MemoryRecord, MemoryForget, MessageEnvelope, Proposal,
                                      Policy, Ballot, Outcome, TallyCounts, CountedBallot, BallotRejection,
                                      SourceRef]
    assert set(table) == {m.__name__ for m in records}
    for model in records:
        assert table[model.__name__] == list(model.model_fields), model.__name__


def test_canonical_example_matches_the_encoder(doc: str) -> None:
    section = doc[doc.index("### 13.3 Example"):doc.index("### 13.4")]
    wire = re.search(r"```json\n(.+)\n```", section)
    hex_dump = re.search(r"\((\d+) bytes\).*?```\n([0-9a-f \n]+)```", section, re.DOTALL)
    assert wire is not None and hex_dump is not None
    record = validate_wire(MemoryRecord, codec.decode(wire.group(1).encode(), "json"))
    expected = bytes.fromhex(hex_dump.group(2).replace("\n", " "))
    assert len(expected) == int(hex_dump.group(1))
    assert record.canonical_bytes() == expected


# --------------------------------------------------------------------------- §14 Signatures
def _signature_section(doc: str) -> str:
    return doc[doc.index("## 14. Signatures"):doc.index("## 15. JSON Schemas")]


def _subsection(doc: str, heading: str) -> str:
    """The text of a ``### 14.x`` subsection of §14, up to the next one."""
    section = _signature_section(doc)
    start = section.index(heading)
    end = section.find("\n### ", start + len(heading))
    return section[start:] if end < 0 else section[start:end]


def _example(doc: str) -> tuple[dict[str, str], list[str]]:
    """The worked example's table (name -> value) and its fenced blocks, in order."""
    example = _subsection(doc, "### 14.9 Worked example")
    rows = dict(re.findall(r"^\| `?([^|`]+?)`? \| `([^`]+)`", example, re.MULTILINE))
    blocks = re.findall(r"```\n(.*?)```", example, re.DOTALL)
    return rows, blocks


def _hex(block: str) -> bytes:
    return bytes.fromhex(block.replace("\n", " "))


def _example_signer(key: str, seed: str) -> Signer:
    """The Signer of the worked examples' seed, as principal a1 (any certificate: the JWT only
    names the principal), signing with RFC 8032's own nonce, so that its signatures reproduce."""
    from blackboard.security.jwt import Credentials, encode, new_seed, user_claims
    from blackboard.security.signer import Signer

    jwt = encode(user_claims(key, "a1", issued_at=1735787000, pub_allow=[], sub_allow=[]), new_seed("account"))
    return Signer(Credentials(jwt, seed), deterministic=True)


def _example_verifier(key: str) -> Verifier:
    """A verifier that knows ``key`` as the certificate of agent a1 (and no other key)."""
    from blackboard.security.certificates import KeyInfo
    from blackboard.security.verifier import Verifier

    class _Keys:
        def lookup(self, public_key: str) -> KeyInfo | None:
            return KeyInfo(key, "a1", "agent", datetime(2025, 1, 1, tzinfo=UTC)) if public_key == key else None

        def revoked_at(self, public_key: str) -> datetime | None:
            return None

        async def ensure(self, public_key: str) -> KeyInfo | None:
            return self.lookup(public_key)

    return Verifier(_Keys(), max_skew=30.0, cache_size=0)


def test_signature_example_is_what_the_signer_produces(doc: str) -> None:
    from nacl.signing import VerifyKey

    from blackboard.protocol.signing import SCHEME, parse_signature, signing_input

    rows, blocks = _example(doc)
    record_hex, lines, input_hex, signature = blocks
    seed, key, subject = rows["seed"], rows["Bb-Sig-Key"], rows["subject"]
    msg_id, signed_at = rows["Nats-Msg-Id"], int(rows["Bb-Sig-Time"])
    headers = {Header.MSG_ID.value: msg_id,
               Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: rows["Nats-Expected-Last-Subject-Sequence"]}

    # the record's canonical encoding is the hex shown (and its stated length)
    record = validate_wire(EntryEnvelope, codec.decode(rows["record"].encode(), "json")).canonical_bytes()
    assert record == _hex(record_hex)
    assert f"canonical encoding ({len(record)} bytes" in doc

    # the signing input: the eight lines shown, then the record; its hex and length
    expected_input = signing_input(subject, headers, signed_at, key, record)
    assert expected_input == lines.encode() + record
    assert lines.splitlines() == [SCHEME, subject, msg_id, str(signed_at), "41", "", "", key]
    assert expected_input == _hex(input_hex)
    assert f"signing input ({len(expected_input)} bytes" in doc

    # the signature the Signer makes with that seed (any certificate: the JWT only names the principal)
    signer = _example_signer(key, seed)
    assert signer.public_key == key
    signed = dict(headers)
    signer.sign(subject, signed, record, now_us=signed_at)
    assert signed[Header.SIG.value] == signature.strip()
    assert signed[Header.SIG_KEY.value] == key and signed[Header.SIG_TIME.value] == str(signed_at)
    parsed = parse_signature(signed)
    assert parsed is not None and parsed.signed_at_us == signed_at

    # and it checks with the public key alone, decoded as the section says (base32, prefix, CRC-16)
    raw = base64.b32decode(key + "=" * (-len(key) % 8))
    assert len(raw) == 35 and raw[0] == 0xA0
    assert _crc16_xmodem(raw[:33]) == int.from_bytes(raw[33:], "little")
    VerifyKey(raw[1:33]).verify(expected_input, parsed.signature)

    # a verifier that knows the key (as principal a1) accepts the message as shown, stored on time
    from blackboard.security.verifier import Signed

    verifier = _example_verifier(key)
    stored = datetime.fromtimestamp(signed_at / 1_000_000, UTC)
    assert verifier.check(Signed(subject, signed, record, stored_at=stored, author="a1")) == "verified"
    assert verifier.check(Signed(subject, signed, record, stored_at=stored, author="a2")) == "wrong_author"


def _crc16_xmodem(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def test_signature_headers_and_verdicts_are_documented_in_order(doc: str) -> None:
    from blackboard.protocol.signing import Verdict

    section = _signature_section(doc)
    headers = section[section.index("### 14.1"):section.index("### 14.2")]
    assert re.findall(r"^\| `(Bb-[A-Za-z-]+)` \|", headers, re.MULTILINE) == [
        Header.SIG_KEY.value, Header.SIG_TIME.value, Header.SIG.value, Header.SIG_PATH.value]
    verdicts = section[section.index("### 14.5"):section.index("### 14.6")]
    assert re.findall(r"^\| `(\w+)` \|", verdicts, re.MULTILINE) == [v.value for v in Verdict]


def _batch_example(doc: str) -> tuple[dict[str, str], list[tuple[str, str, str]], dict[int, str], list[str]]:
    """§14.10's worked example: the shared table, the records (subject, msg id, JSON), the paths
    by record number and the fenced blocks, in order."""
    text = _subsection(doc, "### 14.10 Batch signatures")
    example = text[text.index("#### Worked example"):]
    shared = dict(re.findall(r"^\| `?([^|`]+?)`? \| `([^`]+)`", example, re.MULTILINE))
    records = re.findall(r"^\| \d \| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|$", example, re.MULTILINE)
    paths = {int(n): path for n, path in re.findall(r"^\| (\d) \| `([^`]+)` \|$", example, re.MULTILINE)}
    blocks = re.findall(r"```\n(.*?)```", example, re.DOTALL)
    return shared, records, paths, blocks


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _named_hashes(block: str) -> dict[str, bytes]:
    return {name: bytes.fromhex(value) for name, value in re.findall(r"^(\w+) += ([0-9a-f]{64})$", block,
                                                                        re.MULTILINE)}


def test_batch_signature_example_is_what_the_signer_produces(doc: str) -> None:
    from nacl.signing import VerifyKey

    from blackboard.protocol.signing import (
        BATCH_SCHEME,
        batch_message,
        encode_path,
        fold_path,
        leaf_hash,
        merkle_tree,
        node_hash,
        parse_path,
        parse_signature,
        signing_input,
    )
    from blackboard.security.verifier import Signed

    shared, records, paths, blocks = _batch_example(doc)
    lines0, leaves_block, nodes_block, message_hex, signature = blocks
    seed, key, signed_at = shared["seed"], shared["Bb-Sig-Key"], int(shared["Bb-Sig-Time"])
    assert len(records) == 3 and sorted(paths) == [0, 1, 2]
    assert seed in _subsection(doc, "### 14.9 Worked example")  # the same key as the single example

    writes: list[tuple[str, dict[str, str], bytes]] = []
    for subject, msg_id, record_json in records:
        record = validate_wire(EntryEnvelope, codec.decode(record_json.encode(), "json")).canonical_bytes()
        writes.append((subject, {Header.MSG_ID.value: msg_id}, record))
    inputs = [signing_input(subject, headers, signed_at, key, record) for subject, headers, record in writes]

    # record 0's eight lines as shown, and the lengths the text states
    assert inputs[0] == lines0.encode() + writes[0][2]
    text = _subsection(doc, "### 14.10 Batch signatures")
    assert f"record 0 ({len(inputs[0])} bytes)" in text and f"its {len(writes[0][2])} canonical bytes" in text
    assert f"record 1's ({len(inputs[1])} bytes)" in text and f"record 2's ({len(inputs[2])}" in text

    # the leaves, the inner node and the root, by the rules of the text
    leaves = [hashlib.sha256(b"\x00" + data).digest() for data in inputs]
    assert _named_hashes(leaves_block) == {"L0": leaves[0], "L1": leaves[1], "L2": leaves[2]}
    assert [leaf_hash(data) for data in inputs] == leaves
    inner = hashlib.sha256(b"\x01" + leaves[0] + leaves[1]).digest()
    root = hashlib.sha256(b"\x01" + inner + leaves[2]).digest()
    assert _named_hashes(nodes_block) == {"N": inner, "root": root}
    assert node_hash(inner, leaves[2]) == root
    tree_root, tree_paths = merkle_tree(leaves)
    assert tree_root == root

    # the batch message, and the signature over it
    message = _hex(message_hex)
    assert message == BATCH_SCHEME.encode() + b"\n" + root == batch_message(root)
    assert len(message) == 47 and b"bb-sig/1 batch" == BATCH_SCHEME.encode() and len(BATCH_SCHEME) == 14
    raw = base64.b32decode(key + "=" * (-len(key) % 8))
    parsed_sig = base64.urlsafe_b64decode(signature.strip() + "==")
    VerifyKey(raw[1:33]).verify(message, parsed_sig)

    # the paths: text as shown, each folding its leaf to the root (sibling on L: node(s, h))
    assert paths[0] == f"R{_b64(leaves[1])}.R{_b64(leaves[2])}"
    assert paths[1] == f"L{_b64(leaves[0])}.R{_b64(leaves[2])}"
    assert paths[2] == f"L{_b64(inner)}"
    for n, leaf in enumerate(leaves):
        assert encode_path(tree_paths[n]) == paths[n]
        assert fold_path(leaf, parse_path(paths[n])) == root

    # the Signer signs the batch so: shared key, time and signature, each record its path
    signer = _example_signer(key, seed)
    signer.sign_batch(writes, now_us=signed_at)
    for n, (_, headers, _) in enumerate(writes):
        assert headers[Header.SIG_KEY.value] == key and headers[Header.SIG_TIME.value] == str(signed_at)
        assert headers[Header.SIG.value] == signature.strip()
        assert headers[Header.SIG_PATH.value] == paths[n]
        parsed = parse_signature(headers)
        assert parsed is not None and parsed.path == parse_path(paths[n])

    # a verifier that knows the key accepts each record with its own path, and none with another's
    verifier = _example_verifier(key)
    stored = datetime.fromtimestamp(signed_at / 1_000_000, UTC)
    for subject, headers, record in writes:
        assert verifier.check(Signed(subject, headers, record, stored_at=stored, author="a1")) == "verified"
    subject, headers, record = writes[0]
    swapped = {**headers, Header.SIG_PATH.value: paths[1]}
    assert verifier.check(Signed(subject, swapped, record, stored_at=stored, author="a1")) == "bad_signature"
