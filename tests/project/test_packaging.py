"""The Docker image's build context makes a complete package.

``docker/Dockerfile`` copies a few paths of the repository and runs
``pip install .``: if a file the package needs is left out of its COPY lines
(the migrations, which ``blackboard/migrations`` links to), the image builds
and then fails at run time. This builds a wheel from exactly those paths.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def dockerfile_copies(text: str) -> list[str]:
    """The repository paths the Dockerfile's ``COPY`` instructions take (no ``--from``)."""
    paths: list[str] = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            paths += [w for w in words[1:-1] if not w.startswith("--")]
    return paths


def test_dockerfile_copies_are_parsed() -> None:
    assert dockerfile_copies("FROM x\nCOPY a b ./\n# COPY c d\nCOPY --from=build /x /y\nCOPY e ./e\n") == \
        ["a", "b", "e"]


def test_the_image_build_context_makes_a_complete_wheel(tmp_path: Path) -> None:
    context = tmp_path / "app"
    context.mkdir()
    copies = dockerfile_copies((ROOT / "docker" / "Dockerfile").read_text())
    assert "pyproject.toml" in copies
    for rel in copies:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, context / rel, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, context / rel)
    out = tmp_path / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(context)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("blackboard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    migrations = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert migrations and {f"blackboard/migrations/{m}" for m in migrations} <= names
    assert {"blackboard/py.typed", "agents_sdk/py.typed", "blackboard/apps/cli.py", "agents_sdk/agent.py"} <= names
    # the local model's tokenizer ships with the package, with its licence and provenance
    assert {f"blackboard/embeddings/data/{n}" for n in ("tokenizer.json", "LICENSE", "NOTICE")} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "blackboard = blackboard.apps.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
