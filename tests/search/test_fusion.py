"""Pure parts of search: rank fusion, the SDK's error-reply mapping, the vector index's DDL."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents_sdk.search import raise_for_error
from blackboard.db.spaces import Space, ann_order, hnsw_index
from blackboard.protocol import codec
from blackboard.protocol.errors import ConfigurationError, SearchError
from blackboard.protocol.schemas.search import ErrorReply
from blackboard.search.engine import rrf
from blackboard.settings import EmbeddingSettings


def test_rrf_fuses_and_normalises() -> None:
    fused = rrf({"semantic": [(1, 0.9), (2, 0.8)], "keyword": [(2, 3.0), (3, 1.0)]})
    assert [f.item for f in fused] == [2, 1, 3]
    assert fused[0].parts == {"semantic": 0.8, "keyword": 3.0}
    top = rrf({"semantic": [(7, 1.0)], "keyword": [(7, 1.0)]})
    assert top[0].score == pytest.approx(1.0)


def test_raise_for_error_maps_classes() -> None:
    body = codec.encode(ErrorReply(error="SearchError", message="boom").model_dump())
    with pytest.raises(SearchError, match="boom"):
        raise_for_error({"Bb-Error": "SearchError"}, body)
    raise_for_error({}, b"")


def test_spaces_index_up_to_4000_dimensions_and_settings_refuse_more() -> None:
    """The HNSW index is on halfvec (pgvector: at most 4,000 dimensions, where vector stops at 2,000)."""
    big = Space(1, "text-embedding-3-large", 3072)
    assert "halfvec(3072)" in hnsw_index(big, "memory").as_string()
    assert ann_order(3072, "v.embedding") == "(v.embedding::halfvec(3072) <=> %s::vector::halfvec(3072))"
    with pytest.raises(ConfigurationError, match="4000"):
        hnsw_index(Space(2, "huge", 4001), "memory")
    assert EmbeddingSettings(dimensions=4000).dimensions == 4000
    with pytest.raises(ValidationError):
        EmbeddingSettings(dimensions=4001)
