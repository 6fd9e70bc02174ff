"""blackboard.testing's public names are pinned, and the plugin's fixtures keep their prefix."""

from __future__ import annotations

import blackboard.testing
import blackboard.testing.plugin

TESTING = {
    "LABEL", "TEST_POLICY", "ContainerStack", "EmbeddedStack", "Stack", "StackIdentities", "StackMode",
    "make_stack", "run_sync", "settings_env", "sweep_containers",
}


def test_testing_exports() -> None:
    assert set(blackboard.testing.__all__) == TESTING
    for name in blackboard.testing.__all__:
        assert hasattr(blackboard.testing, name), name


def test_the_plugin_defines_only_prefixed_fixtures() -> None:
    # A user's (and this repository's) own fixtures are never shadowed.
    fixtures = [name for name in vars(blackboard.testing.plugin)
                if hasattr(getattr(blackboard.testing.plugin, name), "_fixture_function_marker")
                or type(getattr(blackboard.testing.plugin, name)).__name__ == "FixtureFunctionDefinition"]
    assert fixtures, "no fixture found: pytest changed how it marks them"
    assert all(name.startswith("blackboard_") for name in fixtures), fixtures
    assert set(fixtures) == set(blackboard.testing.plugin.__all__)
