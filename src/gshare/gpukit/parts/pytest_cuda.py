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
        "-v",
        "--durations=5",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-rs",
        *map(str, files),
    ]
    # the machine's own pytest plugins (xdist, cov, timeout ...) are not loaded
    env = {**ctx.env, "PYTHONUNBUFFERED": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    log = Path(ctx.work) / "h-pytest.log"
    limit_s = max(5.0, budget_s - 5)
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            p.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    text = log.read_text(errors="replace")
    print(text[-20000:])
    if p.returncode is not None and p.returncode < 0:
        # Past its time: what finished is still worth reporting (``-v`` names each test).
        done = re.findall(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", text, re.M)
        n_done = {k: sum(1 for _, r in done if r == k) for k in ("PASSED", "FAILED", "SKIPPED")}
        running = text.strip().splitlines()[-1:] or [""]
        return PartResult(
            "fail",
            f"pytest -m cuda ran past {limit_s:.0f} s: {n_done['PASSED']} passed, "
            f"{n_done['FAILED']} failed, {n_done['SKIPPED']} skipped before it was stopped "
            f"(last line: {running[0][:160]})",
            [
                Figure(
                    f"cuda_test_{name.split('::')[-1]}",
                    res.lower(),
                    None,
                    None,
                    "",
                    "gpu" if ctx.gpu else "cpu",
                    name,
                )
                for name, res in done
            ],
        )
    closing = [x for x in text.splitlines() if counts(x) and " in " in x]
    tail = (closing or text.strip().splitlines() or [""])[-1].strip("= ")
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
