"""``fikit-overhead``: one service alone — FIKIT's sharing and measurement phases vs base.

Paper 002 §4.3-4.4, Fig. 14/15: an inference service runs ``tasks`` tasks back to back alone on
the device, three times: *base* (default mode, no interception), FIKIT's *sharing phase* (its
profile loaded: every launch intercepted, identified and published to the scheduler; as the
only and highest-priority service it is never held) and FIKIT's *measurement phase* (every
kernel timed with CUDA events and named from a symbolised backtrace; the host waits for each
kernel). ``sharing_overhead_pct`` / ``measuring_overhead_pct`` = mean JCT ÷ base − 1, in %.

The per-kernel costs are modelled explicitly (``sim.kernels.stream.HookCosts``, which says where
each number comes from): 2 µs per launch in the sharing phase, 40 µs per kernel in the
measurement phase. They are inputs, not results: what the experiment shows is how they add up
for each model's launch count and gap structure (and, for ``inference_host = "async"``, how the
measurement phase's synchronisation removes the overlap of host and device). Paper: 0.09-4.93 %
(sharing) and 34.52-71.78 % (measurement).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gshare.experiments.fikit_common import COMMON_PARAMS, PAPER, Bench, bar_plot, short, spread
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.sim.kernels.scenario import Arrivals, Mode, Service, measure_profile, run_scenario

FULL: dict[str, Any] = {
    **COMMON_PARAMS,
    "models": ["resnet50_4_fwd", "resnet101_4_fwd", "mobilenetv2_4_fwd"],
    "tasks": 200,
}
QUICK: dict[str, Any] = {"models": ["mobilenetv2_4_fwd"], "tasks": 10, "measure_runs": 3}


@register(
    "fikit-overhead",
    "FIKIT Fig. 14/15: one service alone, FIKIT sharing phase and measurement phase vs base "
    "(FIKIT §4.3-4.4)",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    bench = Bench(params, seed)
    n = int(params["tasks"])
    rows: list[dict[str, Any]] = []
    for name in params["models"]:
        model = bench.model(name)
        svc = [Service("A", model, 9, Arrivals.closed_loop(n))]
        kw = bench.run_kwargs()
        base = run_scenario(svc, Mode.SHARING, horizon_ms=float("inf"), **kw)
        share = run_scenario(
            svc, Mode.FIKIT, horizon_ms=float("inf"), profiles={"A": bench.profile(name)}, **kw
        )
        _, measured = measure_profile(
            "A", model, n, seed=seed, device=kw["device"], hooks=kw["hooks"], jitter=kw["jitter"]
        )
        b = base.mean_jct_ms("A")
        s = share.mean_jct_ms("A")
        m = measured.mean_jct_ms("A", skip_measured=False)
        rows.append(
            {
                "model": name,
                "label": short(name),
                "kernels": len(model.kernels),
                "alone_ms": model.solo_ms,
                "base_jct_ms": b,
                "sharing_jct_ms": s,
                "measuring_jct_ms": m,
                "sharing_overhead_pct": 100.0 * (s / b - 1.0),
                "measuring_overhead_pct": 100.0 * (m / b - 1.0),
                "tasks": n,
            }
        )
    summary: dict[str, Any] = {
        "sharing_overhead_pct": spread(r["sharing_overhead_pct"] for r in rows),
        "measuring_overhead_pct": spread(r["measuring_overhead_pct"] for r in rows),
        "by_model": {
            r["model"]: {
                "sharing_overhead_pct": r["sharing_overhead_pct"],
                "measuring_overhead_pct": r["measuring_overhead_pct"],
            }
            for r in rows
        },
        "per_kernel_costs_ms": {
            "intercept": float(params["intercept_ms"]),
            "measure": float(params["measure_ms"]),
        },
        "paper": {
            "sharing_overhead_pct": PAPER["sharing_overhead_pct"],
            "measuring_overhead_pct": PAPER["measuring_overhead_pct"],
        },
    }

    def plot(result: ExperimentResult, out: Path) -> Path:
        return bar_plot(
            out,
            "fikit_overhead.png",
            [r["label"] for r in result.rows],
            {
                "sharing phase": [r["sharing_overhead_pct"] for r in result.rows],
                "measurement phase": [r["measuring_overhead_pct"] for r in result.rows],
            },
            title="fikit-overhead (Fig. 14/15): JCT increase over base, one service alone",
            ylabel="JCT overhead (%)",
            hline=5.0,
            hline_label="5 %",
        )

    return ExperimentResult(
        "fikit-overhead",
        seed,
        dict(params),
        rows,
        summary,
        [plot],
        (
            "model",
            "kernels",
            "base_jct_ms",
            "sharing_jct_ms",
            "measuring_jct_ms",
            "sharing_overhead_pct",
            "measuring_overhead_pct",
        ),
    )
