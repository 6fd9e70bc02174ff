"""The memory config file (agents_sdk.memory.stores.config): stores and attachments from TOML
or YAML; every mistake a ConfigurationError at its file and line."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agents_sdk.memory.layers import LayerHit
from agents_sdk.memory.stores import (
    ConfigFileError,
    MemoryConfig,
    StoreOptions,
    StoreSpec,
    load_config,
    register_store_type,
    store_types,
)
from blackboard.protocol.errors import ConfigurationError

GOOD_TOML = """\
# stores of the team
[stores.notes]
type = "conversation"
board = "team"

[stores.docs]
type = "file"
paths = ["docs", "extra/readme.md"]
suffixes = [".md"]

[stores.events]
type = "log"
max_count = 50
max_age = 3600

[agents.scraper.attach.notes]
read = true
write = true
top_k = 3
similarity_threshold = 0.2
stages = ["pre", "gen"]

[agents.scraper.attach.docs]
stages = ["plan"]

[agents.critic.attach.events]
write = true
"""

GOOD_YAML = """\
stores:
  notes:
    type: conversation
    board: team
  docs:
    type: file
    paths: [docs]
agents:
  scraper:
    attach:
      notes: {write: true, top_k: 3, stages: [pre, gen]}
      docs:
        stages: [plan]
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _error(tmp_path: Path, name: str, text: str) -> ConfigFileError:
    path = _write(tmp_path, name, text)
    with pytest.raises(ConfigFileError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:{info.value.line}: ")
    assert info.value.path == str(path)
    return info.value


def test_a_toml_file_declares_stores_and_attachments(tmp_path: Path) -> None:
    path = _write(tmp_path, "memory.toml", GOOD_TOML)
    config = load_config(path)
    assert isinstance(config, MemoryConfig) and config.path == path
    assert list(config.stores) == ["notes", "docs", "events"]
    notes, docs, events = config.stores.values()
    assert (notes.type, dict(notes.options), notes.origin) == ("conversation", {"board": "team"}, f"{path}:2")
    assert docs.type == "file" and docs.options["paths"] == ["docs", "extra/readme.md"]
    assert docs.base_dir == tmp_path.resolve()  # relative paths start from the file's folder
    assert (events.origin, events.options["max_count"]) == (f"{path}:11", 50)
    scraper = config.attachments_for("scraper")
    assert [a.store for a in scraper] == ["notes", "docs"]
    assert (scraper[0].read, scraper[0].write, scraper[0].top_k, scraper[0].similarity_threshold,
            scraper[0].stages, scraper[0].origin) == (True, True, 3, 0.2, ("pre", "gen"), f"{path}:16")
    assert (scraper[1].write, scraper[1].top_k, scraper[1].stages) == (False, 5, ("plan",))
    assert [(a.store, a.write, a.stages) for a in config.attachments_for("critic")] == [
        ("events", True, ("pre", "plan", "gen", "critique"))]
    assert config.attachments_for("nobody") == []


def test_a_yaml_file_is_the_same_config(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "memory.yaml", GOOD_YAML))
    assert list(config.stores) == ["notes", "docs"]
    assert config.stores["notes"].origin.endswith("memory.yaml:2")
    scraper = config.attachments_for("scraper")
    assert [(a.store, a.write, a.top_k, a.stages) for a in scraper] == [
        ("notes", True, 3, ("pre", "gen")), ("docs", False, 5, ("plan",))]
    assert scraper[1].origin.endswith("memory.yaml:12")


def test_a_duplicate_store_name_in_toml_names_both_lines(tmp_path: Path) -> None:
    err = _error(tmp_path, "dup.toml", """\
        [stores.notes]
        type = "conversation"

        [stores.other]
        type = "log"

        [stores.notes]
        type = "log"
        """)
    assert err.line == 7
    assert "duplicate store name 'notes' (first at line 1)" in str(err)


def test_a_duplicate_store_name_in_yaml_names_both_lines(tmp_path: Path) -> None:
    # PyYAML alone would keep the last one silently.
    err = _error(tmp_path, "dup.yml", """\
        stores:
          notes:
            type: conversation
          notes:
            type: log
        """)
    assert err.line == 4
    assert "duplicate store name 'notes' (first at line 2)" in str(err)


@pytest.mark.parametrize("name", ["bad.toml", "bad.yaml"])
def test_an_unknown_store_type_points_at_its_line(tmp_path: Path, name: str) -> None:
    text = ('[stores.notes]\ntype = "conversation"\n\n[stores.mystery]\nboard = "x"\ntype = "vector-db"\n'
            if name.endswith(".toml") else
            "stores:\n  notes:\n    type: conversation\n\n  mystery:\n    board: x\n    type: vector-db\n")
    err = _error(tmp_path, name, text)
    assert err.line == (6 if name.endswith(".toml") else 7)
    assert "unknown store type 'vector-db'" in str(err)
    known = str(err).rsplit("(known: ", 1)[1].rstrip(")").split(", ")
    assert {"conversation", "file", "log"} <= set(known)  # other tests may register types of their own


