"""``esg-ablation`` — ESG §5.5, Fig. 12: ESG without GPU sharing and without batching, in the
relaxed-heavy setting (the paper uses a heavy load "to underline the effects of the batching
strategy").

Variants (``gshare.policy.workflow.esg``):

* ``esg`` — ESG as in the other experiments;
* ``esg-no-sharing`` — no GPU sharing: a task holds its node's whole GPU (all 7 vGPU slices,
  billed as 7 vGPUs), so one task at a time runs on a GPU; ESG searches only the
  configurations with 7 vGPUs, and its minimum configuration becomes (1 job, 1 vCPU, 7 vGPUs).
  This is §5.5's "without the GPU-sharing strategy ... jobs are queued, waiting for a GPU
  (currently in use) to free up": the MIG slicing is gone, a function gets the GPU alone;
* ``esg-no-batching`` — every task serves one job (configurations with batch 1 only).

Everything else (cluster, workload, pre-warming, cell durations) is as in ``esg-endtoend``.

A variant may also be ``[label, scheduler, {cell parameter: value}]``: FULL adds
``esg-cold-cluster`` — ESG with 1 instead of 5 warm containers per function and invoker at
time 0, to show how much the results depend on the warm start (cold starts of 3.5-22 s hold
their task's resources, and the queues they build push ESG into its minimum-configuration
fallback).

Summary: ``slo_hit_rate[variant]``, ``cost[variant]`` (USD per request), ``cost_normalized
[variant]`` (ESG = 1), and per variant the mean batch, allocated vCPU/vGPU utilisation, local
input share and p95 latency.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gshare.experiments.esg_common import cell_rows, grouped_bars, normalise_costs, run_cells
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult

VARIANTS = ["esg", "esg-no-sharing", "esg-no-batching"]

FULL: dict[str, Any] = {
    "setting": "relaxed-heavy",
    "variants": [*VARIANTS, ["esg-cold-cluster", "esg", {"initial_warm_per_pool": 1}]],
    "warmup_s": 5.0,
    "measure_s": 25.0,
    "drain_s": 120.0,
    "initial_warm_per_pool": 5,
    "workers": 2,
}
QUICK: dict[str, Any] = {
    "warmup_s": 1.0,
    "measure_s": 2.0,
    "drain_s": 60.0,
    "workers": 1,
    "variants": VARIANTS,
}


@register(
    "esg-ablation",
    "ESG §5.5 Fig. 12: ESG vs ESG without GPU sharing vs ESG without batching (relaxed-heavy)",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    cell_params = {
        k: params[k] for k in ("warmup_s", "measure_s", "drain_s", "initial_warm_per_pool")
    }
    jobs: list[tuple[str, str, Mapping[str, Any], int, Mapping[str, Any]]] = []
    for v in params["variants"]:
        if isinstance(v, str):
            jobs.append((params["setting"], v, cell_params, seed, {}))
        else:
            label, sched, over = v
            jobs.append((params["setting"], sched, {**cell_params, **over}, seed, {"label": label}))
    cells = run_cells(jobs, int(params["workers"]))
    rows: list[dict[str, Any]] = []
    for cell in cells:
        rows.extend(cell_rows(cell))
    normalise_costs(rows, ("setting", "application", "seed"))
    overall = {r["scheduler"]: r for r in rows if r["application"] == "all"}
    summary: dict[str, Any] = {
        "setting": params["setting"],
        "slo_hit_rate": {v: r["slo_hit_rate"] for v, r in overall.items()},
        "cost": {v: r["cost_per_request_usd"] for v, r in overall.items()},
        "cost_normalized": {v: r["cost_normalized"] for v, r in overall.items()},
        "details": {
            v: {
                k: r[k]
                for k in (
                    "mean_batch",
                    "vcpu_alloc_util",
                    "vgpu_alloc_util",
                    "local_input_share",
                    "p95_ms",
                    "no_invoker",
                    "cold_starts",
                )
            }
            for v, r in overall.items()
        },
    }

    def plot(result: ExperimentResult, folder: Path) -> Path:
        return grouped_bars(
            folder,
            "ablation.png",
            {"SLO hit rate": summary["slo_hit_rate"], "cost / ESG": summary["cost_normalized"]},
            title=f"esg-ablation ({params['setting']})",
            ylabel="value",
        )

    return ExperimentResult(
        experiment="esg-ablation",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=[plot],
        table_columns=[
            "scheduler",
            "application",
            "requests",
            "slo_hit_rate",
            "cost_per_request_usd",
            "cost_normalized",
            "p95_ms",
            "mean_batch",
        ],
    )
