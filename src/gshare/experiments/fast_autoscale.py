"""``fast-autoscale`` — FaST-GShare Fig. 12: ResNet-50 under a varying RPS trace, SLO 69 ms.

The cluster controller (``sim.cluster``) runs FaST-GShare's heuristic autoscaler (Algorithm 1)
and Maximal Rectangles placement every second against a step-shaped RPS trace (Poisson arrivals
whose rate rises and falls; the paper does not publish its trace, so the shape is ours). The
same run is repeated with the baseline autoscaler (target utilisation on a fixed full-GPU
config) and with the time-sharing placer, each with interference on (default) and off.

Summary: ``slo_violation_pct`` and ``mean_gpus`` of gshare's default (heuristic + MRA,
interference on), plus every variant in the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.policy.autoscale import candidate_configs
from gshare.profiles import ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import InterferenceModel
from gshare.sim.workload import drive_open_loop, piecewise_poisson

FULL = {
    "model": "resnet50",
    "slo_ms": 69.0,
    "rps_steps": [50, 100, 200, 300, 400, 300, 200, 100, 50],
    "step_s": 30.0,
    "max_gpus": 8,
    "period_ms": 1000.0,
    "cold_start_ms": 500.0,
    "headroom": 1.2,
    "noise_sigma": 0.05,
    "variants": [
        ["fast-heuristic", "mra", True],
        ["fast-heuristic", "mra", False],
        ["target-util", "mra", True],
        ["fast-heuristic", "time-share", True],
    ],
}
QUICK = {"rps_steps": [50, 200, 100], "step_s": 6.0, "variants": [["fast-heuristic", "mra", True]]}


def _run_variant(
    params: Mapping[str, Any], seed: int, autoscaler: str, placer: str, interference: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    profiles = ProfileTable.shipped_v100()
    loop = EventLoop()
    rng = np.random.default_rng(seed)
    cfg = ClusterConfig(
        max_gpus=int(params["max_gpus"]),
        period_ms=float(params["period_ms"]),
        cold_start_ms=float(params["cold_start_ms"]),
        headroom=float(params["headroom"]),
        placer=placer,
        autoscaler=autoscaler,
        interference=InterferenceModel(enabled=interference),
        noise_sigma=float(params["noise_sigma"]),
    )
    cluster = SimCluster(loop, profiles, cfg, rng)
    configs = tuple(candidate_configs(profiles, params["model"], float(params["slo_ms"])))
    cluster.add_function(SimFunction("resnet", params["model"], float(params["slo_ms"]), configs))
    step_ms = float(params["step_s"]) * 1000.0
    segments = [(step_ms, float(r)) for r in params["rps_steps"]]
    horizon = step_ms * len(segments)
    drive_open_loop(loop, cluster.gateway, "resnet", piecewise_poisson(segments, rng))
    cluster.start(until_ms=horizon)
    loop.run(until_ms=horizon)
    loop.run()  # drain what is still queued (nothing accepted is dropped)
    s = cluster.log.summary("resnet")
    stats = cluster.gpu_stats()
    row = {
        "autoscaler": autoscaler,
        "placer": placer,
        "interference": interference,
        "requests": s["requests"],
        "slo_violation_pct": s["slo_violation_pct"],
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "mean_gpus": cluster.mean_gpus(),
        "max_gpus_used": max((r["gpus_used"] for r in cluster.timeline), default=0),
        "gpu_util_mean": float(np.mean([st.utilisation for st in stats.values()])) if stats else 0.0,
    }
    return row, cluster.timeline


@register(
    "fast-autoscale",
    "FaST-GShare Fig. 12: ResNet-50 autoscaling under a varying RPS trace, SLO 69 ms",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    rows = []
    timelines: dict[str, list[dict[str, Any]]] = {}
    for autoscaler, placer, interference in params["variants"]:
        row, tl = _run_variant(params, seed, autoscaler, placer, bool(interference))
        rows.append(row)
        timelines[f"{autoscaler}/{placer}/{'intf' if interference else 'no-intf'}"] = tl
    main = rows[0]
    summary = {
        "slo_violation_pct": main["slo_violation_pct"],
        "mean_gpus": main["mean_gpus"],
        "p99_ms": main["p99_ms"],
        "variants": {
            f"{r['autoscaler']}/{r['placer']}/{'intf' if r['interference'] else 'no-intf'}": {
                "slo_violation_pct": r["slo_violation_pct"],
                "mean_gpus": r["mean_gpus"],
            }
            for r in rows
        },
    }

    def plot(result: ExperimentResult, folder: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        key = next(iter(timelines))
        tl = timelines[key]
        t = [r["t_s"] for r in tl]
        ax.plot(t, [r["observed_rps"] for r in tl], label="observed RPS")
        ax.plot(t, [r["predicted_rps"] for r in tl], label="predicted RPS (x headroom)")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests/s")
        ax2 = ax.twinx()
        ax2.step(t, [r["instances"] for r in tl], where="post", color="tab:green", label="instances")
        ax2.step(t, [r["gpus_used"] for r in tl], where="post", color="tab:red", label="GPUs used")
        ax2.set_ylabel("count")
        ax.set_title(f"fast-autoscale ({key})")
        fig.legend(loc="upper left")
        fig.tight_layout()
        out = folder / "autoscale_timeline.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    return ExperimentResult(
        experiment="fast-autoscale",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=[plot],
    )
