"""docs/protocol.md stays true: generated schemas, key-encoding table, envelope example."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

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
    match = re.search(r"\(102 bytes\):\n\n```\n([0-9a-f \n]+)```", doc)
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
                                      Policy, Ballot, Outcome, TallyCounts, CountedBallot, BallotRejection]
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
