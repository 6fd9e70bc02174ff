"""The ingest hot path's pure parts: ack-subject parsing, the fast decoders, binary COPY encoding."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import psycopg
import pytest

from blackboard.db import pgcopy
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker import decode as d

_SUBJECTS = Subjects("blackboard")
_NOW = datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)


def test_parse_ack_reply_reads_stream_seq_and_exact_time() -> None:
    ns = 1_795_327_951_167_440_789
    v1 = f"$JS.ACK.KV_b.w-entries.1.55.3.{ns}.0"
    v2 = f"$JS.ACK.dom.acchash.KV_b.w-entries.2.56.4.{ns}.7.tok"
    expected = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)
    assert d.parse_ack_reply(v1) == ("KV_b", 55, expected)
    assert d.parse_ack_reply(v2) == ("KV_b", 56, expected)
    for bad in ("", "_INBOX.x", "$JS.ACK.a.b.c", "$JS.API.a.b.c.d.e.f.g"):
        with pytest.raises(ValueError):
            d.parse_ack_reply(bad)


def _pack(obj: Any) -> bytes:
    """msgpack as any writer may send it: not through the codec, whose limits a hostile writer skips."""
    return msgpack.packb(obj, use_bin_type=True, default=lambda o: o.isoformat() if isinstance(o, datetime) else o)


def _entry_msg(envelope: Any, *, raw: bytes | None = None, headers: dict[str, str] | None = None) -> d.RawMessage:
    data = raw if raw is not None else _pack(envelope)
    return d.RawMessage("KV_blackboard", 7, _SUBJECTS.entry("b", "s", "k"), headers or {}, data, _NOW)


def _decode_both(msg: d.RawMessage, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    def run() -> Any:
        try:
            return d.decode_entry(msg, _SUBJECTS, max_bytes=10**6, index_chars=10**5)
        except InvalidPayloadError as exc:
            return ("dead", exc.reason)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(d, "_unpack_strict", lambda _msg: None)  # force the general (pydantic) path
        general = run()
    return fast, general


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


_FIELDS = ("op", "value", "value_raw", "content_type", "tags", "metadata", "author", "created_at", "search_text")
_VALUES: list[Any] = [1, "text", None, {"a": [1, 2.5, {"b": "c"}]}, [True, False], {"k": "nul\x00"}, b"bytes",
                      {1: "int key"}, float("nan"), "looks like \\u0000", [[[[1]]]], {"t": "é中"},
                      2**64 - 1, -(2**63), {"x": float("inf")}, "NaN", {"n": [1.5e300, -0.0]},
                      {b"bytes key": 1}, _deep(250), _deep(150)]


@pytest.mark.parametrize("value", _VALUES, ids=range(len(_VALUES)))
@pytest.mark.parametrize("tags", [[], ["a", "b"], ["nul\x00"]])
@pytest.mark.parametrize("metadata", [{}, {"n": 1}, {"x": b"y"}, {"z": "w\x00"}])
def test_fast_entry_decoder_agrees_with_the_general_one(value: Any, tags: list[str], metadata: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"v": 1, "value": value, "tags": tags, "metadata": metadata, "author": "me", "created_at": _NOW}
    fast, general = _decode_both(_entry_msg(env), monkeypatch)
    if isinstance(general, tuple):
        assert fast == general
        return
    assert {f: getattr(fast, f) for f in _FIELDS} == {f: getattr(general, f) for f in _FIELDS}
    if fast.value_json is not None:  # what the writer stores is the same JSON value
        assert json.loads(fast.value_json) == general.value


@pytest.mark.parametrize("envelope", [
    {"v": 2, "value": 1, "author": "a", "created_at": _NOW},
    {"value": 1, "author": "a", "created_at": "2026-01-01T00:00:00"},  # naive timestamp
    {"value": 1, "author": 5, "created_at": _NOW},
    {"value": 1, "author": "a", "created_at": _NOW, "tags": "notalist"},
    {"author": "a", "created_at": _NOW},
    {"value": 1, "author": "a", "created_at": _NOW, "content_type": "text/plain", "extra": "ignored"},
    {"value": 1, "author": "a", "created_at": "2026-01-01T00:00:00Z"},
])
def test_fast_entry_decoder_defers_odd_envelopes_to_the_general_one(
        envelope: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fast, general = _decode_both(_entry_msg(envelope), monkeypatch)
    if isinstance(general, tuple):
        assert fast == general
    else:
        assert {f: getattr(fast, f) for f in _FIELDS} == {f: getattr(general, f) for f in _FIELDS}


def test_json_encoded_entries_take_the_general_path() -> None:
    data = json.dumps({"v": 1, "value": {"a": 1}, "author": "a", "created_at": _NOW.isoformat()}).encode()
    row = d.decode_entry(_entry_msg(None, raw=data), _SUBJECTS, max_bytes=10**6, index_chars=10**5)
    assert row.value == {"a": 1} and row.value_json is None


@pytest.mark.parametrize("record", [
    {"id": "m1", "text": "hello", "kind": "semantic", "importance": 1, "tags": ["x"], "metadata": {"k": "v"}},
    {"id": "m1", "text": "hello", "importance": True},
    {"id": "m1", "text": "", "kind": "episodic"},
    {"id": "m1", "text": "hi", "kind": "nonsense"},
    {"id": "x" * 129, "text": "hi"},
    {"id": "m1", "text": "hi", "source": "file.md", "read_only": True},
    {"id": "m1", "text": "hi", "board": "other"},
])
def test_fast_memory_decoder_agrees_with_the_general_one(record: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rec = {"v": 1, "board": "b", "agent": "a", "created_at": _NOW, **record}
    msg = d.RawMessage("BB_MEMORY", 3, Subjects.memory("b", "a"), {}, codec.encode(rec), _NOW)

    def run() -> Any:
        try:
            return d.decode_memory(msg, max_bytes=10**6, index_chars=10**5)
        except InvalidPayloadError as exc:
            return ("dead", exc.reason)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(d, "_unpack_strict", lambda _msg: None)
        general = run()
    if isinstance(general, tuple):
        assert fast == general
    else:
        fields = ("id", "board", "agent", "kind", "text", "tags", "metadata", "importance", "source",
                  "read_only", "created_at", "search_text")
        assert {f: getattr(fast, f) for f in fields} == {f: getattr(general, f) for f in fields}


@pytest.mark.asyncio
async def test_binary_copy_round_trips_every_type(pg_settings: Settings) -> None:
    stamp = datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5)))
    rows = [
        ("plain", 1, {"a": [1, "é"]}, b"\x00\xff", ["x", "y z", ""], stamp, 0.25, True),
        (None, -(2**63), None, None, [], None, None, None),
        ("中文 \t\n\\", 2**63 - 1, "just a string", b"", ["é中"], datetime(2000, 1, 1, tzinfo=UTC), 1.0, False),
    ]
    data = pgcopy.stream(pgcopy.row((
        pgcopy.text(t), pgcopy.bigint(n), pgcopy.jsonb(None if j is None else json.dumps(j)), pgcopy.bytea(b),
        pgcopy.text_array(a), pgcopy.timestamptz(ts), pgcopy.float4(f), pgcopy.boolean(flag),
    )) for t, n, j, b, a, ts, f, flag in rows)
    async with await psycopg.AsyncConnection.connect(pg_settings.postgres.dsn.get_secret_value()) as conn:
        await conn.execute("CREATE TEMP TABLE t (t text, n bigint, j jsonb, b bytea, a text[], ts timestamptz, "
                           "f real, flag boolean)")
        async with conn.cursor() as cur:
            async with cur.copy("COPY t FROM STDIN (FORMAT BINARY)") as copy:
                await copy.write(data)
            await cur.execute("SELECT * FROM t")
            back = await cur.fetchall()
    assert [(r[0], r[1], r[2], None if r[3] is None else bytes(r[3]), r[4], r[5], r[6], r[7]) for r in back] == rows
    assert pgcopy.timestamptz_ns(1_700_000_000_123_456_789) == pgcopy.timestamptz(
        datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC))


@pytest.mark.asyncio
async def test_array_literals_round_trip_through_postgres(pg_settings: Settings) -> None:
    texts = ["", "plain", 'quote " inside', "back\\slash", "\\\"", "{braces},commas", "NULL", "null", " spaced ",
             "new\nline\ttab", "é中", "'single'"]
    ints = [0, -1, 2**63 - 1, -(2**63), 42]
    async with await psycopg.AsyncConnection.connect(pg_settings.postgres.dsn.get_secret_value()) as conn:
        cur = await conn.execute("SELECT %s::text[], %s::bigint[], %s::text[], %s::bigint[]",
                                 (pgcopy.text_array_literal(texts), pgcopy.bigint_array_literal(ints),
                                  pgcopy.text_array_literal([]), pgcopy.bigint_array_literal([])))
        row = await cur.fetchone()
    assert row == (texts, ints, [], [])


def test_server_expiry_marker_is_a_purge() -> None:
    headers = {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "1s", "Nats-Rollup": "sub"}
    row = d.decode_entry(_entry_msg(None, raw=b"", headers=headers), _SUBJECTS, max_bytes=10**6, index_chars=10**5)
    assert (row.op, row.value, row.search_text) == ("PURGE", None, "")
    assert (row.board, row.section, row.key) == ("b", "s", "k")


@pytest.mark.parametrize(("value", "seconds"), [
    ("30s", 30.0), ("30", 30.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("500ms", 0.5), ("2m0.5s", 120.5),
    ("never", None), ("", None), ("abc", None), ("1x", None), ("-5s", None), ("0s", None), ("1h-2m", None),
])
def test_parse_ttl_reads_seconds_and_go_durations(value: str, seconds: float | None) -> None:
    assert d.parse_ttl(value) == seconds


def test_an_entry_written_with_a_ttl_records_when_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"v": 1, "value": {"a": 1}, "content_type": "application/json", "tags": [], "metadata": {},
           "author": "me", "created_at": _NOW}
    for headers, expires in (({"Nats-TTL": "90s"}, _NOW + timedelta(seconds=90)), ({"Nats-TTL": "never"}, None),
                             ({}, None)):
        fast, general = _decode_both(_entry_msg(env, headers=headers), monkeypatch)
        assert fast.expires_at == general.expires_at == expires, headers
