"""The importance score of a long-term memory (pure; docs/memory-lifecycle.md, "Importance").

A memory's importance is a weighted mean of four terms, each in 0..1::

    score = (w_r * recency + w_f * frequency + w_c * confidence + w_i * importance)
            / (w_r + w_f + w_c + w_i)

* ``recency = 0.5 ** (age / memory.recency_half_life)``, ``age`` the seconds since the
  memory was last used: the latest of its last recall (``last_accessed``), its last write
  (``last_seen``: the newest of the duplicates merged into it; ``updated_at``: its newest
  version) and its ``created_at``. A time in the future counts as now (age 0).
* ``frequency = 1 - exp(-hits / memory.frequency_scale)``: how often recall returned it.
* ``confidence``: the writer's, ``1`` when not given.
* ``importance``: the writer's explicit importance (``remember(..., importance=)``, default 0.5).

The weights are ``memory.weight_recency``, ``weight_frequency``, ``weight_confidence`` and
``weight_importance``; all zero gives a score of 0. :func:`importance_score` is the
reference; :func:`blackboard.db.prune_sql.importance_sql` computes the same in SQL (a test
holds them equal), which pruning ranks by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from blackboard.settings import MemorySettings

__all__ = ["MAX_FREQUENCY_EXPONENT", "MAX_HALF_LIVES", "ImportanceWeights", "frequency", "importance_score",
           "last_used", "recency"]


@dataclass(frozen=True, slots=True)
class ImportanceWeights:
    """The importance score's weights, normalised to sum to 1 (all 0 when all are 0), and the
    scales of its recency and frequency terms."""

    recency: float
    frequency: float
    confidence: float
    importance: float
    #: Seconds after which the recency term halves.
    half_life: float
    #: Hits at which the frequency term reaches 1 - 1/e.
    frequency_scale: float

    @classmethod
    def from_settings(cls, memory: MemorySettings) -> ImportanceWeights:
        """The weights of ``memory.weight_*``, normalised, with its half-life and frequency scale."""
        raw = (memory.weight_recency, memory.weight_frequency, memory.weight_confidence, memory.weight_importance)
        total = sum(raw)
        r, f, c, i = (w / total for w in raw) if total > 0 else (0.0, 0.0, 0.0, 0.0)
        return cls(r, f, c, i, memory.recency_half_life, memory.frequency_scale)


#: The largest exponent either term takes: 0.5 ** 1000 and exp(-700) are 0 to every score's
#: precision, and PostgreSQL raises on an underflow where Python returns 0.
MAX_HALF_LIVES = 1000.0
MAX_FREQUENCY_EXPONENT = 700.0


def recency(age_seconds: float, half_life: float) -> float:
    """``0.5 ** (age / half_life)``; a negative age (a clock ahead) counts as 0."""
    return float(0.5 ** min(max(0.0, age_seconds) / half_life, MAX_HALF_LIVES))


def frequency(hits: int, scale: float) -> float:
    """``1 - exp(-hits / scale)``: 0 never recalled, towards 1 with use."""
    return 1.0 - math.exp(-min(max(0, hits) / scale, MAX_FREQUENCY_EXPONENT))


def last_used(created_at: datetime, *, updated_at: datetime | None = None, last_seen: datetime | None = None,
              last_accessed: datetime | None = None) -> datetime:
    """When a memory was last used: the latest of the given times (``None`` ones left out)."""
    return max(t for t in (created_at, updated_at, last_seen, last_accessed) if t is not None)


def importance_score(weights: ImportanceWeights, *, importance: float, confidence: float | None, hits: int,
                     used_at: datetime, now: datetime) -> float:
    """A memory's importance score, 0..1 (see the module docstring).

    Args:
        weights: :meth:`ImportanceWeights.from_settings`.
        importance: the writer's importance, 0..1.
        confidence: the writer's confidence, 0..1 (``None``: counts as 1).
        hits: how often recall returned it.
        used_at: :func:`last_used` of its times.
        now: the time the score is for.
    """
    age = (now - used_at).total_seconds()
    return (weights.recency * recency(age, weights.half_life)
            + weights.frequency * frequency(hits, weights.frequency_scale)
            + weights.confidence * (1.0 if confidence is None else confidence)
            + weights.importance * importance)
