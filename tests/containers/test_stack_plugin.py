"""The pytest plugin in containers mode, used the way a user's own suite uses it: the suite of
tests/testing/user_suite.py run by pytester with ``--blackboard-mode containers`` (the images
from the environment's ``BLACKBOARD_CONTAINERS__*``, as a user's CI would set them)."""

from __future__ import annotations

import pytest

from tests.testing._run import run_user_suite

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.containers


@pytest.mark.timeout(900)
def test_user_suite_passes_in_containers_mode(pytester: pytest.Pytester) -> None:
    result = run_user_suite(pytester, "containers")
    result.assert_outcomes(passed=4)


@pytest.mark.timeout(300)
def test_no_engine_fails_with_the_reason(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite whose Docker engine cannot be reached errors, naming the reason: never a skip."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    pytester.makepyfile(test_x="def test_x(blackboard_stack):\n    pass\n")
    result = pytester.runpytest_subprocess("--blackboard-mode", "containers", timeout=240)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*DevStackError: no Docker engine answers*"])
