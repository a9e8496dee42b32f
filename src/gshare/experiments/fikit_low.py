"""``fikit-exclusive`` and ``fikit-stability``: the low-priority task's JCT under FIKIT.

* ``fikit-exclusive`` — FIKIT §4.5.2, Fig. 18: A issues ``r`` tasks and B one task, all at
  time 0 (A's first), for task ratios r = 1, 10, ..., 50. Exclusive mode runs one task at a
  time in arrival order, so B waits for all of A's; FIKIT runs B's kernels in A's gaps. Reported:
  B's JCT under exclusive mode ÷ under FIKIT, per pair and ratio (mean over ``rounds`` seeds).
  Paper: about 1 at 1:1, growing linearly with the ratio.
* ``fikit-stability`` — FIKIT §4.5.4, Table 3: A runs tasks back to back, B issues a task
  every ``period_ms`` (``count`` tasks); FIKIT only. Reported: the coefficient of variation of
  B's JCT per pair (paper: 0.095-0.164 over 10 pairs).

Pairs are inference services (A priority 9, B priority 1), as in the paper: a training step as
B would mostly wait for A's pauses (its long kernels fit no gap; ``fikit-sharing``'s
``best-effort`` pairs show it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.fikit_common import (
    COMMON_PARAMS,
    HIGH_PRIORITY,
    INF,
    LOW_PRIORITY,
    PAPER,
    Bench,
    bar_plot,
    jct_ms,
    pair_label,
    spread,
)
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.sim.kernels.scenario import Arrivals, Mode, Service, run_scenario

EXCLUSIVE_FULL: dict[str, Any] = {
    **COMMON_PARAMS,
    "pairs": [[h, low] for h in INF for low in INF if h != low],
    "task_ratios": [1, 10, 20, 30, 40, 50],
    "rounds": 3,
}
EXCLUSIVE_QUICK: dict[str, Any] = {
    "pairs": [["mobilenetv2_4_fwd", "resnet50_4_fwd"]],
    "task_ratios": [1, 5],
    "rounds": 1,
    "measure_runs": 3,
}

STABILITY_FULL: dict[str, Any] = {
    **COMMON_PARAMS,
    "pairs": [[h, low] for h in INF for low in INF],
    "period_ms": 1000.0,
    "count": 100,
    "offset_ms": 500.0,
}
STABILITY_QUICK: dict[str, Any] = {
    "pairs": [["mobilenetv2_4_fwd", "resnet50_4_fwd"]],
    "period_ms": 150.0,
    "count": 4,
    "offset_ms": 50.0,
    "measure_runs": 3,
}


def _non_decreasing(xs: list[float]) -> bool:
    return all(b >= a - 1e-9 for a, b in zip(xs, xs[1:], strict=False))


@register(
    "fikit-exclusive",
    "FIKIT Fig. 18: low-priority JCT, exclusive mode / FIKIT, at A:B task ratios 1:1 to 50:1 "
    "(FIKIT §4.5.2)",
    EXCLUSIVE_FULL,
    EXCLUSIVE_QUICK,
)
def run_exclusive(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    rows: list[dict[str, Any]] = []
    ratios = [int(r) for r in params["task_ratios"]]
    for high, low in params["pairs"]:
        for ratio in ratios:
            jcts: dict[Mode, list[tuple[float, float]]] = {Mode.EXCLUSIVE: [], Mode.FIKIT: []}
            for rnd in range(int(params["rounds"])):
                bench = Bench(params, seed * 1000 + rnd)
                services = [
                    Service("A", bench.model(high), HIGH_PRIORITY, Arrivals.burst(ratio)),
                    Service("B", bench.model(low), LOW_PRIORITY, Arrivals.burst(1)),
                ]
                profiles = {"A": bench.profile(high), "B": bench.profile(low)}
                for mode in jcts:
                    res = run_scenario(
                        services,
                        mode,
                        horizon_ms=float("inf"),
                        profiles=profiles,
                        **bench.run_kwargs(),
                    )
                    jcts[mode].append((jct_ms(res, "B")[0], jct_ms(res, "A")[0]))
            b_ex = float(np.mean([b for b, _ in jcts[Mode.EXCLUSIVE]]))
            b_fk = float(np.mean([b for b, _ in jcts[Mode.FIKIT]]))
            rows.append(
                {
                    "pair": pair_label(high, low),
                    "high": high,
                    "low": low,
                    "task_ratio": ratio,
                    "high_alone_ms": Bench(params, seed).model(high).solo_ms,
                    "low_alone_ms": Bench(params, seed).model(low).solo_ms,
                    "low_jct_exclusive_ms": b_ex,
                    "low_jct_fikit_ms": b_fk,
                    "low_jct_ratio_exclusive_over_fikit": b_ex / b_fk,
                    "high_jct_exclusive_ms": float(np.mean([a for _, a in jcts[Mode.EXCLUSIVE]])),
                    "high_jct_fikit_ms": float(np.mean([a for _, a in jcts[Mode.FIKIT]])),
                }
            )
    key = "low_jct_ratio_exclusive_over_fikit"
    by_ratio = {
        str(r): float(np.median([x[key] for x in rows if x["task_ratio"] == r])) for r in ratios
    }
    by_pair: dict[str, dict[str, float]] = {}
    for x in rows:
        by_pair.setdefault(x["pair"], {})[str(x["task_ratio"])] = x[key]
    med = list(by_ratio.values())
    summary: dict[str, Any] = {
        "low_jct_ratio_by_task_ratio": by_ratio,
        "low_jct_ratio_by_task_ratio_by_pair": by_pair,
        "ratio_at_1_1": spread(x[key] for x in rows if x["task_ratio"] == ratios[0]),
        "grows_with_task_ratio": _non_decreasing(med) and med[-1] > med[0],
        "pairs_growing": sum(1 for v in by_pair.values() if _non_decreasing(list(v.values()))),
        "paper": "Fig. 18: close to 1 at 1:1, a linear upward trend from 10:1 to 50:1",
    }

    def plot(result: ExperimentResult, out: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for pair, vals in result.summary["low_jct_ratio_by_task_ratio_by_pair"].items():
            xs = [int(k) for k in vals]
            ax.plot(xs, list(vals.values()), marker="o", ms=3, label=pair)
        med_ = result.summary["low_jct_ratio_by_task_ratio"]
        ax.plot([int(k) for k in med_], list(med_.values()), "k--", lw=2, label="median")
        ax.set_xlabel("A:B task ratio (A tasks per B task)")
        ax.set_ylabel("B's JCT, exclusive / FIKIT")
        ax.set_title("fikit-exclusive (Fig. 18)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / "fikit_exclusive.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    return ExperimentResult(
        "fikit-exclusive",
        seed,
        dict(params),
        rows,
        summary,
        [plot],
        (
            "pair",
            "task_ratio",
            "low_jct_exclusive_ms",
            "low_jct_fikit_ms",
            "low_jct_ratio_exclusive_over_fikit",
            "high_jct_fikit_ms",
        ),
    )


@register(
    "fikit-stability",
    "FIKIT Table 3: A runs continuously, B arrives every second; CV of B's JCT under FIKIT "
    "(FIKIT §4.5.4)",
    STABILITY_FULL,
    STABILITY_QUICK,
)
def run_stability(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    bench = Bench(params, seed)
    period, count = float(params["period_ms"]), int(params["count"])
    offset = float(params["offset_ms"])
    horizon = offset + count * period
    rows: list[dict[str, Any]] = []
    timelines: dict[str, list[float]] = {}
    for high, low in params["pairs"]:
        services = [
            Service("A", bench.model(high), HIGH_PRIORITY, Arrivals.closed_loop()),
            Service("B", bench.model(low), LOW_PRIORITY, Arrivals.periodic(period, count, offset)),
        ]
        res = run_scenario(
            services,
            Mode.FIKIT,
            horizon_ms=horizon,
            profiles={"A": bench.profile(high), "B": bench.profile(low)},
            **bench.run_kwargs(),
        )
        jcts = [r.jct_ms for r in res.done("B")]
        mean = float(np.mean(jcts)) if jcts else float("nan")
        std = float(np.std(jcts)) if jcts else float("nan")
        label = pair_label(high, low)
        timelines[label] = jcts
        rows.append(
            {
                "pair": label,
                "high": high,
                "low": low,
                "low_jct_mean_ms": mean,
                "low_jct_std_ms": std,
                "low_jct_cv": std / mean if jcts else float("nan"),
                "low_alone_ms": bench.model(low).solo_ms,
                "low_tasks_done": len(jcts),
                "low_tasks_unfinished": count - len(jcts),
                "high_jct_mean_ms": jct_ms(res, "A")[0],
                "high_alone_ms": bench.model(high).solo_ms,
                "high_tasks": len(res.done("A")),
            }
        )
    summary: dict[str, Any] = {
        "low_jct_cv": {r["pair"]: r["low_jct_cv"] for r in rows},
        "low_jct_cv_spread": spread(r["low_jct_cv"] for r in rows),
        "low_tasks_unfinished": sum(r["low_tasks_unfinished"] for r in rows),
        "paper": {"low_jct_cv": PAPER["low_jct_cv"]},
    }

    def plot_cv(result: ExperimentResult, out: Path) -> Path:
        return bar_plot(
            out,
            "fikit_stability_cv.png",
            [r["pair"] for r in result.rows],
            {"CV of B's JCT": [r["low_jct_cv"] for r in result.rows]},
            title="fikit-stability (Table 3): CV of the low-priority JCT under FIKIT",
            ylabel="coefficient of variation",
            hline=0.164,
            hline_label="paper's largest CV (0.164)",
        )

    def plot_timelines(result: ExperimentResult, out: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for label, js in timelines.items():
            ax.plot(range(len(js)), js, lw=0.8, label=label)
        ax.set_xlabel("B task")
        ax.set_ylabel("B's JCT (ms)")
        ax.set_yscale("log")
        ax.set_title("fikit-stability: low-priority JCT timelines (Fig. 21)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out / "fikit_stability_timelines.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    return ExperimentResult(
        "fikit-stability",
        seed,
        dict(params),
        rows,
        summary,
        [plot_cv, plot_timelines],
        ("pair", "low_jct_mean_ms", "low_jct_cv", "low_tasks_done", "high_jct_mean_ms"),
    )
