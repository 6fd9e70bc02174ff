"""Running tests/testing/user_suite.py as a user's own suite (pytester, in a subprocess: the
plugin is loaded through its ``pytest11`` entry point, as in any project that installs
blackboard)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

USER_SUITE = Path(__file__).with_name("user_suite.py")

#: The suite's pytest configuration: what a user's pyproject would say.
INI = """[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
addopts = -p no:cacheprovider
"""


def run_user_suite(pytester: pytest.Pytester, mode: str, *args: str) -> pytest.RunResult:
    """Run the user's suite with ``--blackboard-mode mode``; the environment's
    ``BLACKBOARD_CONTAINERS__*`` (the images) pass through."""
    pytester.makeini(INI)
    pytester.makepyfile(test_user_suite=USER_SUITE.read_text())
    os.environ["EXPECTED_BLACKBOARD_MODE"] = mode
    try:
        return pytester.runpytest_subprocess("--blackboard-mode", mode, "-v", *args, timeout=600)
    finally:
        del os.environ["EXPECTED_BLACKBOARD_MODE"]
