"""Part d: does the interposer's memory cap hold under PyTorch, with every allocator?

A process under ``LD_PRELOAD`` with a 1 GiB cap (``GSHARE_CUDA_MEM_LIMIT_MB``) runs
``parts.memchild`` with PyTorch's three allocator set-ups: the caching allocator
(``cuMemAlloc``), ``backend:cudaMallocAsync`` (stream-ordered pools) and
``expandable_segments:True`` (``cuMemCreate``/VMM: does it bypass the cap?). In each:
``cuMemGetInfo`` shows the cap as the device's total, an allocation of twice the cap raises
``torch.cuda.OutOfMemoryError`` and the process goes on allocating within it. Then, while a
capped process holds its memory, an ungoverned neighbour allocates 4 GiB: it must succeed.
GPU only (the stub driver's cap is tested by tests/native).
"""

from __future__ import annotations

import json
from pathlib import Path

from gshare.gpukit.parts.common import (
    Deadline,
    KitContext,
    deployment_env,
    driver_env,
    part_main,
    run_json,
    skipped,
    start,
)
from gshare.gpukit.results import Figure, PartResult, judge

CAP_MB = 1024
ALLOCATORS = {
    "caching": "",
    "cudaMallocAsync": "backend:cudaMallocAsync",
    "expandable_segments": "expandable_segments:True",
}


def _env(ctx: KitContext, conf: str) -> dict[str, str]:
    env = deployment_env(ctx, "preload", GSHARE_CUDA_MEM_LIMIT_MB=str(CAP_MB))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
        if conf:
            env[k] = conf
    return env


def run(ctx: KitContext, budget_s: float) -> PartResult:
    if not ctx.gpu:
        return judge(
            [skipped("over_cap_refused_caching", ctx.no_gpu_reason())],
            False,
            ctx.no_gpu_reason() + "; the stub's cap is tested by tests/native",
        )
    dl = Deadline(budget_s)
    work = Path(ctx.work)
    argv = [ctx.python, "-m", "gshare.gpukit.parts.memchild", "--cap-mb", str(CAP_MB)]
    figs: list[Figure] = []
    for label, conf in ALLOCATORS.items():
        if not dl.enough(10):
            figs.append(skipped(f"over_cap_refused_{label}", "no time left"))
            continue
        try:
            r = run_json(f"d-{label}", argv, _env(ctx, conf), work, 90)
        except RuntimeError as e:
            f = skipped(f"over_cap_refused_{label}", str(e))
            f.passed = False
            figs.append(f)
            continue
        refused = bool(r.get("over_cap_refused"))
        alive = bool(r.get("alive_after"))
        note = r.get("error", "") or "the over-cap allocation SUCCEEDED: the cap was bypassed"
        figs.append(
            Figure(
                f"over_cap_refused_{label}",
                refused,
                "yes (OutOfMemoryError)",
                refused,
                "",
                "gpu",
                note,
            )
        )
        figs.append(
            Figure(
                f"alive_after_refusal_{label}",
                alive,
                "yes",
                alive,
                "",
                "gpu",
                r.get("after_error", ""),
            )
        )
        total = r.get("info_total_bytes")
        figs.append(
            Figure(
                f"mem_get_info_total_mib_{label}",
                None if total is None else total / (1 << 20),
                f"== {CAP_MB}",
                total == CAP_MB << 20,
                "MiB",
                "gpu",
                f"free {r.get('info_free_bytes')} bytes",
            )
        )
    if dl.enough(15):
        held = start("d-held", [*argv, "--hold"], _env(ctx, ""), work)
        try:
            before = held.expect("ready", 60)
            neighbour = run_json(
                "d-neighbour",
                [ctx.python, "-m", "gshare.gpukit.parts.memchild", "--neighbour-mb", "4096"],
                driver_env(ctx),
                work,
                60,
            )
            held.go()
            held.finish(30)
            ok = bool(neighbour.get("neighbour_ok"))
            capped = json.loads(before[-1]) if before else {}
            figs.append(
                Figure(
                    "neighbour_allocates_4gib",
                    ok,
                    "yes",
                    ok,
                    "",
                    "gpu",
                    f"beside a capped process (refused its over-cap allocation: "
                    f"{capped.get('over_cap_refused')}) " + neighbour.get("error", ""),
                )
            )
        except (RuntimeError, ValueError) as e:
            figs.append(skipped("neighbour_allocates_4gib", str(e)))
            if held.popen.poll() is None:
                held.popen.kill()
    return judge(figs, True, "")


if __name__ == "__main__":
    part_main(run)
