"""Part f: MPS partitions on a real GPU (FaST-GShare Fig. 10: 3.15x on a V100).

Starts the MPS control daemon the way the node agent does
(``runtime.node.partition.start_mps_daemon``) with a private pipe and log folder — or records
exactly why it cannot start — then measures resnet50 (batch 1) throughput: one process at
100 % active threads, 8 processes at 12 % and 4 at 24 % (``partition.cuda_env``, all started
together), and reports each group's summed throughput over the single process's. The daemon
is always stopped (``quit``) before the part ends; no GPU setting is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gshare.gpukit.parts.common import (
    Deadline,
    KitContext,
    Proc,
    driver_env,
    last_json,
    part_main,
    skipped,
    start,
    tail,
    workload_argv,
)
from gshare.gpukit.results import Figure, PartResult, judge

GROUPS = ((1, 100), (8, 12), (4, 24))
"""(processes, active-thread %) — the first is the baseline."""
PAPER_SPEEDUP = 3.15


def _group(
    ctx: KitContext, work: Path, n: int, pct: int, env: dict[str, str], seconds: float
) -> float:
    from gshare.runtime.node.partition import cuda_env

    procs: list[Proc] = []
    try:
        for i in range(n):
            e = {**env, **cuda_env(pct, pipe_dir=env["CUDA_MPS_PIPE_DIRECTORY"])}
            argv = workload_argv(
                ctx,
                "resnet50",
                "--mode",
                "saturate",
                "--batch",
                "1",
                "--seconds",
                f"{seconds:g}",
                "--wait-go",
            )
            procs.append(start(f"f-{n}x{pct}-{i}", argv, e, work))
        for p in procs:
            p.expect("ready", 120)
        for p in procs:
            p.go()
        total = 0.0
        for p in procs:
            total += float(last_json(p.finish(seconds + 60))["items_per_s"])
        return total
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()


def run(ctx: KitContext, budget_s: float) -> PartResult:
    if not ctx.gpu:
        return judge([skipped("mps_speedup_8x12", ctx.no_gpu_reason())], False, ctx.no_gpu_reason())
    from gshare.runtime.node import partition

    dl = Deadline(budget_s)
    work = Path(ctx.work)
    pipe, logs = work / "mps-pipe", work / "mps-log"
    pipe.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    os.environ.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    env = {
        **driver_env(ctx),
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    figs: list[Figure] = []
    started = partition.start_mps_daemon(timeout_s=10.0)
    why = ""
    if not started:
        binary = shutil.which(partition.MPS_CONTROL)
        why = (
            f"{partition.MPS_CONTROL} not on PATH"
            if binary is None
            else f"the daemon did not come up; its log: {tail(logs / 'control.log')}"
        )
    figs.append(Figure("mps_daemon_started", started, "yes", started, "", "gpu", why))
    if not started:
        return judge(figs, True, "")
    try:
        seconds = 4.0
        rates: dict[tuple[int, int], float] = {}
        for n, pct in GROUPS:
            if not dl.enough(seconds + 25):
                figs.append(skipped(f"mps_speedup_{n}x{pct}", "no time left"))
                continue
            try:
                rates[(n, pct)] = _group(ctx, work, n, pct, env, seconds)
            except (RuntimeError, ValueError, KeyError) as e:
                figs.append(skipped(f"mps_speedup_{n}x{pct}", str(e)))
        base = rates.get(GROUPS[0])
        if base:
            figs.append(
                Figure(
                    "resnet50_b1_items_per_s_1x100",
                    round(base, 1),
                    None,
                    None,
                    "items/s",
                    "gpu",
                    "one process at 100 % under MPS",
                )
            )
            for n, pct in GROUPS[1:]:
                if (n, pct) in rates:
                    figs.append(
                        Figure(
                            f"mps_speedup_{n}x{pct}",
                            round(rates[(n, pct)] / base, 2),
                            f"paper (V100, 8x12): {PAPER_SPEEDUP}",
                            None,
                            "x",
                            "gpu",
                            f"{rates[(n, pct)]:.1f} items/s summed over {n} processes",
                        )
                    )
    finally:
        _stop(env, logs, figs)
    return judge(figs, True, "")


def _stop(env: dict[str, Any], logs: Path, figs: list[Figure]) -> None:
    from gshare.runtime.node import partition

    binary = shutil.which(partition.MPS_CONTROL)
    if binary is None:
        return
    try:
        subprocess.run(
            [binary],
            input="quit\n",
            env=env,
            text=True,
            timeout=20,
            capture_output=True,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        figs.append(Figure("mps_daemon_stopped", False, "yes", False, "", "gpu", str(e)))


if __name__ == "__main__":
    part_main(run)
