"""The importance score (blackboard/worker/importance.py) and its SQL twin
(blackboard/db/prune_sql.importance_sql), which pruning ranks by: the same numbers."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from blackboard.db import migrate
from blackboard.db.prune_sql import importance_sql
from blackboard.settings import MemorySettings, Settings
from blackboard.worker.importance import (
    ImportanceWeights,
    frequency,
    importance_score,
    last_used,
    recency,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
DAY = 86400.0


def _weights(**fields: float) -> ImportanceWeights:
    return ImportanceWeights.from_settings(MemorySettings.model_validate(fields))


def test_terms() -> None:
    assert recency(0, DAY) == 1.0
    assert recency(DAY, DAY) == pytest.approx(0.5)
    assert recency(3 * DAY, DAY) == pytest.approx(0.125)
    assert recency(-DAY, DAY) == 1.0  # a writer's clock ahead: now
    assert recency(1e12, 1.0) == 0.5 ** 1000  # capped, no underflow
    assert frequency(0, 5) == 0.0
    assert frequency(5, 5) == pytest.approx(1 - 1 / 2.718281828459045)
    assert frequency(10**9, 5) == pytest.approx(1.0)
    t = NOW - timedelta(days=3)
    assert last_used(t) == t
    assert last_used(t, updated_at=t + timedelta(1), last_seen=None, last_accessed=t + timedelta(2)) == \
        t + timedelta(2)


def test_weights_are_normalised_and_documented_defaults_hold() -> None:
    w = _weights()
    assert (w.recency, w.frequency, w.confidence, w.importance) == pytest.approx((0.3, 0.2, 0.2, 0.3))
    w = _weights(weight_recency=2, weight_frequency=0, weight_confidence=0, weight_importance=2)
    assert (w.recency, w.frequency, w.confidence, w.importance) == (0.5, 0.0, 0.0, 0.5)
    zero = _weights(weight_recency=0, weight_frequency=0, weight_confidence=0, weight_importance=0)
    assert importance_score(zero, importance=1, confidence=1, hits=100, used_at=NOW, now=NOW) == 0.0


def test_score_moves_with_each_term() -> None:
    w = _weights()
    base = dict(importance=0.5, confidence=None, hits=0, used_at=NOW - timedelta(days=7), now=NOW)
    score = importance_score(w, **base)  # type: ignore[arg-type]
    # the defaults: 0.3 * 0.5 (a half-life old) + 0.2 * 0 + 0.2 * 1 (no confidence) + 0.3 * 0.5
    assert score == pytest.approx(0.15 + 0.2 + 0.15)
    assert importance_score(w, **{**base, "hits": 3}) > score  # type: ignore[arg-type]
    assert importance_score(w, **{**base, "used_at": NOW}) > score  # type: ignore[arg-type]
    assert importance_score(w, **{**base, "confidence": 0.2}) < score  # type: ignore[arg-type]
    assert importance_score(w, **{**base, "importance": 0.9}) > score  # type: ignore[arg-type]
    top = importance_score(w, importance=1, confidence=1, hits=10**6, used_at=NOW, now=NOW)
    assert top == pytest.approx(1.0)


def _cases(n: int) -> list[tuple[datetime, datetime, datetime | None, datetime | None, int, float | None, float]]:
    rng = random.Random(22)
    out = []
    for _ in range(n):
        created = NOW - timedelta(seconds=rng.choice([0, 1, 3600, DAY, 30 * DAY, 400 * DAY, 10**9 / 10, -600]))
        updated = created + timedelta(seconds=rng.choice([0, 0, 60, 5 * DAY]))
        seen = rng.choice([None, updated, created + timedelta(seconds=rng.uniform(0, 9 * DAY))])
        accessed = rng.choice([None, None, NOW - timedelta(seconds=rng.uniform(-100, 90 * DAY))])
        hits = rng.choice([0, 1, 2, 7, 40, 10**6])
        confidence = rng.choice([None, 0.0, 0.25, 0.9, 1.0, rng.random()])
        out.append((created, updated, seen, accessed, hits, confidence, rng.choice([0.0, 0.5, 1.0, rng.random()])))
    return out


@pytest.mark.asyncio
async def test_the_sql_twin_gives_the_same_scores(pg_settings: Settings) -> None:
    await migrate(pg_settings)
    memory = MemorySettings(weight_recency=0.4, weight_frequency=0.3, weight_confidence=0.1, weight_importance=0.2,
                            recency_half_life=2 * DAY, frequency_scale=3.0)
    w = ImportanceWeights.from_settings(memory)
    cases = _cases(400)
    params = {"w_recency": w.recency, "w_frequency": w.frequency, "w_confidence": w.confidence,
              "w_importance": w.importance, "half_life": w.half_life, "frequency_scale": w.frequency_scale,
              "now": NOW}
    with psycopg.connect(pg_settings.postgres.dsn.get_secret_value()) as conn:
        # The columns the score reads, typed as in bb_memories (confidence, importance: real).
        conn.execute("CREATE TEMP TABLE m (i int, created_at timestamptz, updated_at timestamptz, "
                     "last_seen timestamptz, last_accessed timestamptz, hits int, confidence real, importance real)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO m VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            [(i, *c) for i, c in enumerate(cases)])
        query = f"SELECT i, {importance_sql('m')} FROM m"
        got: dict[int, float] = dict(conn.execute(query, params).fetchall())
        stored = conn.execute("SELECT confidence::float8, importance::float8 FROM m ORDER BY i").fetchall()
    assert len(got) == len(cases)
    for i, (created, updated, seen, accessed, hits, _c, _imp) in enumerate(cases):
        confidence, importance = stored[i]  # as PostgreSQL holds them (float4, widened as the SQL does)
        expected = importance_score(w, importance=importance, confidence=confidence, hits=hits,
                                    used_at=last_used(created, updated_at=updated, last_seen=seen,
                                                      last_accessed=accessed), now=NOW)
        assert got[i] == pytest.approx(expected, abs=1e-9), (i, cases[i])
