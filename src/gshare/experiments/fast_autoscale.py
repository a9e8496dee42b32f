"""``fast-autoscale`` — FaST-GShare Fig. 12: ResNet-50 under a varying RPS trace, SLO 69 ms.

The cluster controller (``sim.cluster``) runs FaST-GShare's heuristic autoscaler (Algorithm 1)
and Maximal Rectangles placement every second against a varying RPS trace: Poisson arrivals whose
rate ramps linearly between the levels of ``rps_steps`` (one ramp per ``step_s``), as k6's
ramping-arrival-rate stages do (the paper drove its load with k6 but does not publish the
trace, so the levels are ours). The autoscaler's profiles are FaST-Profiler's grid measured in
the simulator (``sim.profiler``: saturating loop, sustainable throughput), so the controller
and the simulated platform agree; the tail-latency SLO filter counts the batch in service
(``count_in_service``). The
same run is repeated with the baseline autoscaler (target utilisation on a fixed full-GPU
config) and with the time-sharing placer, each with interference on (default) and off.

Variants: gshare's default (Algorithm 1 + MRA, interference on, *co-located* profiles: each
configuration profiled on a GPU filled with neighbours, so the autoscaler knows what a packed
instance sustains); the same with FaST-GShare's *solo* profiles (interference on and off — with
interference on, solo profiles overstate packed throughput and the fleet is too small); MRA with
defragmentation; the time-sharing placer; the target-utilisation baseline autoscaler; and
gshare's default autoscaler (``gshare-burst``, ``policy.autoscale.BurstAutoscaler``) on the same
ramp (``autoscale-traces`` compares the autoscalers on real traces).

Summary: ``slo_violation_pct`` and ``mean_gpus`` of the headline variant (the first), plus every
variant under ``variants``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.policy.autoscale import FAST_QUOTA_POINTS_PCT, FAST_SM_POINTS_PCT, candidate_configs
from gshare.policy.control import ControlParams
from gshare.profiles import ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import InterferenceModel
from gshare.sim.profiler import simulated_profile
from gshare.sim.workload import drive_open_loop, ramping_poisson

FULL = {
    "model": "resnet50",
    "slo_ms": 69.0,
    "rps_steps": [50, 100, 200, 300, 400, 300, 200, 100, 50],
    "step_s": 30.0,
    "max_gpus": 16,
    "period_ms": 1000.0,
    "cold_start_ms": 500.0,
    "headroom": 1.5,
    "noise_sigma": 0.05,
    "variants": [
        # [autoscaler, placer, interference, profiles]; the first row is the headline.
        ["fast-heuristic", "mra", True, "colocated"],
        ["fast-heuristic", "mra", True, "solo"],
        ["fast-heuristic", "mra", False, "solo"],
        ["fast-heuristic", "mra-defrag", True, "colocated"],
        ["fast-heuristic", "time-share", True, "colocated"],
        ["target-util", "mra", True, "colocated"],
        ["gshare-burst", "mra", True, "colocated"],
    ],
}
QUICK = {
    "rps_steps": [50, 200, 100],
    "step_s": 6.0,
    "variants": [
        ["fast-heuristic", "mra", True, "colocated"],
        ["fast-heuristic", "mra", False, "solo"],
    ],
}


@functools.lru_cache(maxsize=4)
def _sim_profiles(model: str, colocated: bool) -> ProfileTable:
    """FaST-Profiler's grid (§5.2) profiled in the simulator (see ``sim.profiler``), solo
    (FaST-GShare) or on a GPU filled with neighbours (gshare's interference-aware profiles)."""
    return simulated_profile(
        ProfileTable.shipped_v100(),
        model,
        sm_values=FAST_SM_POINTS_PCT,
        quota_values=FAST_QUOTA_POINTS_PCT,
        batches=(1, 2, 4, 8),
        colocation=InterferenceModel() if colocated else None,
    )


def _run_variant(
    params: Mapping[str, Any],
    seed: int,
    autoscaler: str,
    placer: str,
    interference: bool,
    profiles_kind: str = "colocated",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    profiles = ProfileTable.shipped_v100()
    loop = EventLoop()
    rng = np.random.default_rng(seed)
    cfg = ClusterConfig(
        max_gpus=int(params["max_gpus"]),
        period_ms=float(params["period_ms"]),
        cold_start_ms=float(params["cold_start_ms"]),
        control=ControlParams(headroom=float(params["headroom"])),
        placer=placer,
        autoscaler=autoscaler,
        interference=InterferenceModel(enabled=interference),
        noise_sigma=float(params["noise_sigma"]),
    )
    cluster = SimCluster(loop, profiles, cfg, rng)
    configs = tuple(
        candidate_configs(
            _sim_profiles(params["model"], profiles_kind == "colocated"),
            params["model"],
            float(params["slo_ms"]),
            count_in_service=True,
        )
    )
    cluster.add_function(SimFunction("resnet", params["model"], float(params["slo_ms"]), configs))
    step_ms = float(params["step_s"]) * 1000.0
    stages = [(step_ms, float(r)) for r in params["rps_steps"]]
    horizon = step_ms * len(stages)
    arrivals = ramping_poisson(stages, rng, start_rps=float(params["rps_steps"][0]))
    drive_open_loop(loop, cluster.gateway, "resnet", arrivals)
    cluster.start(until_ms=horizon)
    loop.run(until_ms=horizon)
    loop.run()  # drain what is still queued (nothing accepted is dropped)
    s = cluster.log.summary("resnet")
    stats = cluster.gpu_stats()
    row = {
        "autoscaler": autoscaler,
        "placer": placer,
        "interference": interference,
        "profiles": profiles_kind,
        "requests": s["requests"],
        "slo_violation_pct": s["slo_violation_pct"],
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "mean_gpus": cluster.mean_gpus(),
        "max_gpus_used": max((r["gpus_used"] for r in cluster.timeline), default=0),
        "gpu_util_mean": float(np.mean([st.utilisation for st in stats.values()]))
        if stats
        else 0.0,
    }
    return row, cluster.timeline


def _label(row: Mapping[str, Any]) -> str:
    intf = "intf" if row["interference"] else "no-intf"
    return f"{row['autoscaler']}/{row['placer']}/{intf}/{row['profiles']}-profiles"


@register(
    "fast-autoscale",
    "FaST-GShare Fig. 12: ResNet-50 autoscaling under a varying RPS trace, SLO 69 ms",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    rows = []
    timelines: dict[str, list[dict[str, Any]]] = {}
    for autoscaler, placer, interference, kind in params["variants"]:
        row, tl = _run_variant(params, seed, autoscaler, placer, bool(interference), kind)
        rows.append(row)
        timelines[_label(row)] = tl
    main = rows[0]
    summary = {
        "slo_violation_pct": main["slo_violation_pct"],
        "mean_gpus": main["mean_gpus"],
        "p99_ms": main["p99_ms"],
        "headline": _label(main),
        "variants": {
            _label(r): {"slo_violation_pct": r["slo_violation_pct"], "mean_gpus": r["mean_gpus"]}
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
        ax2.step(
            t, [r["instances"] for r in tl], where="post", color="tab:green", label="instances"
        )
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
