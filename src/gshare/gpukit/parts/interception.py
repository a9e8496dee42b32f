"""Part a: does the interposer govern every kernel the device runs, in each deployment?

Driver level (the probe, on the GPU or the stub): a saturating run under a token server; the
launches the interposer governed must equal the kernels the device ran (on the stub: its
device log; on a GPU: the launches the probe made that succeeded).

PyTorch (GPU only): resnet50 at batch 1 and bert-base at batch 8, random weights, under a
token server at quota 1.0, in both deployments (``LD_PRELOAD``; the ``libcuda.so.1`` shim):
the interposer's ``launches`` (its whole-process count, cuBLAS/cuDNN and ``cuLaunchKernelEx``
included) against the kernels CUPTI saw (``torch.profiler`` over the whole process). Then a
CUDA graph replayed N times: how many ``cuGraphLaunch`` the interposer saw. The headline:
interception complete (governed = device kernels) for both models in at least one deployment;
the runtime should then use that deployment (``GSHARE_CUDA_DEPLOYMENT``).
"""

from __future__ import annotations

from pathlib import Path

from gshare.gpukit.parts.common import (
    DEPLOYMENTS,
    Deadline,
    KitContext,
    add_client,
    check,
    deployment_env,
    part_main,
    probe_argv,
    read_stats,
    run_json,
    skipped,
    start,
    stub_env,
    token_env,
    token_server,
    workload_argv,
)
from gshare.gpukit.results import Figure, PartResult, judge

MODELS = (("resnet50", 1), ("bert-base", 8))


def _probe_run(ctx: KitContext, work: Path, deployment: str) -> Figure:
    name = f"probe_governed_launches_{deployment}"
    with token_server(work, f"a-{deployment}") as ts:
        add_client(ts, "probe", 1.0, 1.0)
        stats = work / f"a-probe-{deployment}.json"
        log = work / f"a-probe-{deployment}.stub.log"
        env = deployment_env(
            ctx,
            deployment,
            GSHARE_CUDA_STATS=str(stats),
            STUB_CUDA_LOG=str(log),
            **token_env(ts, "probe"),
            **stub_env(ctx, gk_busy=200),
        )
        p = start(
            f"a-probe-{deployment}", probe_argv(ctx, "saturate", "0.6", "200", "8"), env, work
        )
        p.expect("ready", 60)
        p.go()
        words = p.finish(60).split()
    launched, failed = int(words[words.index("launches") + 1]), int(words[-1])
    s = read_stats(stats)
    governed = s.get("launches")
    if ctx.dry_run:
        device = sum(1 for x in log.read_text().splitlines() if x and x[0] != "#")
        src = "the stub's device log"
    else:
        device, src = launched - failed, "the probe's successful launches"
    seen = s.get("deployment")
    fig = check(
        name,
        governed,
        "==",
        device,
        "launches",
        ctx.on,
        f"device kernels: {src}; the interposer says it ran as {seen!r}",
    )
    if seen is not None and seen != deployment:
        fig.passed = False  # loaded, but not the way this deployment meant
    return fig


def _torch_run(
    ctx: KitContext, work: Path, model: str, batch: int, dep: str, iters: int
) -> tuple[Figure, bool]:
    stats = work / f"a-{model}-{dep}.json"
    with token_server(work, f"a-{model}-{dep}") as ts:
        add_client(ts, "w", 1.0, 1.0)
        env = deployment_env(ctx, dep, GSHARE_CUDA_STATS=str(stats), **token_env(ts, "w"))
        r = run_json(
            f"a-{model}-{dep}",
            workload_argv(
                ctx, model, "--mode", "kernels", "--batch", str(batch), "--iters", str(iters)
            ),
            env,
            work,
            240,
        )
    s = read_stats(stats)
    governed, device = s.get("launches"), int(r["device_kernels"])
    by_entry = s.get("launches_by_entry", {})
    note = (
        f"device kernels {device}, memcpy/memset {r['memops']}; ran as "
        f"{s.get('deployment')!r}; by entry {by_entry}"
    )
    if not s:
        note = "the interposer wrote no stats: not loaded in this deployment? " + note
    fig = Figure(
        f"governed_launches_{model}_b{batch}_{dep}",
        governed,
        f"== {device} (device kernels)",
        None,
        "launches",
        "gpu",
        note,
    )
    return fig, governed == device


def run(ctx: KitContext, budget_s: float) -> PartResult:
    dl = Deadline(budget_s)
    work = Path(ctx.work)
    figs: list[Figure] = []
    for dep in DEPLOYMENTS:
        try:
            figs.append(_probe_run(ctx, work, dep))
        except RuntimeError as e:
            figs.append(
                check(f"probe_governed_launches_{dep}", None, "==", 0, on=ctx.on, note=str(e))
            )
            figs[-1].passed = False if dep == "preload" or ctx.shim_dir else None
    if not ctx.gpu:
        figs.append(skipped("interception_complete_torch", ctx.no_gpu_reason()))
        return judge(figs, False, ctx.no_gpu_reason())
    complete: dict[str, bool] = {}
    for dep in DEPLOYMENTS:
        for model, batch in MODELS:
            if not dl.enough(25):
                figs.append(skipped(f"governed_launches_{model}_b{batch}_{dep}", "no time left"))
                complete[dep] = False
                continue
            try:
                fig, ok = _torch_run(ctx, work, model, batch, dep, iters=5)
            except RuntimeError as e:
                fig, ok = skipped(f"governed_launches_{model}_b{batch}_{dep}", str(e)), False
            figs.append(fig)
            complete[dep] = complete.get(dep, True) and ok
    works = [d for d, ok in complete.items() if ok]
    figs.append(
        Figure(
            "interception_complete_in",
            ", ".join(works) or "none",
            ">= 1 deployment",
            bool(works),
            "",
            "gpu",
            "deployments where governed = device kernels for every model",
        )
    )
    dep = works[0] if works else "preload"
    if dl.enough(20):
        stats = work / f"a-graph-{dep}.json"
        try:
            with token_server(work, "a-graph") as ts:
                add_client(ts, "w", 1.0, 1.0)
                env = deployment_env(ctx, dep, GSHARE_CUDA_STATS=str(stats), **token_env(ts, "w"))
                r = run_json(
                    "a-graph",
                    workload_argv(ctx, "resnet50", "--mode", "graph", "--iters", "20"),
                    env,
                    work,
                    120,
                )
            s = read_stats(stats)
            figs.append(
                Figure(
                    f"graph_launches_seen_{dep}",
                    s.get("graph_launches"),
                    None,
                    None,
                    "launches",
                    "gpu",
                    f"replays {r['replays']} of {r['kernels_per_replay']:.0f} kernels each; "
                    f"governed launches {s.get('launches')} (graph kernels are not launches)",
                )
            )
        except RuntimeError as e:
            figs.append(skipped(f"graph_launches_seen_{dep}", str(e)))
    return judge(figs, True, "")


if __name__ == "__main__":
    part_main(run)
