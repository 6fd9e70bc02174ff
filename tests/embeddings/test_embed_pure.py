"""The embedding stage's pure rule for what a model's answer may store."""

from __future__ import annotations

import numpy as np
import pytest

from blackboard.protocol.errors import EmbeddingError
from blackboard.worker.embedder import storable_vectors


def test_storable_vectors_drop_non_finite_rows_and_scale_the_rest_to_unit_length() -> None:
    answer = np.array([[3.0, 4.0], [np.nan, 1.0], [1e30, 0.0], [0.0, 0.0], [np.inf, 0.0]], dtype=np.float32)
    unit, ok = storable_vectors(answer, 5, 2)
    assert ok.tolist() == [True, False, True, True, False]
    assert unit.dtype == np.float32
    np.testing.assert_allclose(unit, [[0.6, 0.8], [1.0, 0.0], [0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (3,)])
def test_storable_vectors_refuse_an_answer_of_the_wrong_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(EmbeddingError, match="shape"):
        storable_vectors(np.ones(shape, dtype=np.float32), 3, 3)
