"""Shared machinery of the ``esg-*`` experiments: build a scheduler, run one simulated cell,
summarise it, run cells in parallel, plot.

A *cell* is one (load setting, scheduler, variant) simulation of ESG's four applications on
ESG's cluster (``gshare.sim.workflow``): the request stream of the setting's load (uniform
intervals, §4.1, or the Azure 2021 replay) with the setting's SLO level, ``warmup_s`` of
unmeasured traffic, then ``measure_s`` of measured arrivals, then a drain (nothing accepted is
dropped; a request unfinished at the end is a miss).

Platform defaults of every cell (``cell_config``): 16 invokers x 16 vCPUs x 7 vGPUs, the
448-configuration grid, EWMA pre-warming (``policy.prewarm``), 10-minute keep-alive, and a
cluster that starts with ``initial_warm_per_pool`` idle containers of every function on every
invoker — the steady state of a platform that has served this workload for longer than a
keep-alive (a cold cluster turns the first seconds into a cold-start storm of 3.5-22 s starts
that hold their resources; see the experiments' docs). The same request stream (same seed) is
given to every scheduler.

Schedulers come from ``gshare.policy.workflow.esg.WORKFLOW_POLICIES`` (ESG, its ablation
variants, and the baselines of ``gshare.policy.workflow.baselines``); Aquatope's offline
Bayesian optimisation (``gshare.experiments.offline_bo``) is run by ``build_policy`` (it lives
outside ``policy/`` because it uses scikit-learn). A scheduler name that is not registered is
an error naming the known ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, cast

import numpy as np

from gshare.policy.prewarm import PrewarmParams
from gshare.policy.workflow.esg import BASELINE_NAMES, WORKFLOW_POLICIES, make_policy
from gshare.policy.workflow.schedulers import WorkflowPolicy
from gshare.sim.workflow import WorkflowRunResult, WorkflowSim, WorkflowSimConfig, load_arrivals
from gshare.workflows.catalogue import SETTINGS, Load, SloLevel, applications
from gshare.workflows.perf import PerfModel

SCHEDULERS: tuple[str, ...] = ("esg", *BASELINE_NAMES)
"""ESG and the four baselines of §4.2, in the paper's order after ESG."""

CELL_DEFAULTS: dict[str, Any] = {
    "warmup_s": 5.0,
    "measure_s": 25.0,
    "drain_s": 120.0,
    "initial_warm_per_pool": 5,
    "noise_sigma_frac": None,
    "prewarm_period_ms": 1000.0,
    "charge_decision_time": False,
}
"""Cell parameters every experiment accepts (overridable per experiment)."""


def setting_levels(setting: str) -> tuple[SloLevel, Load]:
    """``(SLO level, load)`` of a setting name; ``KeyError`` listing the known ones."""
    try:
        slo, load = SETTINGS[setting]
    except KeyError:
        raise KeyError(f"unknown setting {setting!r} (known: {', '.join(SETTINGS)})") from None
    return cast(SloLevel, slo), cast(Load, load)


def check_schedulers(wanted: Sequence[str]) -> list[str]:
    """``wanted`` as a list, or ``KeyError`` naming the first scheduler that is not registered
    in ``WORKFLOW_POLICIES`` and the known ones."""
    for name in wanted:
        if name not in WORKFLOW_POLICIES:
            known = ", ".join(sorted(WORKFLOW_POLICIES))
            raise KeyError(f"unknown workflow scheduler {name!r} (known: {known})")
    return list(wanted)


