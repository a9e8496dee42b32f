"""Part e: the data FIKIT's simulator lacks — kernel durations, idle gaps, the switch cost.

* **Kernels and gaps.** resnet50, resnet101, mobilenet_v2 and bert-base at batch 1 and 4 run
  under the interposer's measurement mode (``GSHARE_CUDA_PROFILE``: every kernel's duration SK
  and the idle gap SG after it, by kernel ID); the rows go to ``fikit-kernels.csv`` in the
  result folder (``analysis.KERNEL_COLUMNS``: Orion's columns plus the gap). In a dry run the
  probe's kernel on the stub makes the table, so the path is exercised.
* **Launch-order traces.** One process without the interposer profiles one pass of each model
  and batch with ``torch.profiler`` (CUPTI timestamps): every kernel in launch order with its
  duration and the idle gap to the next (``kernel-trace.csv``, ``analysis.TRACE_COLUMNS``) —
  the per-launch host time that the V100 data lack and the kernel-level simulator assumes. In
  a dry run the same code runs on the CPU with a tiny model (no kernel rows).
* **Context-switch cost** of default time-slicing: two ``probe spin`` processes at once, their
  ``%globaltimer`` timelines merged (``analysis.switch_cost``). GPU only.
* The high-priority p99 beside a saturating low-priority function (FIKIT vs equal priorities)
  needs the live runtime: part g measures it.
"""

from __future__ import annotations

import csv
from pathlib import Path

from gshare.gpukit.analysis import KERNEL_COLUMNS, SpinTimeline, kernel_rows, switch_cost
from gshare.gpukit.parts.common import (
    Deadline,
    KitContext,
    Proc,
    deployment_env,
    driver_env,
    part_main,
    probe_argv,
    run_json,
    skipped,
    start,
    stub_env,
    workload_argv,
)
from gshare.gpukit.results import Figure, PartResult, judge

MODELS = ("resnet50", "resnet101", "mobilenet_v2", "bert-base")
BATCHES = (1, 4)
CSV_NAME = "fikit-kernels.csv"
TRACE_NAME = "kernel-trace.csv"
SPIN_MS = 400.0


def _profile(
    ctx: KitContext, work: Path, name: str, argv: list[str], key: str, **extra: str
) -> list[object]:
    """Run ``argv`` in measurement mode; its profile's ``KernelStats``."""
    from gshare.runtime import native

    path = work / f"e-{name}.profile.json"
    env = deployment_env(
        ctx, "preload", GSHARE_CUDA_PROFILE=str(path), GSHARE_CUDA_TASK_KEY=key, **extra
    )
    p = start(f"e-{name}", argv, env, work)
    if argv[1] == "saturate":
        p.expect("ready", 60)
        p.go()
    p.finish(180)
    if not path.is_file():
        raise RuntimeError(f"{name}: the interposer wrote no profile (not loaded?)")
    return list(native.read_kernel_profile(path).kernels())


def _kernel_table(ctx: KitContext, work: Path, out: Path, dl: Deadline) -> list[Figure]:
    rows: list[dict[str, object]] = []
    figs: list[Figure] = []
    if not ctx.gpu:
        stats = _profile(
            ctx,
            work,
            "probe",
            probe_argv(ctx, "saturate", "0.3", "200", "4"),
            "probe",
            **stub_env(ctx, gk_busy=200),
        )
        rows += kernel_rows("probe", 1, stats)
    else:
        for model in MODELS:
            for batch in BATCHES:
                name = f"kernels_{model}_b{batch}"
                if not dl.enough(20):
                    figs.append(skipped(name, "no time left"))
                    continue
                try:
                    argv = workload_argv(
                        ctx,
                        model,
                        "--mode",
                        "latency",
                        "--batch",
                        str(batch),
                        "--warmup",
                        "3",
                        "--iters",
                        "20",
                    )
                    stats = _profile(ctx, work, f"{model}-b{batch}", argv, f"{model}-b{batch}")
                except RuntimeError as e:
                    figs.append(skipped(name, str(e)))
                    continue
                r = kernel_rows(model, batch, stats)
                rows += r
                busy = sum(float(x["Duration"]) * float(x["Count"]) for x in r)
                gaps = [float(x["Gap"]) for x in r]
                figs.append(
                    Figure(
                        name,
                        len(r),
                        None,
                        None,
                        "kernel IDs",
                        "gpu",
                        f"device busy {busy / 1e6:.1f} ms over the runs; median gap "
                        f"{sorted(gaps)[len(gaps) // 2] / 1e3:.1f} us",
                    )
                )
    with open(out / CSV_NAME, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(KERNEL_COLUMNS))
        w.writeheader()
        w.writerows(rows)
    figs.insert(
        0,
        Figure(
            "kernel_table_rows",
            len(rows),
            "> 0",
            len(rows) > 0,
            "rows",
            ctx.on,
            f"{CSV_NAME} in the result folder",
        ),
    )
    return figs


