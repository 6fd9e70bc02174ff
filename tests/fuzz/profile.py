"""The fuzz suite's hypothesis profiles.

* ``fuzz-ci`` (the default): derandomized (the same examples on every run, so CI
  is reproducible), a few examples per test (each example is a batch of dozens of
  messages through one running worker), no shrinking (a shrink step re-runs the
  batch through the worker; the failure report lists every message not accounted
  for instead), no deadline.
* ``fuzz-long``: random seeds, many more examples, with shrinking, for a developer
  hunting bugs: ``BB_FUZZ_PROFILE=fuzz-long python -m pytest tests/fuzz``
  (``BB_FUZZ_EXAMPLES=<n>`` sets the example count of either profile).

The profiles are applied per test with :func:`fuzz_settings`, not loaded
globally, so the rest of the suite keeps its own hypothesis settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["PROFILE", "fuzz_settings"]

_SLOW_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
                  HealthCheck.large_base_example, HealthCheck.filter_too_much]

settings.register_profile("fuzz-ci", max_examples=3, derandomize=True, database=None, deadline=None,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=_SLOW_FIXTURES,
                          print_blob=True)
settings.register_profile("fuzz-long", max_examples=40, derandomize=False, deadline=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                          suppress_health_check=_SLOW_FIXTURES, print_blob=True)

#: The profile in use (``BB_FUZZ_PROFILE``, default ``fuzz-ci``).
PROFILE = os.environ.get("BB_FUZZ_PROFILE", "fuzz-ci")


def fuzz_settings(examples: int | None = None) -> settings:
    """The settings of one fuzz test: the profile's, with ``examples`` examples in CI
    (scaled up by the long profile; ``BB_FUZZ_EXAMPLES`` overrides both)."""
    base = settings.get_profile(PROFILE)
    n = base.max_examples if examples is None else examples
    if PROFILE != "fuzz-ci":
        n = max(n * 10, base.max_examples)
    if os.environ.get("BB_FUZZ_EXAMPLES"):
        n = int(os.environ["BB_FUZZ_EXAMPLES"])
    return settings(base, max_examples=n)
