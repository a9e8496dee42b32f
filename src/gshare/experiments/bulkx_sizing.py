"""``bulkx-sizing``: resource-centric sizing (BulkX appendix §2.3 and §3, Fig. 7) on
the 990 real apps of the Azure Functions 2019 trace.

Question: how much reserved memory does sizing each app's memory as ``(init, step)`` save over
reserving its maximum, what do the alternatives cost in kills and scale-up steps, and — with
the same total memory — how many more invocations per second does a cluster sustain?

Per app (``sim.sizing.apps``: demands by inverse-CDF interpolation of the app's memory
percentiles, execution times likewise from its duration percentiles, start times from its
per-minute counts; at most ``invocation_cap`` invocations per app, each then standing for
``invocations / simulated`` real ones), the first ``train_fraction`` of its invocations train
and the rest are scored under every policy (``sim.sizing.accounting``):

* ``fixed-max`` — OpenWhisk-style: the app's maximum (p100);
* ``fixed-p99`` — the app's p99; a larger demand is killed after ``kill_fraction`` of its run
  and retried once at the maximum;
* ``bulkx`` — ``policy.sizing.solve_sizing`` on the training prefix with the appendix's
  objective literally (``step_cost_mb`` 0), growth by ``policy.memory.grow_limit`` up to the
  app's maximum;
* ``bulkx-window`` — the same, re-solved every ``window_min`` minutes from the latest
  ``history_cap`` invocations (the live controller keeps 2,000);
* ``bulkx-priced`` — ``bulkx`` with a fixed price of ``step_cost_mb`` per scale-up (gshare's
  reading of the cost factor, ``policy.sizing`` item 4): fewer, larger steps.

Summary (every figure weighted by the apps' real invocation counts unless named ``app_``):

* ``memory_waste_pct`` — reserved MB·s ÷ used MB·s − 1, in %, over the scored invocations
  (used = demand x execution time; a killed attempt's reservation counts as reserved);
* ``kills_per_1k`` — invocations killed per 1,000;
* ``scale_steps_per_invocation`` — mean scale-up steps (0 for the fixed policies);
  ``grown_pct`` — invocations that grew at all;
* ``throughput_gain_vs_fixed_max_pct`` — the sustained rate of the capacity model
  (``sim.sizing.cluster``: ``servers`` x ``server_mb`` of memory, first-fit on the nodes'
  ledgers, at most ``max_reject`` of the arrivals rejected, bisection) over fixed-max's, − 1;
  ``throughput_gain_fluid_pct`` the same from the fluid bound (perfect packing, Little's law);
  ``sustained_rate_per_s``, ``moves_per_1k`` (BulkX growths that had to move node);
* ``app_median_waste_pct`` — the median over apps of each app's waste (every app counts once);
* ``waste_threshold_sweep`` — ``bulkx`` at other thresholds: waste against steps;
* ``bulkx_waste_over_fixed_max`` and ``done_when`` (the issue's targets: BulkX's waste at
  most half of fixed-max's, BulkX's kills 0).

Apps with fewer than two invocations in the day have nothing to score and are left out (their
count is reported); the capacity workload draws from the scored apps, each BulkX app with the
sizing it ended the day with. The measured figures and what they mean are in
``docs/journal/sizing.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.common import bar_plot
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.policy.sizing import Sizing
from gshare.sim.sizing import (
    AppInvocations,
    AppOutcome,
    AppTrace,
    PolicyKind,
    PolicySpec,
    draw_invocations,
    draw_stream,
    evaluate,
    load_apps,
    pick_apps,
    reservation,
    sustained_rate,
)

FULL_PARAMS: dict[str, Any] = {
    "apps": None,
    "invocation_cap": 1000,
    "train_fraction": 0.2,
    "kill_fraction": 0.5,
    "window_min": 60,
    "history_cap": 2000,
    "cost_factor": 1.0,
    "waste_threshold": 0.1,
    "granularity_mb": 1.0,
    "step_cost_mb": 64.0,
    "threshold_sweep": [0.02, 0.05, 0.2],
    "servers": 8,
    "server_mb": 65536.0,
    "arrivals": 40000,
    "warmup_fraction": 0.25,
    "max_reject": 0.01,
    "bisection_iterations": 10,
}
QUICK_PARAMS: dict[str, Any] = {
    "apps": 60,
    "invocation_cap": 120,
    "threshold_sweep": [],
    "servers": 2,
    "arrivals": 2500,
    "bisection_iterations": 5,
}

FIXED_MAX = "fixed-max"
TARGET_WASTE_RATIO = 0.5


def policies(p: Mapping[str, Any]) -> list[PolicySpec]:
    """The compared policies (module doc)."""
    knobs = {
        "cost_factor": float(p["cost_factor"]),
        "waste_threshold": float(p["waste_threshold"]),
        "granularity_mb": float(p["granularity_mb"]),
    }
    return [
        PolicySpec(FIXED_MAX, PolicyKind.FIXED_MAX),
        PolicySpec("fixed-p99", PolicyKind.FIXED_P99),
        PolicySpec("bulkx", PolicyKind.BULKX, **knobs),
        PolicySpec("bulkx-window", PolicyKind.BULKX_WINDOW, **knobs),
        PolicySpec(
            "bulkx-priced", PolicyKind.BULKX, step_cost_mb=float(p["step_cost_mb"]), **knobs
        ),
    ]


@dataclass
class Totals:
    """Weighted sums over apps for one policy."""

    invocations: float = 0.0
    reserved_mbs: float = 0.0
    used_mbs: float = 0.0
    kills: float = 0.0
    steps: float = 0.0
    grown: float = 0.0
    solves: int = 0
    simulated: int = 0

    def add(self, o: AppOutcome, weight: float) -> None:
        self.invocations += o.invocations * weight
        self.reserved_mbs += o.reserved_mbs * weight
        self.used_mbs += o.used_mbs * weight
        self.kills += o.kills * weight
        self.steps += o.steps * weight
        self.grown += o.grown * weight
        self.solves += o.solves
        self.simulated += o.invocations

    @property
    def waste_pct(self) -> float:
        return (self.reserved_mbs / self.used_mbs - 1.0) * 100.0 if self.used_mbs else math.nan

    def per(self, x: float, scale: float = 1.0) -> float:
        return x / self.invocations * scale if self.invocations else math.nan


def _waste_pct(o: AppOutcome) -> float:
    return (o.reserved_mbs / o.used_mbs - 1.0) * 100.0 if o.used_mbs else math.nan


@register(
    "bulkx-sizing",
    "BulkX §2.3/Fig. 7: memory waste, kills, scale-up steps and cluster throughput of "
    "(init, step) sizing vs fixed-at-max and fixed-at-p99 on the 990 Azure 2019 apps",
    full_params=FULL_PARAMS,
    quick_params=QUICK_PARAMS,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    p = {**FULL_PARAMS, **params}
    specs = policies(p)
    apps = pick_apps(load_apps(), p["apps"])
    kill_fraction = float(p["kill_fraction"])
    window_s = float(p["window_min"]) * 60.0
    history_cap = int(p["history_cap"])
    sweep = [
        PolicySpec(
            f"bulkx θ={t:g}",
            PolicyKind.BULKX,
            float(p["cost_factor"]),
            float(t),
            0.0,
            float(p["granularity_mb"]),
        )
        for t in p["threshold_sweep"]
    ]

    totals = {s.name: Totals() for s in [*specs, *sweep]}
    per_app_waste: dict[str, list[float]] = {s.name: [] for s in specs}
    scored: list[tuple[AppTrace, dict[str, Sizing | None]]] = []
    skipped = 0
    for i, app in enumerate(apps):
        inv: AppInvocations | None = draw_invocations(
            app,
            int(p["invocation_cap"]),
            float(p["train_fraction"]),
            np.random.default_rng([seed, i]),
        )
        if inv is None:
            skipped += 1
            continue
        sizings: dict[str, Sizing | None] = {}
        for spec in [*specs, *sweep]:
            out = evaluate(
                inv,
                spec,
                kill_fraction=kill_fraction,
                window_s=window_s,
                history_cap=history_cap,
            )
            totals[spec.name].add(out, inv.weight)
            if spec.name in per_app_waste:
                per_app_waste[spec.name].append(_waste_pct(out))
                sizings[spec.name] = out.sizing
        scored.append((app, sizings))

    # capacity: one workload drawn from the scored apps, every policy on it
    cap_apps = [a for a, _ in scored]
    stream = draw_stream(cap_apps, int(p["arrivals"]), np.random.default_rng([seed, 10**6]))
    capacity = {}
    for spec in specs:
        plans = [
            reservation(
                it.demand_mb,
                it.exec_s,
                spec.kind,
                cap_apps[it.app],
                scored[it.app][1][spec.name],
                kill_fraction,
            )
            for it in stream
        ]
        capacity[spec.name] = sustained_rate(
            plans,
            stream,
            servers=int(p["servers"]),
            server_mb=float(p["server_mb"]),
            kill_fraction=kill_fraction,
            warmup_fraction=float(p["warmup_fraction"]),
            max_reject=float(p["max_reject"]),
            iterations=int(p["bisection_iterations"]),
        )
    base = capacity[FIXED_MAX]

    rows: list[dict[str, Any]] = []
    for spec in [*specs, *sweep]:
        t = totals[spec.name]
        row: dict[str, Any] = {
            "policy": spec.name,
            "memory_waste_pct": t.waste_pct,
            "kills_per_1k": t.per(t.kills, 1000.0),
            "scale_steps_per_invocation": t.per(t.steps),
            "grown_pct": t.per(t.grown, 100.0),
            "waste_threshold": spec.waste_threshold if spec.sized else math.nan,
            "step_cost_mb": spec.step_cost_mb if spec.sized else math.nan,
            "solves": t.solves,
            "simulated_invocations": t.simulated,
        }
        if spec.name in capacity:
            c = capacity[spec.name]
            row |= {
                "app_median_waste_pct": float(np.nanmedian(per_app_waste[spec.name])),
                "sustained_rate_per_s": c.sustained_rate_per_s,
                "throughput_gain_vs_fixed_max_pct": (
                    c.sustained_rate_per_s / base.sustained_rate_per_s - 1.0
                )
                * 100.0,
                "fluid_rate_per_s": c.fluid_rate_per_s,
                "throughput_gain_fluid_pct": (c.fluid_rate_per_s / base.fluid_rate_per_s - 1.0)
                * 100.0,
                "reject_pct_at_sustained": c.at_sustained.reject_share * 100.0,
                "moves_per_1k": c.at_sustained.moves / c.at_sustained.arrivals * 1000.0
                if c.at_sustained.arrivals
                else 0.0,
                "capacity_runs": c.runs,
            }
        rows.append(row)
    by = {r["policy"]: r for r in rows}
    main = [s.name for s in specs]

    def col(key: str) -> dict[str, Any]:
        return {n: by[n][key] for n in main}

    ratio = by["bulkx"]["memory_waste_pct"] / by[FIXED_MAX]["memory_waste_pct"]
    summary: dict[str, Any] = {
        "memory_waste_pct": col("memory_waste_pct"),
        "kills_per_1k": col("kills_per_1k"),
        "scale_steps_per_invocation": col("scale_steps_per_invocation"),
        "grown_pct": col("grown_pct"),
        "throughput_gain_vs_fixed_max_pct": col("throughput_gain_vs_fixed_max_pct"),
        "throughput_gain_fluid_pct": col("throughput_gain_fluid_pct"),
        "sustained_rate_per_s": col("sustained_rate_per_s"),
        "moves_per_1k": col("moves_per_1k"),
        "app_median_waste_pct": col("app_median_waste_pct"),
        "waste_threshold_sweep": {
            s.name: {
                "memory_waste_pct": by[s.name]["memory_waste_pct"],
                "scale_steps_per_invocation": by[s.name]["scale_steps_per_invocation"],
            }
            for s in sweep
        },
        "bulkx_waste_over_fixed_max": ratio,
        "done_when": {
            "bulkx_waste_at_most_half_fixed_max": bool(ratio <= TARGET_WASTE_RATIO),
            "bulkx_kills_zero": bool(by["bulkx"]["kills_per_1k"] == 0),
        },
        "paper_throughput_gain_pct": "33-90 (BulkX vs OpenWhisk, Fig. 7)",
        "apps_scored": len(scored),
        "apps_skipped_fewer_than_2_invocations": skipped,
        "real_invocations_scored": totals[FIXED_MAX].invocations,
        "simulated_invocations_scored": totals[FIXED_MAX].simulated,
        "capacity_memory_gb": int(p["servers"]) * float(p["server_mb"]) / 1024.0,
    }

    def plot(result: ExperimentResult, folder: Path) -> Path:
        groups = {
            n: {
                "memory waste %": by[n]["memory_waste_pct"],
                "throughput gain vs fixed-max %": by[n]["throughput_gain_vs_fixed_max_pct"],
                "kills per 1k": by[n]["kills_per_1k"],
            }
            for n in main
        }
        return bar_plot(
            folder,
            "bulkx_sizing.png",
            groups,
            title=f"bulkx-sizing: {len(scored)} Azure 2019 apps",
            ylabel="%  /  per 1,000",
        )

    return ExperimentResult(
        experiment="bulkx-sizing",
        seed=seed,
        params=p,
        rows=rows,
        summary=summary,
        plots=[plot],
        table_columns=[
            "policy",
            "memory_waste_pct",
            "kills_per_1k",
            "scale_steps_per_invocation",
            "grown_pct",
            "throughput_gain_vs_fixed_max_pct",
            "throughput_gain_fluid_pct",
            "app_median_waste_pct",
        ],
    )
