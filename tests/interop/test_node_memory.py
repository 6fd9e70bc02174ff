"""The canonical encoding of memory records, version 1 and 2, written in JavaScript from
docs/protocol.md §13 alone (tests/interop/signing.mjs ``canonicalMemory``), equals Python's:
the version-2 extensions (key, occurred_at, confidence, provenance) left out when null, so a
version-1 record has the bytes it always had."""

from __future__ import annotations

import json
from typing import Any

from blackboard.protocol.schemas import MemoryRecord, validate_wire
from tests.interop.test_node_interop import _ensure_node_modules, _node, _run_node

_BASE: dict[str, Any] = {"id": "m1", "board": "b", "agent": "a", "text": "hi", "created_at": "2025-01-02T05:04:05+02:00"}
RECORDS: list[dict[str, Any]] = [
    _BASE,  # every default left out
    {**_BASE, "v": 1, "kind": "semantic", "tags": ["x", "y"], "metadata": {"zz": 0.5, "b": 2.0, "aa": [1, "x"]},
     "importance": 1.0, "source": "notes.md", "read_only": True},
    {**_BASE, "v": 2, "key": "price:shop.example.com:sku-1"},
    {**_BASE, "v": 2, "occurred_at": "2024-12-31T23:59:59.1234567Z"},
    {**_BASE, "v": 2, "confidence": 1.0},
    {**_BASE, "v": 2, "confidence": 0.25, "key": "zoë/ключ", "text": "prix: 12 €"},
    {**_BASE, "v": 2, "key": None, "occurred_at": None, "confidence": 0.0},  # nulls written: left out
    {**_BASE, "v": 2},  # version 2 without any extension
    {**_BASE, "v": 2, "kind": "semantic", "key": "k", "occurred_at": "2025-01-01T00:00:00-05:30",
     "confidence": 0.9, "provenance": [{"stream": "BB_MEMORY", "seq": 41, "key": "U" * 56, "sig": "s" * 86},
                                       {"stream": "BB_MEMORY", "seq": 70000}]},
]


def test_node_encodes_memory_records_canonically_as_python_does() -> None:
    node = _node()
    _ensure_node_modules()
    result = _run_node(node, {"mode": "memory_canonical", "records": [json.dumps(r) for r in RECORDS]})
    for record, hex_text in zip(RECORDS, result["hex"], strict=True):
        expected = validate_wire(MemoryRecord, record, strict=True).canonical_bytes()
        assert hex_text == expected.hex(), record
    # a version-1 record is a map of its 12 fields, no extension
    assert bytes.fromhex(result["hex"][1])[0] == 0x8C
    # a map 16 header (0xde) once there are 16 fields: the 12, then 4 extensions
    assert bytes.fromhex(result["hex"][-1])[:3] == b"\xde\x00\x10"
