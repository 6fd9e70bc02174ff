"""Pure parts of search: rank fusion and the SDK's error-reply mapping."""

from __future__ import annotations

import pytest

from agents_sdk.search import raise_for_error
from blackboard import codec
from blackboard.errors import SearchError
from blackboard.schemas.search import ErrorReply
from blackboard.search import rrf


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
