"""``fast-spatial`` — FaST-GShare Fig. 10 (§5.3): spatial vs time sharing of one GPU.

1-8 ResNet-50 pods share one simulated V100, each with the full time quota (request = limit =
1.0), in three configurations:

* ``racing`` — every pod on 100 % of the SMs: the token scheduler's SM adapter lets one run at a
  time, i.e. pure time sharing;
* ``sm12`` / ``sm24`` — MPS partitions of 12 % / 24 % of the SMs. As in the paper the sweep allows
  over-subscription: when n x sm > 100 the SM adapter runs only as many pods at once as fit and
  the others wait for a token.

Each (pods, config) runs with interference on (the default ``InterferenceModel``) and off, under
a saturating closed loop (``common.run_saturated``: two outstanding requests per pod, zero think
time) for ``measure_ms`` after ``warmup_ms``. Burst work comes from the shipped V100 table at
quota 100 % (batch 1, Gaussian noise ``noise_sigma``).

Summary (``*_no_interference`` keys: the same with interference off):

* ``throughput_ratio_spatial_vs_time`` — throughput of the *best spatial config that fits one GPU
  without over-subscription* (a partitioned config with pods x sm <= 100, highest throughput;
  named by ``best_spatial_config``) ÷ throughput of *one* racing pod (the most time sharing can
  give, as the paper argues: "the maximum throughput achievable through time sharing is indicated
  by the throughput in a single racing pod"). Paper: 296.8 / 71.37 req/s = 4.16x ("at least
  3.15x").
* ``p99_ms_spatial`` — p99 latency at that best spatial config; ``p99_ms_time`` — p99 of the racing
  config with the *same number of pods* (same offered load: same number of closed-loop users).
* ``throughput_rps_spatial`` / ``throughput_rps_time`` — the two throughputs of the ratio.

* ``starved_pods_time`` — racing pods (of that same count) that never got a token while measured.

Latency percentiles include requests still outstanding at the end (censored at their age; see
``common``): a pod the token scheduler starved would show up as a huge p99 and in
``starved_pods``. With request = limit = 1 every racing pod may use the whole window, so the
window end forgets all usage and the racing pods always tie on missing quota; ``policy.tokens``
gives ties to the client waiting longest (then the lower id), so the racing pods take turns,
none starves, and ``p99_ms_time`` grows about linearly with the number of pods (each waits for
the others' bursts). Throughput is unaffected (the GPU is never idle). (Ties once went by id
alone, which starved the highest ids: ``docs/journal/tokens.md``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gshare.experiments.common import Pod, line_plot, run_saturated
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.profiles import ProfileTable
from gshare.resources import GpuShare

FULL: dict[str, Any] = {
    "model": "resnet50",
    "pods": [1, 2, 3, 4, 5, 6, 7, 8],
    "sm_pcts": [100, 12, 24],
    "interference": [True, False],
    "batch": 1,
    "users_per_pod": 2,
    "warmup_ms": 1000.0,
    "measure_ms": 5000.0,
    "noise_sigma": 0.05,
}
QUICK: dict[str, Any] = {"pods": [1, 4, 8], "warmup_ms": 200.0, "measure_ms": 1000.0}

COLUMNS = (
    "pods",
    "config",
    "interference",
    "throughput_rps",
    "p50_ms",
    "p99_ms",
    "utilisation",
    "sm_occupancy",
    "sm_effective",
    "starved_pods",
)


def _config_name(sm_pct: float) -> str:
    return "racing" if sm_pct >= 100 else f"sm{sm_pct:g}"


def _summary(rows: list[dict[str, Any]], interference: bool) -> dict[str, Any]:
    """The headline figures of one interference setting (module docstring)."""
    mine = [r for r in rows if r["interference"] is interference]
    racing = {r["pods"]: r for r in mine if r["config"] == "racing"}
    fitting = [r for r in mine if r["config"] != "racing" and r["pods"] * r["sm_pct"] <= 100 + 1e-9]
    sfx = "" if interference else "_no_interference"
    if not fitting or 1 not in racing:
        return {f"throughput_ratio_spatial_vs_time{sfx}": float("nan")}
    best = max(fitting, key=lambda r: (r["throughput_rps"], -r["pods"]))
    one = racing[1]
    same = racing.get(best["pods"])
    return {
        f"throughput_ratio_spatial_vs_time{sfx}": best["throughput_rps"] / one["throughput_rps"],
        f"best_spatial_config{sfx}": f"{best['config']} x {best['pods']} pods",
        f"throughput_rps_spatial{sfx}": best["throughput_rps"],
        f"throughput_rps_time{sfx}": one["throughput_rps"],
        f"p99_ms_spatial{sfx}": best["p99_ms"],
        f"p99_ms_time{sfx}": same["p99_ms"] if same else float("nan"),
        f"sm_effective_spatial{sfx}": best["sm_effective"],
        f"sm_effective_time{sfx}": same["sm_effective"] if same else float("nan"),
        f"utilisation_spatial{sfx}": best["utilisation"],
        f"utilisation_time{sfx}": same["utilisation"] if same else float("nan"),
        f"starved_pods_time{sfx}": same["starved_pods"] if same else -1,
    }


@register(
    "fast-spatial",
    "FaST-GShare Fig. 10: 1-8 ResNet-50 pods at 100 % quota, racing vs 12 % / 24 % SM partitions",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    profiles = ProfileTable.shipped_v100()
    model = str(params["model"])
    rows: list[dict[str, Any]] = []
    for interference in params["interference"]:
        for sm_pct in params["sm_pcts"]:
            for n in params["pods"]:
                share = GpuShare(float(sm_pct), 1.0, 1.0)
                pods = [
                    Pod(f"{model}-{i}", "resnet", model, share, int(params["batch"]))
                    for i in range(int(n))
                ]
                r = run_saturated(
                    pods,
                    profiles=profiles,
                    interference=bool(interference),
                    warmup_ms=float(params["warmup_ms"]),
                    measure_ms=float(params["measure_ms"]),
                    users_per_pod=int(params["users_per_pod"]),
                    noise_sigma=float(params["noise_sigma"]),
                    seed=seed,
                )
                rows.append(
                    {
                        "pods": int(n),
                        "config": _config_name(float(sm_pct)),
                        "sm_pct": float(sm_pct),
                        "interference": bool(interference),
                        "oversubscribed": int(n) * float(sm_pct) > 100 + 1e-9
                        and float(sm_pct) < 100,
                        "throughput_rps": r.throughput_rps,
                        "p50_ms": r.p50_ms,
                        "p99_ms": r.p99_ms,
                        "mean_ms": r.mean_ms,
                        "utilisation": r.utilisation,
                        "sm_occupancy": r.sm_occupancy,
                        "sm_effective": r.sm_effective,
                        "starved_pods": r.starved_pods,
                        "stuck_requests": r.stuck_requests,
                    }
                )
    summary: dict[str, Any] = {}
    for interference in (True, False):
        summary.update(_summary(rows, interference))

    def plot_metric(y: str, ylabel: str, filename: str, logy: bool = False) -> Any:
        def plot(result: ExperimentResult, folder: Path) -> Path:
            return line_plot(
                folder,
                filename,
                result.rows,
                x="pods",
                y=y,
                series=("config", "interference"),
                title=f"fast-spatial ({model}): {ylabel} vs pods",
                ylabel=ylabel,
                logy=logy,
            )

        return plot

    return ExperimentResult(
        experiment="fast-spatial",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=[
            plot_metric("throughput_rps", "throughput (req/s)", "throughput.png"),
            plot_metric("p99_ms", "p99 latency (ms, log)", "p99.png", logy=True),
            plot_metric("sm_effective", "effective SM occupancy", "sm_occupancy.png"),
            plot_metric("sm_occupancy", "allocated SM occupancy", "sm_allocated.png"),
            plot_metric("utilisation", "GPU utilisation", "utilisation.png"),
        ],
        table_columns=COLUMNS,
    )
