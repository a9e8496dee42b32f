"""The layer order of gshare's own imports (docs/DESIGN.md §1): a module imports only from its own
layer or below.

* layer 0, data: ``gshare`` (the package ``__init__``), ``gshare.resources``,
  ``gshare.profiles``, ``gshare.spec``, ``gshare.workflows.*``;
* layer 1, policy: ``gshare.policy.*``;
* layer 2, the two worlds: ``gshare.sim.*`` and ``gshare.runtime.*``, which never import each
  other;
* layer 3, front ends: ``gshare.experiments.*``, ``gshare.cli``, ``gshare.testing``,
  ``gshare.demo``, ``gshare.gpukit.*`` (the GPU kit).

Classification is by name prefix (``gshare.runtime`` covers ``gshare.runtime.control``,
``.gateway``, ``.node``, ... whatever its sub-packages become). Any other module name under
``gshare`` is an error, so a new top-level module must be added to ``LAYERS`` first.
``gshare/data/`` holds CSV files only (read through ``importlib.resources`` by ``profiles`` and
``sim.workload``), no module.

What counts as an import (every source file under ``src/gshare``, parsed with ``ast``):
``import x``, ``from x import y`` (``y`` resolved to the sub-module ``x.y`` when there is one),
relative imports, ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name,
at module level, inside functions and under ``if TYPE_CHECKING:``. Type-only imports are
checked like the others (a type naming an upper layer is still a dependency on it), with one
exemption: the package facade ``gshare/__init__.py`` may name upper-layer modules under
``TYPE_CHECKING`` — its public ``Client`` attribute (``gshare.runtime.client``) is resolved on
first use through the ``_LAZY`` string table (PEP 562 ``__getattr__``), so ``import gshare``
(and every policy module) does not import the runtime; the string table is not an import.

Relation to ``test_policy_purity.py`` / ``test_workflow_purity.py``: they check a different
rule — no stdlib or third-party module that does I/O, reads the clock or starts threads (and
for the workflow policies no pydantic/networkx), transitively, in a fresh interpreter — and stay
needed. The only overlap: a policy module importing ``gshare.sim`` or ``gshare.runtime`` used to
fail them only by accident (through the ``time``/``asyncio`` those import); it now fails here by
rule, with the offending edge named.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import gshare

SRC = Path(gshare.__file__).parent

LAYERS: tuple[tuple[str, int, str], ...] = (
    # (name prefix, layer, world); the longest matching prefix wins
    ("gshare", 0, ""),  # the package __init__ only (exact match, see _classify)
    ("gshare.resources", 0, ""),
    ("gshare.profiles", 0, ""),
    ("gshare.spec", 0, ""),
    ("gshare.documents", 0, ""),
    ("gshare.workflows", 0, ""),
    ("gshare.scenario", 0, ""),
    ("gshare.stats", 0, ""),
    ("gshare.policy", 1, ""),
    ("gshare.sim", 2, "sim"),
    ("gshare.runtime", 2, "runtime"),
    ("gshare.experiments", 3, ""),
    ("gshare.cli", 3, ""),
    ("gshare.testing", 3, ""),
    ("gshare.demo", 3, ""),
    ("gshare.gpukit", 3, ""),
)
LAYER_NAMES = {0: "data", 1: "policy", 2: "sim|runtime", 3: "experiments|cli|testing"}

TYPE_CHECKING_FACADES = frozenset({"gshare"})
"""Modules whose ``if TYPE_CHECKING:`` imports are not checked (module doc: the lazy facade)."""


@dataclass(frozen=True)
class Import:
    target: str
    line: int
    type_only: bool


def _classify(module: str) -> tuple[int, str] | None:
    """``(layer, world)`` of a gshare module name, ``None`` when it is not classified."""
    if module == "gshare":
        return 0, ""
    best: tuple[str, int, str] | None = None
    for prefix, layer, world in LAYERS:
        if prefix == "gshare":
            continue
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, layer, world)
    return None if best is None else (best[1], best[2])


def _module_name(path: Path) -> tuple[str, bool]:
    """Dotted name of a source file under ``SRC`` and whether it is a package ``__init__``."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def source_modules() -> dict[str, Path]:
    """Every module of the gshare source tree (``__pycache__`` aside)."""
    out: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        out[_module_name(path)[0]] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_relative(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, name] if name else base)