def _traces(ctx: KitContext, work: Path, out: Path) -> list[Figure]:
    if ctx.gpu:
        argv = workload_argv(
            ctx,
            "all",
            "--mode",
            "trace",
            "--batches",
            ",".join(map(str, BATCHES)),
            "--trace-csv",
            str(out / TRACE_NAME),
        )
    else:
        argv = workload_argv(
            ctx,
            "mobilenet_v2",
            "--mode",
            "trace",
            "--batches",
            "1",
            "--device",
            "cpu",
            "--tiny",
            "--trace-csv",
            str(work / TRACE_NAME),
        )
    r = run_json("e-trace", argv, driver_env(ctx), work, 240)
    on = "gpu" if ctx.gpu else "cpu"
    figs = []
    for p in r["passes"]:
        figs.append(
            Figure(
                f"trace_{p['model']}_b{p['batch']}",
                p["kernels"],
                None,
                None,
                "kernels",
                on,
                f"device {p['device_ms']:.2f} ms, idle gaps {p['gap_ms']:.2f} ms in one pass",
            )
        )
    return figs


def _switch_cost(ctx: KitContext, work: Path) -> list[Figure]:
    procs: dict[str, Proc] = {}
    files = {w: work / f"e-spin-{w}.txt" for w in ("a", "b")}
    try:
        for w, path in files.items():
            procs[w] = start(
                f"e-spin-{w}",
                probe_argv(ctx, "spin", f"{SPIN_MS:g}", str(path)),
                driver_env(ctx),
                work,
            )
        for p in procs.values():
            p.expect("ready", 60)
        for p in procs.values():
            p.go()
        for p in procs.values():
            p.finish(60)
    finally:
        for p in procs.values():
            if p.popen.poll() is None:
                p.popen.kill()
    sc = switch_cost({w: SpinTimeline.parse(f.read_text()) for w, f in files.items()})
    note = (
        f"{sc.switches} hand-overs; p10 {sc.p10_us:.1f} / p90 {sc.p90_us:.1f} us; time slice "
        f"{sc.slice_median_ms:.2f} ms; both running at once {sc.overlap_ms:.1f} ms"
    )
    return [
        Figure("context_switch_us_median", round(sc.median_us, 2), None, None, "us", "gpu", note),
        Figure("time_slice_ms_median", round(sc.slice_median_ms, 3), None, None, "ms", "gpu", ""),
    ]


def run(ctx: KitContext, budget_s: float) -> PartResult:
    dl = Deadline(budget_s)
    work, out = Path(ctx.work), Path(ctx.out)
    figs: list[Figure] = []
    if ctx.gpu:
        try:
            figs += _switch_cost(ctx, work)
        except (RuntimeError, ValueError) as e:
            figs.append(skipped("context_switch_us_median", str(e)))
    else:
        figs.append(skipped("context_switch_us_median", ctx.no_gpu_reason()))
    if dl.enough(40):
        try:
            figs += _traces(ctx, work, out)
        except (RuntimeError, KeyError, ValueError) as e:
            figs.append(skipped("trace", str(e), "gpu" if ctx.gpu else "cpu"))
    try:
        figs += _kernel_table(ctx, work, out, dl)
    except RuntimeError as e:
        f = skipped("kernel_table_rows", str(e), ctx.on)
        f.passed = False
        figs.append(f)
    figs.append(skipped("high_priority_p99", "measured live in part g (gshare serve)", "gpu"))
    return judge(figs, ctx.gpu, ctx.no_gpu_reason())


if __name__ == "__main__":
    part_main(run)