def build_policy(
    name: str,
    perf: PerfModel,
    seed: int,
    *,
    bo_params: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> WorkflowPolicy:
    """A fresh scheduler; Aquatope gets its offline BO optimiser
    (``offline_bo.bo_optimiser(perf, **bo_params)``; ESG's budget when ``bo_params`` is empty)."""
    if name == "aquatope" and "optimiser" not in kwargs and "static_plans" not in kwargs:
        # imported here, not at the top: scikit-learn takes ~0.6 s to import and only Aquatope
        # needs it (every CLI command loads this module through the experiment registry)
        from gshare.experiments.offline_bo import bo_optimiser

        kwargs["optimiser"] = bo_optimiser(perf, **dict(bo_params or {}))
    return make_policy(name, perf=perf, seed=seed, **kwargs)


def cell_config(params: Mapping[str, Any]) -> WorkflowSimConfig:
    """The simulated platform of a cell (module doc)."""
    p = {**CELL_DEFAULTS, **params}
    return WorkflowSimConfig(
        prewarm=PrewarmParams(period_ms=float(p["prewarm_period_ms"])),
        initial_warm_per_pool=int(p["initial_warm_per_pool"]),
        warmup_ms=float(p["warmup_s"]) * 1000.0,
        drain_ms=float(p["drain_s"]) * 1000.0,
        noise_sigma_frac=p["noise_sigma_frac"],
        charge_decision_time=bool(p["charge_decision_time"]),
    )


def run_cell(
    setting: str,
    scheduler: str,
    params: Mapping[str, Any],
    seed: int,
    *,
    trace: str = "uniform",
    policy_kwargs: Mapping[str, Any] | None = None,
    bo_params: Mapping[str, Any] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """Simulate one cell; return a picklable summary (``summarise``) with the wall time.
    ``policy_kwargs`` go to the scheduler's factory, ``bo_params`` to Aquatope's BO."""
    p = {**CELL_DEFAULTS, **params}
    slo, load = setting_levels(setting)
    wfs = applications(slo)
    horizon_ms = (float(p["warmup_s"]) + float(p["measure_s"])) * 1000.0
    arrivals = load_arrivals(load, horizon_ms, list(wfs), seed, trace=trace)
    perf = PerfModel.default()
    t0 = time.perf_counter()
    policy = build_policy(scheduler, perf, seed, bo_params=bo_params, **dict(policy_kwargs or {}))
    sim = WorkflowSim(wfs, policy, cell_config(p), perf=perf, seed=seed)
    result = sim.run(arrivals, horizon_ms)
    out = summarise(result)
    out.update(
        setting=setting,
        scheduler=label or scheduler,
        seed=seed,
        trace=trace,
        wall_s=time.perf_counter() - t0,
    )
    return out


def summarise(result: WorkflowRunResult) -> dict[str, Any]:
    """Overall and per-application statistics, counters and decision times of one run."""
    apps = result.applications()
    return {
        "overall": result.stats(),
        "per_app": {a: result.stats(a) for a in apps},
        "counters": dict(result.counters),
        "decision": result.decision_stats(),
        "plan_ms": result.plan_ms.tolist(),
        "peak_vcpus": list(result.peak_vcpus),
        "peak_vgpus": list(result.peak_vgpus),
    }


def _run_job(job: tuple[Any, ...]) -> dict[str, Any]:
    setting, scheduler, params, seed, kw = job
    return run_cell(setting, scheduler, params, seed, **kw)


def run_cells(
    jobs: Sequence[tuple[str, str, Mapping[str, Any], int, Mapping[str, Any]]], workers: int
) -> list[dict[str, Any]]:
    """Run ``(setting, scheduler, params, seed, run_cell keywords)`` jobs, in ``workers``
    processes when > 1 (results in job order; each cell is seeded, so the order of execution
    does not change any result)."""
    workers = max(1, min(int(workers), len(jobs), os.cpu_count() or 1))
    if workers == 1:
        return [_run_job(tuple(j)) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_run_job, [tuple(j) for j in jobs]))


def cell_rows(
    cell: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row for the whole cell (``application = "all"``) and one per application."""
    base = {
        "setting": cell["setting"],
        "scheduler": cell["scheduler"],
        "seed": cell["seed"],
        "trace": cell["trace"],
        **(extra or {}),
    }
    c, d = cell["counters"], cell["decision"]
    rows = [
        {
            **base,
            "application": "all",
            **_stat_cols(cell["overall"]),
            "cold_starts": c["cold_starts"],
            "prewarm_started": c["prewarm_started"],
            "mean_batch": c["mean_batch"],
            "config_miss_rate": c["config_miss_rate"],
            "local_input_share": c["local_input_share"],
            "no_invoker": c["no_invoker"],
            "vcpu_alloc_util": c["vcpu_alloc_util"],
            "vgpu_alloc_util": c["vgpu_alloc_util"],
            "plan_ms_mean": d["plan_ms_mean"],
            "plan_ms_p95": d["plan_ms_p95"],
            "select_ms_mean": d["select_ms_mean"],
            "wall_s": cell["wall_s"],
            "peak_vcpus_max": max(cell["peak_vcpus"]),
            "peak_vgpus_max": max(cell["peak_vgpus"]),
        }
    ]
    for app, st in cell["per_app"].items():
        rows.append({**base, "application": app, **_stat_cols(st)})
    return rows


def _stat_cols(st: Mapping[str, float]) -> dict[str, Any]:
    return {
        "requests": int(st["requests"]),
        "slo_hit_rate": st["slo_hit_rate"],
        "cost_per_request_usd": st["cost_per_request_usd"],
        "p50_ms": st["p50_ms"],
        "p95_ms": st["p95_ms"],
        "p99_ms": st["p99_ms"],
        "slo_ms": st["slo_ms"],
        "unfinished": int(st["unfinished"]),
    }


def normalise_costs(
    rows: list[dict[str, Any]], group_keys: Sequence[str], ref: str = "esg"
) -> None:
    """Add ``cost_normalized`` to every row: its cost per request over the ``ref`` scheduler's
    in the same group (same values of ``group_keys``); NaN when the group has no ``ref``."""
    refs = {
        tuple(r[k] for k in group_keys): r["cost_per_request_usd"]
        for r in rows
        if r["scheduler"] == ref
    }
    for r in rows:
        base = refs.get(tuple(r[k] for k in group_keys))
        r["cost_normalized"] = (
            r["cost_per_request_usd"] / base if base and np.isfinite(base) else float("nan")
        )


def grouped_bars(
    folder: Path,
    filename: str,
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    ylabel: str,
    second: Mapping[str, Mapping[str, float]] | None = None,
    second_label: str = "",
    logy: bool = False,
) -> Path:
    """Grouped bars ``groups[group][bar]``; with ``second``, markers on a right axis (Fig. 6
    style: hit rate bars, normalised cost markers)."""
    import matplotlib.pyplot as plt

    names = list(groups)
    bars: list[str] = []
    for g in groups.values():
        bars.extend(b for b in g if b not in bars)
    width = 0.8 / max(1, len(bars))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(names)), 4))
    ax2 = ax.twinx() if second else None
    for j, b in enumerate(bars):
        xs = [i + j * width for i in range(len(names))]
        ax.bar(xs, [groups[g].get(b, float("nan")) for g in names], width, label=b)
        if ax2 is not None and second is not None:
            ax2.plot(xs, [second[g].get(b, float("nan")) for g in names], "kD", ms=4)
    ax.set_xticks([i + width * (len(bars) - 1) / 2 for i in range(len(names))])
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if ax2 is not None:
        ax2.set_ylabel(second_label + " (markers)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    out = folder / filename
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def table(
    rows: Sequence[Mapping[str, Any]], row_key: str, col_key: str, value: str
) -> dict[str, dict[str, float]]:
    """``{row[row_key]: {row[col_key]: row[value]}}`` (for summaries and plots)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        out.setdefault(str(r[row_key]), {})[str(r[col_key])] = r[value]
    return out
