"""docs/configuration.md documents every setting, generated from the code."""

from __future__ import annotations

from pathlib import Path

from blackboard.settings import Settings
from blackboard.settings_doc import BEGIN, END, render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_generated_reference_is_current() -> None:
    text = DOC.read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert block.strip() == render_reference().strip(), (
        "docs/configuration.md is stale: run `python -m blackboard.settings_doc --write`")


def test_every_setting_has_a_variable_and_a_description() -> None:
    reference = render_reference()
    settings = Settings()
    for group in Settings.model_fields:
        for name in type(getattr(settings, group)).model_fields:
            var = f"`BLACKBOARD_{group.upper()}__{name.upper()}`"
            row = next((line for line in reference.splitlines() if line.startswith(f"| {var}")), None)
            assert row is not None, var
            assert row.rstrip().rstrip("|").split("|")[-1].strip(), f"{var} has no description"
