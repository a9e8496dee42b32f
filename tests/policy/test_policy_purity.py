"""docs/DESIGN.md §1: policy/ decides and never acts. Every module of gshare.policy is imported in a
fresh interpreter, and the test fails if it imports (directly or through its imports) a module
that does I/O, reads the clock or drags in a runtime."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import gshare.policy

FORBIDDEN = {
    "time",
    "asyncio",
    "ray",
    "torch",
    "socket",
    "subprocess",
    "requests",
    "httpx",
    "sqlite3",
    "threading",
    "multiprocessing",
    "fastapi",
    "uvicorn",
    "simpy",
}
POLICY_DIR = Path(gshare.policy.__file__).parent


def _policy_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages([str(POLICY_DIR)], prefix="gshare.policy.")]


def test_policy_has_modules() -> None:
    assert len(_policy_modules()) >= 3


def test_no_forbidden_import_statements() -> None:
    bad = []
    for path in POLICY_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in FORBIDDEN:
                    bad.append(f"{path.name}: import {n}")
    assert not bad, bad


def test_importing_policy_pulls_in_no_forbidden_module() -> None:
    mods = _policy_modules()
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        + "".join(f"import {m}\n" for m in mods)
        + "bad = sorted(m for m in set(sys.modules) - before "
        + f"if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"policy imports pull in: {out.stdout.strip()}"
