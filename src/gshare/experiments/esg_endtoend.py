"""``esg-endtoend`` — ESG §5.1, Fig. 6 and Fig. 8: SLO hit rate and cost of ESG and its four
baselines in the strict-light, moderate-normal and relaxed-heavy settings.

Every cell simulates ESG's four applications (random application per arrival, uniform
inter-arrival intervals of the load level, SLO = factor x L) on ESG's cluster of 16 invokers x
16 vCPUs x 7 vGPUs with the same request stream for every scheduler
(``esg_common.run_cell``; durations in ``FULL``: 5 s warm-up, 25 s measured, then a drain —
chosen so the full run takes about five minutes on a shared 2-core machine: Orion's search
costs ~100 ms of wall time per request in the heavy load and Aquatope's offline BO ~35 s per
SLO level).
Cost is normalised to ESG's cost per request in the same setting (and application).

Summary (required): ``slo_hit_rate[setting][scheduler]``, ``cost_normalized[setting][scheduler]``
(ESG = 1); also per application (Fig. 8), ESG's gain over each baseline in hit rate (percentage
points and relative %) and cost saving (``cost_normalized - 1``, in %, the paper's "47-187 %"),
and the configuration-miss rate (Table 4: the dispatched batch was larger than the queue).

With ``charged_settings`` (FULL: strict-light) the cells of those settings are run a second
time (for ``charged_schedulers``: all but Aquatope, whose online decision is a table look-up
and whose offline BO would run again) with the measured decision time counted into virtual
time
(``WorkflowSimConfig.charge_decision_time``; ESG's Fig. 9 counts Orion's search time this way):
``slo_hit_rate_decision_time_charged[setting][scheduler]``. Those rows depend on the machine.

Quick mode: 1 s warm-up, 2 s measured, Orion's cut-off at 2,000 evaluated states and Aquatope's
BO at 8 bootstrap samples + 2 rounds — for the tests only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.esg_common import (
    SCHEDULERS,
    cell_rows,
    check_schedulers,
    grouped_bars,
    normalise_costs,
    run_cells,
)
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult

SETTING_NAMES = ["strict-light", "moderate-normal", "relaxed-heavy"]

FULL: dict[str, Any] = {
    "settings": SETTING_NAMES,
    "schedulers": list(SCHEDULERS),
    "seeds": [0],
    "warmup_s": 5.0,
    "measure_s": 25.0,
    "drain_s": 120.0,
    "initial_warm_per_pool": 5,
    "workers": 2,
    "policy_params": {},
    "aquatope_bo": {},
    "charged_settings": ["strict-light"],
    "charged_schedulers": ["esg", "infless", "fast-gshare", "orion"],
}
QUICK: dict[str, Any] = {
    "warmup_s": 1.0,
    "measure_s": 2.0,
    "drain_s": 60.0,
    "workers": 1,
    "policy_params": {"orion": {"max_evaluations": 2000}},
    "aquatope_bo": {"n_bootstrap": 8, "n_rounds": 2},
    "charged_settings": [],
}

# expected relative run time of a cell, to start the long ones first in the process pool
_WEIGHT = {"aquatope": 8.0, "orion": 6.0}


def cell_kwargs(params: Mapping[str, Any], scheduler: str, trace: str) -> dict[str, Any]:
    """``run_cell`` keywords of a scheduler from the experiment parameters (plain data, so the
    cell can run in another process)."""
    kw: dict[str, Any] = {
        "trace": trace,
        "policy_kwargs": dict(params.get("policy_params", {}).get(scheduler, {})),
    }
    if scheduler == "aquatope":
        kw["bo_params"] = dict(params.get("aquatope_bo", {}))
    return kw


def run_grid(
    params: Mapping[str, Any], seed: int, *, trace: str = "uniform"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run every (setting, scheduler, seed) cell (plus the charged ones); return the rows (with
    ``cost_normalized``) and the raw cells. An unknown scheduler is a ``KeyError``."""
    have = check_schedulers(params["schedulers"])
    seeds = [seed + int(s) for s in params["seeds"]]
    cell_params = {
        k: params[k]
        for k in ("warmup_s", "measure_s", "drain_s", "initial_warm_per_pool")
        if k in params
    }
    jobs: list[tuple[str, str, Mapping[str, Any], int, Mapping[str, Any]]] = []
    charged_scheds = params.get("charged_schedulers", have)
    for charged in (False, True):
        settings = params.get("charged_settings", []) if charged else params["settings"]
        for setting in settings:
            for sched in have:
                if charged and sched not in charged_scheds:
                    continue
                for s in seeds:
                    kw = cell_kwargs(params, sched, trace)
                    p = dict(cell_params)
                    if charged:
                        p["charge_decision_time"] = True
                    jobs.append((setting, sched, p, s, kw))
    order = sorted(range(len(jobs)), key=lambda i: -_WEIGHT.get(jobs[i][1], 1.0))
    done = run_cells([jobs[i] for i in order], int(params.get("workers", 1)))
    cells: list[dict[str, Any]] = [{}] * len(jobs)
    for i, cell in zip(order, done, strict=True):
        cells[i] = cell
    rows: list[dict[str, Any]] = []
    for job, cell in zip(jobs, cells, strict=True):
        rows.extend(
            cell_rows(
                cell, {"decision_time_charged": bool(job[2].get("charge_decision_time", False))}
            )
        )
    normalise_costs(rows, ("setting", "application", "seed", "decision_time_charged"))
    return rows, cells


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if r[key] is not None and np.isfinite(r[key])]
    return float(np.mean(vals)) if vals else float("nan")


