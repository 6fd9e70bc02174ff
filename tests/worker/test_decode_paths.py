"""The worker's two decoding paths give the same rows on generated records.

Every message takes the fast path (strict msgpack, the record's fast decoder
in ``blackboard.protocol.records``, the worker's storage checks) or steps aside
to the general one (the schema, then the same checks with their reasons);
forcing the general path must not change a row or a dead-letter reason. The
records are generated valid, spoilt field by field, and holding what
PostgreSQL cannot store (NUL, bytes, NaN, deep nesting).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import EntryEnvelope, MemoryRecord
from blackboard.protocol.subjects import Subjects, validate_name
from blackboard.worker import decode as d
from tests._records_strategies import entry_payloads, exact, json_values, memory_payloads, mutated

_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_SUBJECTS = Subjects("blackboard")
_NOW = datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


#: Values a record may validly hold that PostgreSQL cannot store as they are.
_unstorable = st.sampled_from(["nul\x00", b"bytes", float("nan"), float("-inf"), {"k": "a\x00"}, {"k": b"v"},
                               _deep(250), "looks like \\u0000", 2**64 - 1]) | json_values


@st.composite
def _unstorable_memory(draw: st.DrawFn) -> dict[str, Any]:
    obj = dict(draw(memory_payloads()))
    field = draw(st.sampled_from(["text", "id", "source", "tags", "metadata"]))
    if field == "tags":
        obj["tags"] = ["ok", draw(st.sampled_from(["nul\x00", "fine"]))]
    elif field == "metadata":
        obj["metadata"] = {"k": draw(_unstorable)}
    else:
        obj[field] = draw(st.sampled_from(["a\x00b", "plain"]))
    return obj


@st.composite
def _unstorable_entry(draw: st.DrawFn) -> dict[str, Any]:
    obj = dict(draw(entry_payloads()))
    field = draw(st.sampled_from(["value", "metadata", "author", "content_type", "tags"]))
    if field == "value":
        obj["value"] = draw(_unstorable)
    elif field == "metadata":
        obj["metadata"] = {"k": draw(_unstorable)}
    elif field == "tags":
        obj["tags"] = [draw(st.sampled_from(["nul\x00", "fine"]))]
    else:
        obj[field] = draw(st.sampled_from(["a\x00b", "text/plain"]))
    return obj


def _both(decode: Any, msg: d.RawMessage) -> tuple[Any, Any]:
    def run() -> Any:
        try:
            return decode(msg)
        except InvalidPayloadError as exc:
            return ("dead", exc.reason)

    fast = run()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(d, "_unpack_strict", lambda _msg: None)  # force the general (pydantic) path
        general = run()
    return fast, general


# (metadata_order is not a row field: the row's metadata is in that order)
_MEMORY_FIELDS = (*MemoryRecord.model_fields.keys() - {"v", "metadata_order"}, "search_text", "embed_meta")
_ENTRY_FIELDS = ("op", "value", "value_raw", "content_type", "tags", "metadata", "author", "created_at",
                 "search_text")


def _memory_subject(obj: dict[str, Any]) -> str:
    board, agent = obj.get("board"), obj.get("agent")
    try:
        return Subjects.memory(validate_name(board), validate_name(agent))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return Subjects.memory("b", "a")


def _pack(obj: dict[str, Any]) -> bytes | None:
    """msgpack as any writer may send it (not through the codec, whose limits a hostile
    writer skips: the decoders meet those payloads too); None if msgpack cannot carry it."""
    try:
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError):
        return None


def _check_memory(obj: dict[str, Any]) -> None:
    data = _pack(obj)
    if data is None:
        return
    msg = d.RawMessage("BB_MEMORY", 3, _memory_subject(obj), {}, data, _NOW)
    fast, general = _both(lambda m: d.decode_memory(m, max_bytes=10**6, index_chars=10**5), msg)
    if isinstance(general, tuple) or isinstance(general, d.ForgetRow):
        assert fast == general
        return
    assert exact({f: getattr(fast, f) for f in _MEMORY_FIELDS}) == exact({f: getattr(general, f) for f in _MEMORY_FIELDS})
    assert list(fast.metadata) == list(general.metadata)  # the writer's key order, both ways
    if fast.metadata_json is not None:  # what the writer stores is the same JSON value
        assert json.loads(fast.metadata_json) == json.loads(json.dumps(general.metadata))


def _check_entry(obj: dict[str, Any]) -> None:
    data = _pack(obj)
    if data is None:
        return
    msg = d.RawMessage("KV_blackboard", 7, _SUBJECTS.entry("b", "s", "k"), {}, data, _NOW)
    fast, general = _both(lambda m: d.decode_entry(m, _SUBJECTS, max_bytes=10**6, index_chars=10**5), msg)
    if isinstance(general, tuple):
        assert fast == general
        return
    assert exact({f: getattr(fast, f) for f in _ENTRY_FIELDS}) == exact({f: getattr(general, f) for f in _ENTRY_FIELDS})
    if fast.value_json is not None:
        assert exact(json.loads(fast.value_json)) == exact(json.loads(json.dumps(general.value)))


@_SETTINGS
@given(memory_payloads() | _unstorable_memory())
def test_both_paths_give_the_same_memory_row(obj: dict[str, Any]) -> None:
    _check_memory(obj)


@pytest.mark.parametrize("field", [*MemoryRecord.model_fields, "op"])
@settings(_SETTINGS, max_examples=20)
@given(data=st.data())
def test_both_paths_give_the_same_dead_letter_of_a_spoilt_memory(field: str, data: st.DataObject) -> None:
    _check_memory(data.draw(mutated(memory_payloads(), field, list(MemoryRecord.model_fields))))


@_SETTINGS
@given(entry_payloads() | _unstorable_entry())
def test_both_paths_give_the_same_entry_row(obj: dict[str, Any]) -> None:
    _check_entry(obj)


@pytest.mark.parametrize("field", list(EntryEnvelope.model_fields))
@settings(_SETTINGS, max_examples=20)
@given(data=st.data())
def test_both_paths_give_the_same_dead_letter_of_a_spoilt_entry(field: str, data: st.DataObject) -> None:
    _check_entry(data.draw(mutated(entry_payloads(), field, list(EntryEnvelope.model_fields))))


def test_the_fast_path_is_taken_for_plain_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain msgpack memory and entry never reach the schema's validation."""
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr("blackboard.protocol.records.validate_wire", refuse)
    mem = {"v": 1, "id": "m1", "board": "b", "agent": "a", "text": "hello", "tags": ["x"],
           "metadata": {"n": 1.5}, "created_at": _NOW.isoformat()}
    row = d.decode_memory(d.RawMessage("BB_MEMORY", 3, Subjects.memory("b", "a"), {}, codec.encode(mem), _NOW),
                          max_bytes=10**6, index_chars=10**5)
    assert isinstance(row, d.MemoryRow) and row.metadata_json == b'{"n": 1.5}'
    env = {"v": 1, "value": {"a": [1, 2]}, "author": "me", "created_at": _NOW.isoformat()}
    entry = d.decode_entry(d.RawMessage("KV_blackboard", 7, _SUBJECTS.entry("b", "s", "k"), {}, codec.encode(env),
                                        _NOW), _SUBJECTS, max_bytes=10**6, index_chars=10**5)
    assert entry.value_json == b'{"a":[1,2]}'