def test_bad_store_fields_point_at_their_lines(tmp_path: Path) -> None:
    unknown = _error(tmp_path, "a.toml", """\
        [stores.events]
        type = "log"
        max_count = 10
        colour = "red"
        """)
    assert unknown.line == 4 and "store 'events' (log): colour: unknown field" in str(unknown)
    invalid = _error(tmp_path, "b.toml", """\
        [stores.events]
        type = "log"

        max_count = 0
        """)
    assert invalid.line == 4 and "max_count" in str(invalid) and "greater than or equal to 1" in str(invalid)
    missing = _error(tmp_path, "c.toml", """\
        [stores.docs]
        type = "file"
        suffixes = [".md"]
        """)
    assert missing.line == 1 and "paths" in str(missing)
    no_type = _error(tmp_path, "d.toml", """\
        [stores.x]
        board = "b"
        """)
    assert no_type.line == 1 and "store 'x' has no type" in str(no_type)
    bad_name = _error(tmp_path, "e.toml", """\
        [stores."with space"]
        type = "log"
        """)
    assert bad_name.line == 1 and "invalid store name" in str(bad_name)
    yaml_field = _error(tmp_path, "f.yaml", """\
        stores:
          docs:
            type: file
            paths: [docs]
            chunk_size: 100
            overlap: 100
        """)
    assert yaml_field.line == 2 and "overlap must be smaller than chunk_size" in str(yaml_field)


def test_bad_attachments_point_at_their_lines(tmp_path: Path) -> None:
    head = '[stores.notes]\ntype = "conversation"\n\n[stores.docs]\ntype = "file"\npaths = ["d"]\n\n'
    undeclared = _error(tmp_path, "a.toml", head + "[agents.a1.attach.nowhere]\ntop_k = 2\n")
    assert undeclared.line == 8 and "attaches 'nowhere', which no [stores.nowhere] declares" in str(undeclared)
    stage = _error(tmp_path, "b.toml", head + '[agents.a1.attach.notes]\ntop_k = 2\nstages = ["pre", "lunch"]\n')
    assert stage.line == 10 and "stages.1" in str(stage)
    field = _error(tmp_path, "c.toml", head + "[agents.a1.attach.notes]\nretries = 2\n")
    assert field.line == 9 and "retries: unknown field" in str(field)
    threshold = _error(tmp_path, "d.toml", head + "[agents.a1.attach.notes]\nsimilarity_threshold = 1.5\n")
    assert threshold.line == 9 and "similarity_threshold" in str(threshold)
    read_only = _error(tmp_path, "e.toml", head + "[agents.a1.attach.docs]\nread = true\nwrite = true\n")
    assert read_only.line == 10 and "store 'docs' (file) is read-only" in str(read_only)
    other = _error(tmp_path, "f.toml", head + "[agents.a1]\nrole = 'x'\n")
    assert other.line == 9 and "unknown field 'role'" in str(other)


def test_syntax_errors_and_unknown_sections_have_lines(tmp_path: Path) -> None:
    toml = _error(tmp_path, "a.toml", '[stores.notes]\ntype = "conversation"\nboard = \n')
    assert toml.line == 3
    yaml = _error(tmp_path, "b.yaml", "stores:\n  notes:\n    type: [conversation\n")
    assert yaml.line >= 3
    section = _error(tmp_path, "c.toml", '[stores.notes]\ntype = "conversation"\n\n[memory]\nx = 1\n')
    assert section.line == 4 and "unknown section 'memory'" in str(section)
    not_table = _error(tmp_path, "d.yaml", "stores:\n  notes: conversation\n")
    assert not_table.line == 2 and "must be a table" in str(not_table)


def test_the_file_must_exist_and_be_toml_or_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigurationError, match=r"\.toml, \.yaml or \.yml"):
        load_config(_write(tmp_path, "memory.json", "{}"))


class _Echo:
    """A store type of a test: echoes the query."""

    kind = "echo"
    writable = False

    def __init__(self, name: str, prefix: str) -> None:
        self.name, self.prefix = name, prefix

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        return [LayerHit(f"store:{self.name}", "e1", self.prefix + query, 1.0, "echo", self.name, {})]

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        raise NotImplementedError

    def size(self) -> int:
        return 0


class _EchoOptions(StoreOptions):
    prefix: str = ">"


def test_registered_store_types_are_config_types(tmp_path: Path) -> None:
    def factory(spec: StoreSpec, agent: Any) -> _Echo:
        return _Echo(spec.name, _EchoOptions.model_validate(dict(spec.options)).prefix)

    name = f"echo-{tmp_path.name[-8:]}"
    kind = register_store_type(name, factory, options=_EchoOptions, writable=False)
    assert store_types()[name] is kind
    with pytest.raises(ConfigurationError, match="already registered"):
        register_store_type(name, factory)
    config = load_config(_write(tmp_path, "m.toml", f'[stores.e]\ntype = "{name}"\nprefix = "+"\n'))
    assert config.stores["e"].type == name
    bad = _error(tmp_path, "n.toml", f'[stores.e]\ntype = "{name}"\nsuffix = "+"\n')
    assert bad.line == 3 and "suffix: unknown field" in str(bad)
    read_only = _error(tmp_path, "o.toml", f'[stores.e]\ntype = "{name}"\n\n[agents.x.attach.e]\nwrite = true\n')
    assert read_only.line == 5