def summarise_grid(
    rows: list[dict[str, Any]], settings: list[str], schedulers: list[str]
) -> dict[str, Any]:
    """The summary tables (module doc), averaged over seeds."""

    def pick(
        setting: str, sched: str, app: str = "all", charged: bool = False
    ) -> list[dict[str, Any]]:
        return [
            r
            for r in rows
            if r["setting"] == setting
            and r["scheduler"] == sched
            and r["application"] == app
            and r["decision_time_charged"] == charged
        ]

    hit: dict[str, dict[str, float]] = {}
    cost: dict[str, dict[str, float]] = {}
    miss: dict[str, dict[str, float]] = {}
    usd: dict[str, dict[str, float]] = {}
    for st in settings:
        for sc in schedulers:
            rs = pick(st, sc)
            if not rs:
                continue
            hit.setdefault(st, {})[sc] = _mean(rs, "slo_hit_rate")
            cost.setdefault(st, {})[sc] = _mean(rs, "cost_normalized")
            usd.setdefault(st, {})[sc] = _mean(rs, "cost_per_request_usd")
            miss.setdefault(st, {})[sc] = _mean(rs, "config_miss_rate")
    apps = sorted({r["application"] for r in rows if r["application"] != "all"})
    hit_app: dict[str, dict[str, dict[str, float]]] = {}
    cost_app: dict[str, dict[str, dict[str, float]]] = {}
    for st in settings:
        for app in apps:
            for sc in schedulers:
                rs = pick(st, sc, app)
                if rs:
                    hit_app.setdefault(st, {}).setdefault(app, {})[sc] = _mean(rs, "slo_hit_rate")
                    cost_app.setdefault(st, {}).setdefault(app, {})[sc] = _mean(
                        rs, "cost_normalized"
                    )
    gain_pp: dict[str, dict[str, float]] = {}
    gain_rel: dict[str, dict[str, float]] = {}
    saving: dict[str, dict[str, float]] = {}
    for st, by in hit.items():
        if "esg" not in by:
            continue
        for sc, h in by.items():
            if sc == "esg":
                continue
            gain_pp.setdefault(st, {})[sc] = (by["esg"] - h) * 100.0
            gain_rel.setdefault(st, {})[sc] = (by["esg"] - h) / h * 100.0 if h > 0 else float("inf")
            saving.setdefault(st, {})[sc] = (cost[st][sc] - 1.0) * 100.0
    charged_hit: dict[str, dict[str, float]] = {}
    charged_cost: dict[str, dict[str, float]] = {}
    for st in settings:
        for sc in schedulers:
            rs = pick(st, sc, charged=True)
            if rs:
                charged_hit.setdefault(st, {})[sc] = _mean(rs, "slo_hit_rate")
                charged_cost.setdefault(st, {})[sc] = _mean(rs, "cost_normalized")
    out: dict[str, Any] = {
        "slo_hit_rate": hit,
        "cost_normalized": cost,
        "cost_per_request_usd": usd,
        "slo_hit_rate_per_app": hit_app,
        "cost_normalized_per_app": cost_app,
        "esg_hit_rate_gain_pp": gain_pp,
        "esg_hit_rate_gain_rel_pct": gain_rel,
        "esg_cost_saving_pct": saving,
        "config_miss_rate": miss,
    }
    if charged_hit:
        out["slo_hit_rate_decision_time_charged"] = charged_hit
        out["cost_normalized_decision_time_charged"] = charged_cost
    return out


def plots(summary: Mapping[str, Any], prefix: str, title: str) -> list[Any]:
    """Fig. 6 (hit-rate bars + normalised-cost markers per setting) and Fig. 8 (per
    application, one PNG per setting)."""

    def fig6(result: ExperimentResult, folder: Path) -> Path:
        return grouped_bars(
            folder,
            f"{prefix}_slo_cost.png",
            summary["slo_hit_rate"],
            title=f"{title}: SLO hit rate (bars), cost / ESG (markers)",
            ylabel="SLO hit rate",
            second=summary["cost_normalized"],
            second_label="cost normalised to ESG",
        )

    out: list[Any] = [fig6]
    for st in summary.get("slo_hit_rate_per_app", {}):

        def fig8(result: ExperimentResult, folder: Path, st: str = st) -> Path:
            return grouped_bars(
                folder,
                f"{prefix}_per_app_{st}.png",
                summary["slo_hit_rate_per_app"][st],
                title=f"{title}, {st}: per application",
                ylabel="SLO hit rate",
                second=summary["cost_normalized_per_app"][st],
                second_label="cost normalised to ESG",
            )

        out.append(fig8)
    return out


@register(
    "esg-endtoend",
    "ESG §5.1 Fig. 6/8: SLO hit rate and normalised cost of ESG vs INFless, FaST-GShare, "
    "Orion, Aquatope in three SLO/load settings",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    rows, _ = run_grid(params, seed)
    have = list(params["schedulers"])
    summary = summarise_grid(rows, list(params["settings"]), have)
    summary["schedulers"] = have
    return ExperimentResult(
        experiment="esg-endtoend",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=plots(summary, "endtoend", "esg-endtoend"),
        table_columns=[
            "setting",
            "scheduler",
            "application",
            "decision_time_charged",
            "requests",
            "slo_hit_rate",
            "cost_normalized",
            "p95_ms",
            "slo_ms",
        ],
    )
