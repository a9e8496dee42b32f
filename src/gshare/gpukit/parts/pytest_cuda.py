"""Part h: ``pytest -m cuda`` — the repository's own CUDA tests, on the GPU.

Runs pytest (from the bundle on the target) over the test files that carry the ``cuda``
marker, with ``-m cuda``, and reports the counts of its closing line. On a machine without a
GPU they all skip (that is the dry run's result: the part is then ``skipped``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gshare.gpukit.parts.common import KitContext, part_main
from gshare.gpukit.results import Figure, PartResult

ROOT = Path(__file__).resolve().parents[4]
"""The source checkout (``tests/`` lies there)."""


def cuda_test_files(root: Path = ROOT) -> list[Path]:
    """The test files that use the ``cuda`` marker."""
    return sorted(
        p
        for p in (root / "tests").rglob("test_*.py")
        if "mark.cuda" in p.read_text(errors="replace")
    )


def counts(text: str) -> dict[str, int]:
    """pytest's closing counts (``3 passed, 1 failed, 2 skipped in 4.1s``)."""
    return {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)
    }


def run(ctx: KitContext, budget_s: float) -> PartResult:
    files = cuda_test_files()
    if not files:
        return PartResult("fail", f"no test file with the cuda marker under {ROOT / 'tests'}")
    cmd = [
        ctx.python,
        "-m",
        "pytest",
        "-m",
        "cuda",
        "-q",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-rs",
        *map(str, files),
    ]
    try:
        # the machine's own pytest plugins (xdist, cov, timeout ...) are not loaded
        env = {**ctx.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        p = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(5.0, budget_s - 5),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return PartResult("fail", f"pytest -m cuda ran past {budget_s - 5:.0f} s")
    print(p.stdout[-20000:])
    print(p.stderr[-5000:])
    closing = [x for x in p.stdout.splitlines() if counts(x) and " in " in x]
    tail = (closing or p.stdout.strip().splitlines() or [""])[-1].strip("= ")
    n = counts(tail)
    failed = n.get("failed", 0) + n.get("error", 0) + n.get("errors", 0)
    passed, skipped_n = n.get("passed", 0), n.get("skipped", 0)
    on = "gpu" if ctx.gpu else "cpu"
    figs = [
        Figure("cuda_tests_passed", passed, None, None, "tests", on, tail),
        Figure("cuda_tests_failed", failed, "== 0", failed == 0, "tests", on, ""),
        Figure(
            "cuda_tests_skipped",
            skipped_n,
            None,
            None,
            "tests",
            on,
            f"{len(files)} files: {', '.join(f.name for f in files)}",
        ),
    ]
    if p.returncode not in (0, 5) or failed:
        return PartResult("fail", f"pytest exited {p.returncode}: {tail}", figs)
    if passed == 0:
        return PartResult(
            "skipped",
            f"every CUDA test skipped: {ctx.no_gpu_reason()}"
            if not ctx.gpu
            else f"no CUDA test ran: {tail}",
            figs,
        )
    return PartResult("pass", "", figs)


if __name__ == "__main__":
    part_main(run)