def imports_of(
    module: str, source: str, *, is_pkg: bool = False, known: frozenset[str] = frozenset()
) -> list[Import]:
    """Every gshare module ``module`` imports (module doc: what counts). ``known``: the existing
    module names, to resolve ``from pkg import submodule``."""
    tree = ast.parse(source)
    type_only_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                type_only_nodes.update(id(n) for n in ast.walk(child))
    found: list[Import] = []

    def add(target: str, node: ast.AST) -> None:
        if target == "gshare" or target.startswith("gshare."):
            found.append(Import(target, getattr(node, "lineno", 0), id(node) in type_only_nodes))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve_relative(module, is_pkg, node.level, node.module)
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node)
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                add(arg.value, node)
    return list(dict.fromkeys(found))  # one entry per (target, line) of ``from x import a, b``


def violations(
    module: str, source: str, *, is_pkg: bool = False, known: frozenset[str] = frozenset()
) -> list[str]:
    """Every import of ``module`` (source text ``source``) that breaks the layer order, as
    ``"module -> imported (line N): why"``; also an unclassified ``module`` itself."""
    here = _classify(module)
    if here is None:
        return [f"{module}: not classified in a layer (add it to LAYERS in tests/test_layers.py)"]
    layer, world = here
    out: list[str] = []
    for imp in imports_of(module, source, is_pkg=is_pkg, known=known):
        if imp.type_only and module in TYPE_CHECKING_FACADES:
            continue
        tc = ", TYPE_CHECKING" if imp.type_only else ""
        where = f"{module} -> {imp.target} (line {imp.line}{tc})"
        there = _classify(imp.target)
        if there is None:
            out.append(f"{where}: imported module is not classified in a layer")
        elif there[0] > layer:
            out.append(
                f"{where}: layer {layer} ({LAYER_NAMES[layer]}) imports up into layer "
                f"{there[0]} ({LAYER_NAMES[there[0]]})"
            )
        elif there[0] == layer and world and there[1] and there[1] != world:
            out.append(f"{where}: {world} and {there[1]} must never import each other")
    return out


def all_violations() -> list[str]:
    modules = source_modules()
    known = frozenset(modules)
    out: list[str] = []
    for name, path in modules.items():
        out.extend(
            violations(name, path.read_text(), is_pkg=path.name == "__init__.py", known=known)
        )
    return out


# -- the real tree -------------------------------------------------------------------------------


def test_the_walk_sees_every_layer_and_its_imports() -> None:
    modules = source_modules()
    layers = {_classify(m) for m in modules}
    assert {(0, ""), (1, ""), (2, "sim"), (2, "runtime"), (3, "")} <= layers
    cli = modules["gshare.cli"]
    targets = {
        i.target for i in imports_of("gshare.cli", cli.read_text(), known=frozenset(modules))
    }
    assert any(t.startswith("gshare.experiments") for t in targets), targets


def test_no_import_runs_back_up_the_layers() -> None:
    bad = all_violations()
    for line in bad:
        print(line)
    assert not bad, f"{len(bad)} import(s) break the layer order:\n" + "\n".join(bad)


# -- the checker itself, on synthetic sources -----------------------------------------------------

KNOWN = frozenset(source_modules()) | {"gshare.sim.cluster", "gshare.policy.placement"}


@pytest.mark.parametrize(
    ("module", "source", "is_pkg", "expect"),
    [
        # upward imports, in every form
        ("gshare.policy.fake", "import gshare.sim.cluster\n", False, "layer 1 (policy) imports up"),
        ("gshare.policy.fake", "from gshare.sim import cluster\n", False, "-> gshare.sim.cluster"),
        ("gshare.policy.fake", "from gshare.sim.cluster import Cluster\n", False, "imports up"),
        (
            "gshare.policy.fake",
            "def f():\n    from gshare.runtime import server\n",
            False,
            "-> gshare.runtime.server (line 2)",
        ),
        ("gshare.policy.fake", "from ..sim import cluster\n", False, "-> gshare.sim.cluster"),
        ("gshare.policy", "from ..sim import cluster\n", True, "-> gshare.sim.cluster"),
        (
            "gshare.policy.fake",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from gshare.sim import engine\n",
            False,
            "TYPE_CHECKING",
        ),
        (
            "gshare.policy.fake",
            "import importlib\nimportlib.import_module('gshare.experiments')\n",
            False,
            "-> gshare.experiments (line 2)",
        ),
        (
            "gshare.workflows.fake",
            "from gshare.policy import placement\n",
            False,
            "layer 0 (data) imports up into layer 1",
        ),
        (
            "gshare.resources",
            "from gshare.experiments.registry import get\n",
            False,
            "imports up into layer 3",
        ),
        ("gshare.sim.workflow.fake", "import gshare.experiments.common\n", False, "imports up"),
        # sim and runtime never import each other, at any depth
        (
            "gshare.sim.fake",
            "from gshare.runtime.control import loop\n",
            False,
            "sim and runtime must never",
        ),
        ("gshare.runtime.node.fake", "import gshare.sim\n", False, "runtime and sim must never"),
        # unclassified modules, on either side
        ("gshare.newthing", "import gshare.resources\n", False, "not classified"),
        ("gshare.policy.fake", "import gshare.newthing\n", False, "not classified"),
    ],
)
def test_checker_reports_an_upward_import(
    module: str, source: str, is_pkg: bool, expect: str
) -> None:
    bad = violations(module, source, is_pkg=is_pkg, known=KNOWN)
    assert bad and any(expect in b for b in bad), bad


