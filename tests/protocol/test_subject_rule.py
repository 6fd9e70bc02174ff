"""Every subject is built in one place: ``blackboard/protocol/subjects.py``.

The rule, checked over the syntax tree of every ``.py`` file under
``blackboard/`` and ``agents_sdk/``: outside the protocol module no code may
hold a string that builds or takes apart a ``$JS.``, ``$KV.``, ``$SRV.`` or
``bb.`` subject. Flagged are

- a string (or bytes) constant starting with one of those prefixes, e.g.
  ``"bb.mem.>"`` or the ``"bb."`` of ``"bb." + board``;
- an f-string whose leading constant part starts with one of them, e.g.
  ``f"$JS.API.DIRECT.GET.{stream}"``;
- a constant that is exactly a first token of those subjects (``"$JS"``,
  ``"$KV"``, ``"$SRV"``, ``"bb"``): what a hand-written parser compares
  ``subject.split(".")`` tokens with.

Docstrings (the first expression statement of a module, class or function)
are not code and are skipped; a string that merely mentions a subject in its
middle (a log message) is not a subject being built.

The checker is shown to catch the violations planted in
``tests/protocol/fixtures/planted_subjects.py`` (parsed, never imported; its
name keeps pytest from collecting it): every line marked ``# planted`` must be
reported, and no other line.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("blackboard", "agents_sdk")
#: The one module allowed to build subjects.
HOME = REPO / "blackboard" / "protocol" / "subjects.py"
PLANTED = Path(__file__).resolve().parent / "fixtures" / "planted_subjects.py"

PREFIXES = ("$JS.", "$KV.", "$SRV.", "bb.")
FIRST_TOKENS = frozenset(p.rstrip(".") for p in PREFIXES)


def _docstrings(tree: ast.Module) -> set[int]:
    """``id()`` of the docstring constants of a module and of its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, bytes):
            return node.value.decode("latin-1")
    return None


def _builds_subject(text: str) -> bool:
    return text.startswith(PREFIXES) or text in FIRST_TOKENS


def subject_literals(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, text)`` of every string in ``source`` that builds or parses a protocol subject."""
    tree = ast.parse(source, filename)
    skip = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            # Its parts are checked here, as one string: only the leading constant part counts.
            skip.update(id(part) for part in node.values)
            lead = _text(node.values[0]) if node.values else None
            if lead is not None and lead.startswith(PREFIXES):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and id(node) not in skip:
            text = _text(node)
            if text is not None and _builds_subject(text):
                found.append((node.lineno, repr(node.value)))
    return sorted(found)


def _python_files() -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    assert files, "no source files found"
    return files


def test_no_subject_is_built_outside_the_protocol_module() -> None:
    offences = []
    for path in _python_files():
        if path == HOME:
            continue
        for line, text in subject_literals(path.read_text(), str(path)):
            offences.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert not offences, ("subjects are built only in blackboard/protocol/subjects.py; found:\n"
                          + "\n".join(offences))


def test_the_checker_walks_the_tree_and_skips_only_the_protocol_module() -> None:
    files = _python_files()
    assert HOME in files
    assert REPO / "blackboard" / "worker" / "decode.py" in files
    assert REPO / "agents_sdk" / "messaging" / "inbox.py" in files
    # The protocol module itself is full of subjects: skipping it is what lets the tree pass.
    assert len(subject_literals(HOME.read_text(), str(HOME))) >= 10


def test_the_checker_catches_every_planted_violation_and_nothing_else() -> None:
    source = PLANTED.read_text()
    planted = {i for i, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith("# planted")}
    assert len(planted) >= 6  # the fixture is what it claims to be
    reported = {line for line, _ in subject_literals(source, str(PLANTED))}
    assert reported == planted, (f"missed: {sorted(planted - reported)}, "
                                 f"reported but not planted: {sorted(reported - planted)}")


def test_docstrings_are_not_code_but_the_same_text_elsewhere_is() -> None:
    doc = '"""bb.mem.<board>.<agent> carries memories."""\n'
    assert subject_literals(doc) == []
    assert subject_literals("def f() -> None:\n    " + doc) == []
    assert subject_literals("async def f() -> None:\n    " + doc) == []
    assert subject_literals("class C:\n    " + doc) == []
    # Not the first statement of its body: an ordinary string expression, flagged.
    assert [line for line, _ in subject_literals("x = 1\n" + doc)] == [2]
