"""The pytest plugin in embedded mode, used the way a user's own suite uses it."""

from __future__ import annotations

import pytest

from tests.testing._run import run_user_suite

pytest_plugins = ["pytester"]


def test_user_suite_passes_in_embedded_mode(pytester: pytest.Pytester) -> None:
    result = run_user_suite(pytester, "embedded")
    result.assert_outcomes(passed=4)


def test_unknown_mode_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(blackboard_mode):\n    pass\n")
    result = pytester.runpytest_subprocess("--blackboard-mode", "docker", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--blackboard-mode*invalid choice*"])


def test_plugin_registers_the_containers_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="import pytest\n\n@pytest.mark.containers\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--strict-markers", "-m", "not containers", timeout=120)
    result.assert_outcomes(deselected=1)
