"""``esg-trace`` — ESG and its four baselines on the four applications driven by the shipped
Azure Functions 2021 sample instead of uniform intervals.

The arrival times are the sample's (``gshare.sim.workload.azure2021``: 199 invocations over 20
minutes, very bursty — the median gap is 12 ms, the 90th percentile 28 s), compressed with
``scale_to_rate`` to each setting's mean rate (light 18.7/s, normal 37.3/s, heavy 74.6/s) and
repeated end to end to fill the run (``sim.workflow.workload.azure2021_arrivals``); every arrival
invokes a random application; the SLO level is the setting's. Everything else is as in
``esg-endtoend`` (same cells, durations, cluster, pre-warming).

Summary (required): ``slo_hit_rate[scheduler]`` and ``cost_normalized[scheduler]`` over the
three settings together (the hit rate of all measured requests pooled; the cost per request of
all of them over ESG's), plus the per-setting tables ``slo_hit_rate_by_setting[setting]
[scheduler]`` and ``cost_normalized_by_setting``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gshare.experiments.esg_endtoend import FULL as ENDTOEND_FULL
from gshare.experiments.esg_endtoend import QUICK as ENDTOEND_QUICK
from gshare.experiments.esg_endtoend import plots, run_grid, summarise_grid
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult

FULL: dict[str, Any] = {**ENDTOEND_FULL, "charged_settings": []}
QUICK: dict[str, Any] = dict(ENDTOEND_QUICK)


@register(
    "esg-trace",
    "ESG vs its baselines with Azure Functions 2021 arrivals scaled to each setting's rate",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    rows, _ = run_grid(params, seed, trace="azure2021")
    have = list(params["schedulers"])
    by_setting = summarise_grid(rows, list(params["settings"]), have)
    overall = [r for r in rows if r["application"] == "all" and not r["decision_time_charged"]]
    hit: dict[str, float] = {}
    usd: dict[str, float] = {}
    for sched in have:
        rs = [r for r in overall if r["scheduler"] == sched]
        n = sum(r["requests"] for r in rs)
        if n == 0:
            continue
        hit[sched] = sum(r["slo_hit_rate"] * r["requests"] for r in rs) / n
        usd[sched] = sum(r["cost_per_request_usd"] * r["requests"] for r in rs) / n
    ref = usd.get("esg")
    summary: dict[str, Any] = {
        "slo_hit_rate": hit,
        "cost_normalized": {s: (c / ref if ref else float("nan")) for s, c in usd.items()},
        "cost_per_request_usd": usd,
        "slo_hit_rate_by_setting": by_setting["slo_hit_rate"],
        "cost_normalized_by_setting": by_setting["cost_normalized"],
        "slo_hit_rate_per_app": by_setting["slo_hit_rate_per_app"],
        "cost_normalized_per_app": by_setting["cost_normalized_per_app"],
        "config_miss_rate": by_setting["config_miss_rate"],
        "requests": {
            s: int(np.sum([r["requests"] for r in overall if r["scheduler"] == s])) for s in have
        },
        "schedulers": have,
    }
    return ExperimentResult(
        experiment="esg-trace",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=plots(by_setting, "trace", "esg-trace (Azure 2021)"),
        table_columns=[
            "setting",
            "scheduler",
            "application",
            "requests",
            "slo_hit_rate",
            "cost_normalized",
            "p95_ms",
            "slo_ms",
        ],
    )
