"""The import rules of the layout (issue 17), checked over the syntax tree.

Every ``.py`` file under ``blackboard/`` and ``agents_sdk/`` is parsed (never
imported) and its imports, module-level and deferred alike, are checked
against four rules.

1. **Layers.** :data:`LAYERS` below is the one table of the layers, lowest
   first. Each row names the modules of a layer (by dotted prefix; the longest
   prefix wins) and the layers it may import; a layer may always import
   itself. In words:

   ==========  ===================================================  =========================================
   layer       modules                                              may import
   ==========  ===================================================  =========================================
   settings    ``blackboard.settings``, ``blackboard.settings_doc``  nothing of ours
   protocol    ``blackboard.protocol``                              nothing of ours
   consensus   ``blackboard.consensus`` (pure)                      protocol
   security    ``blackboard.security`` (identities, rights)         settings, protocol
   observab.   ``blackboard.observability`` (logs, metrics, traces) settings, protocol
   client      ``blackboard.client``                                ..., security, observability
   sdk         ``agents_sdk``                                       ..., observability, client
   db          ``blackboard.db``                                    settings, protocol
   embeddings  ``blackboard.embeddings``                            settings, protocol
   devstack    ``blackboard.devstack``                              settings, protocol, security
   search      ``blackboard.search``                                ..., client, db, embeddings
   worker      ``blackboard.worker``                                ..., client, db, embeddings, search
   root        ``blackboard`` (the package's ``__init__``, a facade)  settings, protocol, client
   apps        ``blackboard.apps``, ``blackboard.__main__``         everything
   testing     ``blackboard.testing`` (test stacks, pytest plugin)  everything but the apps
   ==========  ===================================================  =========================================

   db, embeddings, devstack, search and worker are the server side: none of
   them imports the SDK or the apps, and the SDK imports none of them. Only
   the apps (programs that act as agents) and testing (stacks that start the
   servers and hand out agents) import both. Imports under
   ``if TYPE_CHECKING:`` obey the layers too.

2. **No cycles** between modules, counting module-level imports and deferred
   imports inside functions (a deferred import only hides a cycle); imports
   under ``if TYPE_CHECKING:`` are left out (they never run). A name imported
   from a package is followed to the module that defines it when the package's
   ``__init__`` re-exports it, and package ``__init__`` files that only
   re-export (facades: a docstring, imports, ``__all__``/``__version__``) are
   left out of the graph: they are the package's public face, not a step of a
   dependency.

3. **No private name across modules**: ``from x import _y`` where ``x`` is
   another module of ours, and no private module (``a._b``) imported from
   outside the package that holds it.

4. **No private attribute across modules**: ``obj._x`` (or ``getattr(obj,
   "_x")``) in module B, where ``_x`` is a private name defined by another of
   our modules (a top-level def, class or assignment, a class member, or a
   ``self._x = ...`` / ``cls._x = ...`` attribute) and B defines no ``_x`` of
   its own. ``self._x`` and ``cls._x`` are always allowed; a private
   attribute no module of ours defines (a third party's) is not this rule's
   concern.

The checker is shown to catch planted violations on a small fake tree,
``tests/project/fixtures/planted_imports/`` (named so pytest does not
collect it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: The layers, lowest first: (name, module prefixes, layers it may import besides itself).
LAYERS: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = (
    ("settings", ("blackboard.settings", "blackboard.settings_doc"), frozenset()),
    ("protocol", ("blackboard.protocol",), frozenset()),
    ("consensus", ("blackboard.consensus",), frozenset({"protocol"})),
    ("security", ("blackboard.security",), frozenset({"settings", "protocol"})),
    ("observability", ("blackboard.observability",), frozenset({"settings", "protocol"})),
    ("client", ("blackboard.client",),
     frozenset({"settings", "protocol", "consensus", "security", "observability"})),
    ("sdk", ("agents_sdk",),
     frozenset({"settings", "protocol", "consensus", "security", "observability", "client"})),
    ("db", ("blackboard.db",), frozenset({"settings", "protocol"})),
    ("embeddings", ("blackboard.embeddings",), frozenset({"settings", "protocol"})),
    ("devstack", ("blackboard.devstack",), frozenset({"settings", "protocol", "security"})),
    ("search", ("blackboard.search",),
     frozenset({"settings", "protocol", "consensus", "security", "observability", "client", "db",
                "embeddings"})),
    ("worker", ("blackboard.worker",),
     frozenset({"settings", "protocol", "consensus", "security", "observability", "client", "db",
                "embeddings", "search"})),
    ("root", ("blackboard",), frozenset({"settings", "protocol", "client"})),
    ("apps", ("blackboard.apps", "blackboard.__main__"),
     frozenset({"settings", "protocol", "consensus", "security", "observability", "client", "sdk", "db",
                "embeddings", "devstack", "search", "worker", "root"})),
    ("testing", ("blackboard.testing",),
     frozenset({"settings", "protocol", "consensus", "security", "observability", "client", "sdk", "db",
                "embeddings", "devstack", "search", "worker", "root"})),
)
#: The top-level packages checked.
PACKAGES = ("blackboard", "agents_sdk")

REPO = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).resolve().parent / "fixtures" / "planted_imports"


# -- reading the tree ------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One imported module (or name of a module) at one line."""

    line: int
    target: str  # the module the import resolves to
    names: tuple[str, ...]  # names taken from it (empty for ``import x``)
    deferred: bool  # inside a function
    type_only: bool  # under ``if TYPE_CHECKING:``


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: list[Import] = field(default_factory=list)

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def load_modules(root: Path) -> dict[str, Module]:
    """Parse every module of :data:`PACKAGES` under ``root``."""
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name, is_package = _module_name(root, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            modules[name] = Module(name, path, tree, is_package)
    for module in modules.values():
        module.imports = list(_imports(module, modules))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, deferred: bool, type_only: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node with whether it runs deferred (in a function) and only for type checkers."""
    for child in ast.iter_child_nodes(node):
        yield child, deferred, type_only
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, deferred, True
                yield from _walk(stmt, deferred, True)
            for stmt in child.orelse:
                yield stmt, deferred, type_only
                yield from _walk(stmt, deferred, type_only)
            continue
        inner = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner, type_only)


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _existing(name: str, modules: dict[str, Module]) -> str:
    """The longest prefix of ``name`` that is a module of ours."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(module: Module, modules: dict[str, Module]) -> Iterator[Import]:
    for node, deferred, type_only in _walk(module.tree, False, False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    target = _existing(alias.name, modules)
                    if target:
                        yield Import(node.lineno, target, (), deferred, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if not _ours(base):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:  # ``from package import module``
                    yield Import(node.lineno, sub, (), deferred, type_only)
                else:
                    target = _existing(base, modules)
                    if target:
                        yield Import(node.lineno, target, (alias.name,), deferred, type_only)


def is_facade(module: Module) -> bool:
    """A package ``__init__`` holding only a docstring, imports and ``__all__``/``__version__``."""
    if not module.is_package:
        return False
    for i, stmt in enumerate(module.tree.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            continue
        if isinstance(stmt, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id in ("__all__", "__version__") for t in stmt.targets):
            continue
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            continue
        return False
    return True


def _reexports(module: Module, modules: dict[str, Module]) -> dict[str, str]:
    """Names a package ``__init__`` imports from one of our modules: name -> that module."""
    out: dict[str, str] = {}
    for imp in module.imports:
        if imp.type_only or imp.deferred:
            continue
        for name in imp.names:
            out[name] = imp.target
    # ``from package import submodule`` re-exports the submodule under its name.
    for stmt in module.tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and _ours(stmt.module):
            for alias in stmt.names:
                if f"{stmt.module}.{alias.name}" in modules:
                    out[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    return out


def defining_module(target: str, name: str, modules: dict[str, Module]) -> str:
    """The module that defines ``name`` imported from ``target`` (through packages' re-exports)."""
    seen: set[str] = set()
    while target in modules and modules[target].is_package and target not in seen:
        seen.add(target)
        source = _reexports(modules[target], modules).get(name)
        if source is None:
            break
        target = source
    return target


# -- the rules ---------------------------------------------------------------------------


def layer_of(name: str) -> str | None:
    """The layer of a module (the row with the longest matching prefix)."""
    best: tuple[int, str] | None = None
    for layer, prefixes, _ in LAYERS:
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return None if best is None else best[1]


_ALLOWED = {layer: allowed | {layer} for layer, _, allowed in LAYERS}


def layer_violations(modules: dict[str, Module]) -> list[str]:
    """Imports of a layer the importer's layer may not import (or modules in no layer)."""
    out: list[str] = []
    for module in modules.values():
        own = layer_of(module.name)
        if own is None:
            out.append(f"{module.name}: in no layer (add it to LAYERS)")
            continue
        for imp in module.imports:
            targets = [defining_module(imp.target, n, modules) for n in imp.names] or [imp.target]
            for target in {imp.target, *targets}:
                theirs = layer_of(target)
                if theirs is not None and theirs not in _ALLOWED[own]:
                    out.append(f"{module.name}:{imp.line}: layer {own} imports {target} (layer {theirs})")
    return sorted(set(out))


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> modules it imports at run time (facades left out, names followed to their definers)."""
    facades = {name for name, m in modules.items() if is_facade(m)}
    graph: dict[str, set[str]] = {name: set() for name in modules if name not in facades}
    for name, module in modules.items():
        if name in facades:
            continue
        for imp in module.imports:
            if imp.type_only:
                continue
            targets = [defining_module(imp.target, n, modules) for n in imp.names] or [imp.target]
            for target in targets:
                if target != name and target in graph:
                    graph[name].add(target)
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module (breadth first, so a shortest one)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if child not in parents:
                parents[child] = node
                queue.append(child)
    return component


def cycles(modules: dict[str, Module]) -> list[str]:
    """Each import cycle, as ``a -> b -> a``, with the other modules of its component."""
    graph = import_graph(modules)
    out = []
    for component in _strongly_connected(graph):
        path = _cycle_path(graph, component)
        rest = sorted(set(component) - set(path))
        out.append(" -> ".join(path) + (f" (component also holds {', '.join(rest)})" if rest else ""))
    return sorted(out)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(modules: dict[str, Module]) -> list[str]:
    """Private names imported from another module, and private modules imported from outside their package."""
    out: list[str] = []
    for module in modules.values():
        for imp in module.imports:
            parts = imp.target.split(".")
            for i, part in enumerate(parts):
                holder = ".".join(parts[:i])
                if _private(part) and not (module.name == holder or module.name.startswith(holder + ".")):
                    out.append(f"{module.name}:{imp.line}: imports private module {imp.target}")
            for name in imp.names:
                if _private(name) and imp.target != module.name:
                    out.append(f"{module.name}:{imp.line}: imports private name {name} from {imp.target}")
    return sorted(set(out))


_SELF = ("self", "cls")


def defined_private_names(module: Module) -> set[str]:
    """Private names a module defines: top level, class members, ``self._x``/``cls._x`` attributes."""
    names: set[str] = set()

    def targets(stmt: ast.stmt) -> Iterable[ast.expr]:
        if isinstance(stmt, ast.Assign):
            return stmt.targets
        if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            return [stmt.target]
        return []

    def members(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
                if isinstance(stmt, ast.ClassDef):
                    members(stmt.body)
            for target in targets(stmt):
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        names.add(node.id)

    members(module.tree.body)
    for node in ast.walk(module.tree):
        if isinstance(node, ast.stmt):
            for target in targets(node):
                for sub in ast.walk(target):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                            and sub.value.id in _SELF):
                        names.add(sub.attr)
    return {n for n in names if _private(n)}


def _attribute_uses(module: Module) -> Iterator[tuple[int, str, str]]:
    """(line, private attribute, how it is reached) for every private attribute not of self/cls."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in _SELF:
                continue
            yield node.lineno, node.attr, f"{ast.unparse(node.value)}.{node.attr}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            if isinstance(node.args[0], ast.Name) and node.args[0].id in _SELF:
                continue
            yield node.lineno, node.args[1].value, ast.unparse(node)


def private_attributes(modules: dict[str, Module]) -> list[str]:
    """Private attributes used in a module that another module of ours defines (and it does not)."""
    defined = {name: defined_private_names(m) for name, m in modules.items()}
    definers: dict[str, list[str]] = {}
    for name, privates in defined.items():
        for private in privates:
            definers.setdefault(private, []).append(name)
    out: list[str] = []
    for name, module in modules.items():
        for line, attr, text in _attribute_uses(module):
            if attr in defined[name] or attr not in definers:
                continue
            out.append(f"{name}:{line}: {text} reaches into {attr}, defined in {', '.join(sorted(definers[attr]))}")
    return sorted(set(out))


def violations(root: Path) -> dict[str, list[str]]:
    """Every rule's violations in the tree under ``root``."""
    modules = load_modules(root)
    return {
        "layers": layer_violations(modules),
        "cycles": cycles(modules),
        "private imports": private_imports(modules),
        "private attributes": private_attributes(modules),
    }


# -- the tests ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours() -> dict[str, list[str]]:
    return violations(REPO)


@pytest.mark.parametrize("rule", ["layers", "cycles", "private imports", "private attributes"])
def test_the_code_keeps_the_rule(ours: dict[str, list[str]], rule: str) -> None:
    assert ours[rule] == [], "\n".join(ours[rule])


def test_every_module_has_a_layer() -> None:
    modules = load_modules(REPO)
    assert modules, "no modules found"
    assert {m for m in modules if layer_of(m) is None} == set()
    assert layer_of("blackboard.worker.runner") == "worker"
    assert layer_of("blackboard.settings_doc") == "settings"
    assert layer_of("blackboard") == "root"
    assert layer_of("blackboard.__main__") == "apps"


@pytest.fixture(scope="module")
def planted() -> dict[str, list[str]]:
    return violations(PLANTED)


def _reported(found: list[str], *parts: str) -> bool:
    return any(all(p in line for p in parts) for line in found)


def test_planted_lower_layer_importing_a_higher_one(planted: dict[str, list[str]]) -> None:
    # protocol -> client, and consensus -> worker (deferred), and client -> sdk under TYPE_CHECKING.
    found = planted["layers"]
    assert _reported(found, "blackboard.protocol.codec:", "layer protocol imports blackboard.client.publisher")
    assert _reported(found, "blackboard.consensus.tally:", "imports blackboard.worker.runner")
    assert _reported(found, "blackboard.client.publisher:", "imports agents_sdk.agent")


def test_planted_server_importing_the_sdk(planted: dict[str, list[str]]) -> None:
    found = planted["layers"]
    assert _reported(found, "blackboard.worker.handlers:", "layer worker imports agents_sdk.agent (layer sdk)")
    # Through the SDK package's facade: followed to the module that defines the name.
    assert _reported(found, "blackboard.search.engine:", "imports agents_sdk.board (layer sdk)")


def test_planted_sdk_importing_the_server(planted: dict[str, list[str]]) -> None:
    assert _reported(planted["layers"], "agents_sdk.board:", "layer sdk imports blackboard.db.pool")


def test_planted_apps_may_import_both(planted: dict[str, list[str]]) -> None:
    assert not any(line.startswith("blackboard.apps.") for line in planted["layers"])


def test_planted_cycles(planted: dict[str, list[str]]) -> None:
    found = planted["cycles"]
    # A module-level cycle in the SDK, and one the worker holds apart only by a deferred import.
    assert _reported(found, "agents_sdk.agent -> agents_sdk.board -> agents_sdk.agent")
    assert _reported(found, "blackboard.worker.handlers -> blackboard.worker.messages -> blackboard.worker.handlers")
    # An import under TYPE_CHECKING does not make a cycle; a facade is not a step of one.
    assert not _reported(found, "blackboard.client.streams")
    assert not any("agents_sdk ->" in line or line.endswith(" agents_sdk") for line in found)
    assert len(found) == 2, found


def test_planted_private_names(planted: dict[str, list[str]]) -> None:
    found = planted["private imports"]
    assert _reported(found, "blackboard.worker.messages:", "imports private name _row_bytes from blackboard.worker.handlers")
    assert _reported(found, "agents_sdk.board:", "imports private module blackboard.worker._tasks")
    # Inside its own package a private module is fine.
    assert not _reported(found, "blackboard.worker.handlers:", "_tasks")


def test_planted_private_attributes(planted: dict[str, list[str]]) -> None:
    found = planted["private attributes"]
    assert _reported(found, "agents_sdk.board:", "agent._store reaches into _store, defined in agents_sdk.agent")
    assert _reported(found, "agents_sdk.board:", "getattr(agent, '_nc')")
    # self._x, a module's own private names on other objects, and third-party privates are fine.
    assert not _reported(found, "agents_sdk.agent:")
    assert not _reported(found, "_asdict")
