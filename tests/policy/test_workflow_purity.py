"""gshare.policy.workflow stays pure (docs/DESIGN.md §1) and light: importing any of its modules in
a fresh interpreter pulls in no forbidden module — nor pydantic (its models import socket and
threading) nor networkx (which imports both), which is why the policy takes workflows through
the ``WorkflowLike`` protocol and computes dominators itself."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import gshare.policy.workflow

FORBIDDEN = sorted(
    {
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
        "pydantic",
        "networkx",
    }
)


def test_workflow_policy_modules_import_nothing_forbidden() -> None:
    mods = [
        m.name
        for m in pkgutil.walk_packages(
            gshare.policy.workflow.__path__, prefix="gshare.policy.workflow."
        )
    ]
    assert {"gshare.policy.workflow.astar", "gshare.policy.workflow.slo_split"} <= set(mods)
    code = (
        "import sys\nbefore = set(sys.modules)\n"
        + "".join(f"import {m}\n" for m in mods)
        + f"print(','.join(sorted(m for m in set(sys.modules) - before "
        f"if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
