"""The worker's memory rows carry the version-2 fields, the content hash and the signature
headers, on both decoding paths (pure: no servers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import SourceRef
from blackboard.protocol.schemas.provenance import source_ref
from blackboard.protocol.subjects import Header, Subjects
from blackboard.worker.decode import MemoryRow, RawMessage, decode_memory
from blackboard.worker.dedup import content_hash, normalize_text

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SIGNED = {Header.SIG_KEY.value: "U" * 56, Header.SIG.value: "s" * 86}


def _row(record: dict[str, Any], headers: dict[str, str] | None = None, json: bool = False) -> MemoryRow:
    obj = {"id": "m1", "board": "b", "agent": "a", "text": "Hello  World", "created_at": T0.isoformat(), **record}
    h = dict(headers or {})
    if json:
        h[Header.ENCODING.value] = "json"
    data = codec.encode(obj, "json" if json else "msgpack")
    row = decode_memory(RawMessage("BB_MEMORY", 9, Subjects.memory("b", "a"), h, data, T0),
                        max_bytes=1 << 20, index_chars=1000)
    assert isinstance(row, MemoryRow)
    return row


@pytest.mark.parametrize("json", [False, True])  # the fast path (msgpack) and the schema's (JSON)
def test_version_2_fields_reach_the_row(json: bool) -> None:
    when = datetime(2025, 5, 1, 9, 30, tzinfo=timezone(timedelta(hours=-4)))
    row = _row({"v": 2, "key": "price:sku-1", "occurred_at": when.isoformat(), "confidence": 1}, SIGNED, json)
    assert (row.key, row.occurred_at, row.confidence) == ("price:sku-1", when, 1.0)
    assert type(row.confidence) is float
    assert row.valid_from == when and row.provenance == []
    assert row.content_hash == content_hash("hello world")
    ref = source_ref("BB_MEMORY", 9, SIGNED)
    assert (row.sig_key, row.sig) == (ref.key, ref.sig) == ("U" * 56, "s" * 86)


@pytest.mark.parametrize("json", [False, True])
def test_a_version_1_row_has_no_lifecycle_fields_and_is_valid_from_its_write_time(json: bool) -> None:
    row = _row({}, json=json)
    assert (row.key, row.occurred_at, row.confidence, row.provenance, row.sig_key, row.sig) == (
        None, None, None, [], None, None)
    assert row.valid_from == T0 and row.content_hash == content_hash("hello   world ")
    # oversized signature headers are not kept (as source_ref reads them)
    long = {Header.SIG_KEY.value: "U" * 200, Header.SIG.value: "s" * 129}
    assert (_row({}, long, json).sig_key, _row({}, long, json).sig) == (None, None)


def test_provenance_is_read_through_the_schema() -> None:
    prov = [{"stream": "BB_MEMORY", "seq": 3, "key": "U" * 56, "sig": "s" * 86}, {"stream": "BB_MEMORY", "seq": 4}]
    row = _row({"v": 2, "provenance": prov})
    assert row.provenance == [SourceRef(**prov[0]), SourceRef(stream="BB_MEMORY", seq=4)]


@pytest.mark.parametrize("bad", [{"key": "k"}, {"v": 2, "key": "a\tb"}, {"v": 2, "confidence": 2},
                                 {"v": 2, "occurred_at": "2025-01-01T00:00:00"},
                                 {"v": 2, "provenance": [{"stream": "S", "seq": 0}]}, {"v": 3}])
def test_bad_version_2_fields_are_dead_letters(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayloadError):
        _row(bad)


def test_content_hash_normalises_case_width_and_whitespace() -> None:
    same = ["The Price is 12 EUR", "  the price is 12 eur\n", "THE\u00a0PRICE\tIS 12 EUR", "Ｔｈｅ price is １２ EUR"]
    assert len({content_hash(t) for t in same}) == 1
    assert content_hash("the price is 13 EUR") != content_hash(same[0])
    assert normalize_text("Straße  ﬁne") == "strasse fine"  # casefold and NFKC (the ligature)
    assert len(content_hash("x")) == 32


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_normalisation_is_nfkc_casefold_and_collapsed_whitespace(text: str) -> None:
    import re
    import unicodedata

    expected = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()
    assert normalize_text(text) == expected