@pytest.mark.parametrize(
    ("module", "source", "is_pkg"),
    [
        (
            "gshare.policy.fake",
            "from gshare.resources import Rect\nimport gshare.workflows.config\n",
            False,
        ),
        ("gshare.policy.fake", "from gshare.policy.placement import make_placer\n", False),
        ("gshare.policy.fake", "from . import placement\nfrom .placement import base\n", False),
        (
            "gshare.sim.fake",
            "from gshare.policy import placement\nimport gshare.sim.engine\n",
            False,
        ),
        ("gshare.runtime.gateway.fake", "from gshare.runtime.control import loop\n", False),
        (
            "gshare.experiments.fake",
            "import gshare.sim.cluster\nimport gshare.runtime.server\n",
            False,
        ),
        ("gshare.cli", "from gshare.experiments import registry\n", False),
        ("gshare.testing", "import gshare.sim\nimport gshare.runtime\n", True),
        ("gshare.workflows.fake", "import gshare\nfrom gshare import profiles\n", False),
        # the package facade: TYPE_CHECKING names and a string table only (module doc)
        (
            "gshare",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from gshare.runtime.client import Client\n"
            "_LAZY = {'Client': 'gshare.runtime.client'}\n",
            True,
        ),
        ("gshare.policy.fake", "import numpy\nimport importlib\n", False),
    ],
)
def test_checker_accepts_downward_and_sideways_imports(
    module: str, source: str, is_pkg: bool
) -> None:
    assert violations(module, source, is_pkg=is_pkg, known=KNOWN) == []


def test_the_facade_may_not_import_up_at_run_time() -> None:
    bad = violations(
        "gshare", "from gshare.runtime.client import Client\n", is_pkg=True, known=KNOWN
    )
    assert bad and "layer 0 (data) imports up into layer 2" in bad[0]


def import_cycles(
    prefix: str, *, type_only: bool = True, sources: dict[str, str] | None = None
) -> list[list[str]]:
    """The import cycles among the modules under ``prefix`` (strongly connected components of
    more than one module), counting every import that runs — at module level or in a function
    — and, with ``type_only``, the type-only ones under ``if TYPE_CHECKING:`` too. ``sources``
    (module name -> source text) stands in for the package's files (the finder's own tests)."""
    paths = source_modules()
    texts = sources or {n: p.read_text() for n, p in paths.items()}
    packages = {n for n, p in paths.items() if p.name == "__init__.py"} if not sources else set()
    known = frozenset(texts)
    graph: dict[str, set[str]] = {}
    for name, text in texts.items():
        if not name.startswith(prefix):
            continue
        graph[name] = {
            i.target
            for i in imports_of(name, text, is_pkg=name in packages, known=known)
            if (type_only or not i.type_only) and i.target.startswith(prefix) and i.target != name
        }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_runtime_has_no_import_cycle() -> None:
    """A module that needs another's names must not be needed by it: a cycle makes the import
    order matter and the two impossible to read apart. Type-only imports count too: a module
    that only names another's type for a call back takes a ``Protocol`` of its own (as
    ``gateway.channel.ChannelOwner`` and ``backends.BackendHost`` do)."""
    assert import_cycles("gshare.runtime") == []


def test_the_cycle_finder_counts_type_only_imports_when_told() -> None:
    sources = {
        "gshare.runtime.a": "from gshare.runtime.b import B\n",
        "gshare.runtime.b": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from gshare.runtime.a import A\n"
        ),
        "gshare.runtime.c": "def f():\n    from gshare.runtime.a import A\n",
    }
    assert import_cycles("gshare.runtime", sources=sources) == [
        ["gshare.runtime.a", "gshare.runtime.b"]
    ]
    assert import_cycles("gshare.runtime", type_only=False, sources=sources) == []
