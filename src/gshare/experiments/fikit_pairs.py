"""``fikit-sharing`` and ``fikit-preempt``: high-priority JCT under FIKIT vs default sharing.

* ``fikit-sharing`` — FIKIT §4.5.1, Fig. 16/17: a high-priority service A and a
  low-priority service B run tasks back to back (closed loops) on one device for
  ``horizon_ms``, once under NVIDIA's default sharing and once under FIKIT. Pairs come in two
  sets: ``best-effort`` (A an inference pass, B a training step: the latency-critical function
  beside a best-effort one, the case the issue is about) and ``services`` (A and B both
  inference passes, as in the paper's Table 1 pairs). Each pair also runs with a context switch
  of 0 µs, the setting most favourable to default sharing (``*_switch0`` keys).
* ``fikit-preempt`` — FIKIT §4.5.3, Fig. 19/20: B runs continuously, A issues a task every
  ``period_ms`` (``count`` tasks); A's JCT and B's JCT under both modes.

Summary: ``high_jct_speedup_vs_sharing`` ({min, median, max} over every pair; per set in
``..._by_set``; paper 1.32-16.41 with more than half above 3.4), ``low_jct_ratio_vs_sharing``
(B's JCT under sharing ÷ under FIKIT; paper Fig. 17: mostly below 0.3; Fig. 20: 0.86-1),
``high_jct_fikit_over_alone`` (A's JCT under FIKIT ÷ A alone: what sharing the device with
FIKIT costs A). A B task that has not finished at the horizon counts with its age then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
from gshare.sim.kernels.scenario import Arrivals, Mode, ScenarioResult, Service, run_scenario

TRAIN = ("resnet50_32_fb1", "resnet101_32_fb1", "mobilenetv2_32_fb1", "bert_8_fb1",
         "transformer_xl_8_fb1")  # fmt: skip
BEST_EFFORT_PAIRS = [[h, low] for h in INF for low in TRAIN]
SERVICE_PAIRS = [[h, low] for h in INF for low in INF if h != low]

SHARING_FULL: dict[str, Any] = {
    **COMMON_PARAMS,
    "pair_sets": {"best-effort": BEST_EFFORT_PAIRS, "services": SERVICE_PAIRS},
    "horizon_ms": 5000.0,
    "switch_variants_ms": [0.025, 0.0],
}
SHARING_QUICK: dict[str, Any] = {
    "pair_sets": {
        "best-effort": [["mobilenetv2_4_fwd", "mobilenetv2_32_fb1"]],
        "services": [["mobilenetv2_4_fwd", "resnet50_4_fwd"]],
    },
    "horizon_ms": 300.0,
    "measure_runs": 3,
}

PREEMPT_FULL: dict[str, Any] = {
    **COMMON_PARAMS,
    "pair_sets": {
        "best-effort": [[h, low] for h in INF for low in ("resnet50_32_fb1", "bert_8_fb1")],
        "services": [
            ["resnet50_4_fwd", "mobilenetv2_4_fwd"],
            ["resnet101_4_fwd", "resnet50_4_fwd"],
            ["mobilenetv2_4_fwd", "resnet101_4_fwd"],
        ],
    },
    "period_ms": 1000.0,
    "count": 100,
    "offset_ms": 500.0,
}
PREEMPT_QUICK: dict[str, Any] = {
    "pair_sets": {
        "best-effort": [["mobilenetv2_4_fwd", "mobilenetv2_32_fb1"]],
        "services": [["mobilenetv2_4_fwd", "resnet50_4_fwd"]],
    },
    "period_ms": 100.0,
    "count": 3,
    "offset_ms": 50.0,
    "measure_runs": 3,
}


def _pairs(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (set_name, str(h), str(low))
        for set_name, pairs in params["pair_sets"].items()
        for h, low in pairs
    ]


def _run_pair(
    bench: Bench,
    high: str,
    low: str,
    arrivals: tuple[Arrivals, Arrivals],
    horizon_ms: float,
    switch_ms: float | None = None,
) -> dict[Mode, ScenarioResult]:
    services = [
        Service("A", bench.model(high), HIGH_PRIORITY, arrivals[0]),
        Service("B", bench.model(low), LOW_PRIORITY, arrivals[1]),
    ]
    profiles = {"A": bench.profile(high), "B": bench.profile(low)}
    out: dict[Mode, ScenarioResult] = {}
    for mode in (Mode.SHARING, Mode.FIKIT):
        out[mode] = run_scenario(
            services,
            mode,
            horizon_ms=horizon_ms,
            profiles=profiles,
            **bench.run_kwargs(switch_ms),
        )
    return out


def _row(
    bench: Bench, set_name: str, high: str, low: str, res: dict[Mode, ScenarioResult]
) -> dict[str, Any]:
    sh, fk = res[Mode.SHARING], res[Mode.FIKIT]
    a_sh, na_sh, _ = jct_ms(sh, "A")
    a_fk, na_fk, _ = jct_ms(fk, "A")
    b_sh, nb_sh, ob_sh = jct_ms(sh, "B")
    b_fk, nb_fk, ob_fk = jct_ms(fk, "B")
    view = fk.scheduler
    counters = view.services if view is not None else {}
    a_alone = bench.model(high).solo_ms
    return {
        "set": set_name,
        "pair": pair_label(high, low),
        "high": high,
        "low": low,
        "high_alone_ms": a_alone,
        "high_jct_sharing_ms": a_sh,
        "high_jct_fikit_ms": a_fk,
        "high_jct_speedup_vs_sharing": a_sh / a_fk,
        "high_jct_fikit_over_alone": a_fk / a_alone,
        "low_alone_ms": bench.model(low).solo_ms,
        "low_jct_sharing_ms": b_sh,
        "low_jct_fikit_ms": b_fk,
        "low_jct_ratio_vs_sharing": b_sh / b_fk,
        "high_tasks_sharing": na_sh,
        "high_tasks_fikit": na_fk,
        "low_tasks_sharing": nb_sh,
        "low_tasks_fikit": nb_fk,
        "low_unfinished_sharing": ob_sh,
        "low_unfinished_fikit": ob_fk,
        "fills": counters["B"].counters.fills if "B" in counters else 0,
        "gaps_filled": counters["A"].counters.gaps_filled if "A" in counters else 0,
        "gaps_skipped": counters["A"].counters.gaps_skipped if "A" in counters else 0,
        "device_busy_sharing": sh.device.busy_ms / sh.horizon_ms,
        "device_busy_fikit": fk.device.busy_ms / fk.horizon_ms,
        "switches_sharing": sh.device.switches,
        "switches_fikit": fk.device.switches,
    }


def _summary(rows: list[dict[str, Any]], sfx: str = "") -> dict[str, Any]:
    sets = sorted({r["set"] for r in rows})
    speed = [r["high_jct_speedup_vs_sharing"] for r in rows]
    return {
        f"high_jct_speedup_vs_sharing{sfx}": spread(speed),
        f"high_jct_speedup_vs_sharing_by_set{sfx}": {
            s: spread(r["high_jct_speedup_vs_sharing"] for r in rows if r["set"] == s) for s in sets
        },
        f"pairs_below_1_3{sfx}": [
            r["pair"] for r in rows if r["high_jct_speedup_vs_sharing"] < 1.3
        ],
        f"frac_pairs_above_3_4{sfx}": sum(1 for x in speed if x > 3.4) / len(speed),
        f"low_jct_ratio_vs_sharing{sfx}": spread(r["low_jct_ratio_vs_sharing"] for r in rows),
        f"low_jct_ratio_vs_sharing_by_set{sfx}": {
            s: spread(r["low_jct_ratio_vs_sharing"] for r in rows if r["set"] == s) for s in sets
        },
        f"high_jct_fikit_over_alone{sfx}": spread(r["high_jct_fikit_over_alone"] for r in rows),
    }


def _plots(name: str, head: str) -> list[Any]:
    def speedups(result: ExperimentResult, out: Path) -> Path:
        rows = [r for r in result.rows if r.get("switch_ms", 0.025) == result.params["switch_ms"]]
        return bar_plot(
            out,
            f"{name}_high_speedup.png",
            [r["pair"] for r in rows],
            {"A: JCT sharing / FIKIT": [r["high_jct_speedup_vs_sharing"] for r in rows]},
            title=f"{head}: high-priority JCT speedup of FIKIT over default sharing",
            ylabel="speedup (log)",
            logy=True,
            hline=3.4,
            hline_label="paper: more than half above 3.4",
        )

    def low(result: ExperimentResult, out: Path) -> Path:
        rows = [r for r in result.rows if r.get("switch_ms", 0.025) == result.params["switch_ms"]]
        return bar_plot(
            out,
            f"{name}_low_ratio.png",
            [r["pair"] for r in rows],
            {"B: JCT sharing / FIKIT": [r["low_jct_ratio_vs_sharing"] for r in rows]},
            title=f"{head}: low-priority JCT, sharing / FIKIT (< 1: slower under FIKIT)",
            ylabel="ratio (log)",
            logy=True,
            hline=1.0,
        )

    return [speedups, low]


COLUMNS = (
    "set",
    "pair",
    "high_alone_ms",
    "high_jct_sharing_ms",
    "high_jct_fikit_ms",
    "high_jct_speedup_vs_sharing",
    "low_jct_sharing_ms",
    "low_jct_fikit_ms",
    "low_jct_ratio_vs_sharing",
    "low_tasks_fikit",
)


@register(
    "fikit-sharing",
    "FIKIT Fig. 16/17: high- and low-priority JCT of service pairs, FIKIT vs default sharing "
    "(FIKIT §4.5.1)",
    SHARING_FULL,
    SHARING_QUICK,
)
def run_sharing(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    bench = Bench(params, seed)
    horizon = float(params["horizon_ms"])
    both = (Arrivals.closed_loop(), Arrivals.closed_loop())
    rows: list[dict[str, Any]] = []
    head_sw = float(params["switch_ms"])
    # the headline's switch cost always runs (the summary's figures are its), then the others
    variants: Sequence[float] = [
        head_sw,
        *(float(v) for v in params.get("switch_variants_ms") or () if float(v) != head_sw),
    ]
    for sw in variants:
        for set_name, high, low in _pairs(params):
            res = _run_pair(bench, high, low, both, horizon, float(sw))
            rows.append({**_row(bench, set_name, high, low, res), "switch_ms": float(sw)})
    head = [r for r in rows if r["switch_ms"] == head_sw]
    summary: dict[str, Any] = {"switch_ms": head_sw, **_summary(head)}
    for sw in variants:
        if float(sw) != head_sw:
            sub = [r for r in rows if r["switch_ms"] == float(sw)]
            summary.update(_summary(sub, f"_switch{float(sw) * 1000:g}us"))
    summary["paper"] = {
        "high_jct_speedup_vs_sharing": PAPER["high_jct_speedup_vs_sharing"],
        "low_jct_ratio_vs_sharing": "Fig. 17: below 0.3 in most pairs",
    }
    return ExperimentResult(
        "fikit-sharing",
        seed,
        dict(params),
        rows,
        summary,
        _plots("fikit_sharing", "fikit-sharing (Fig. 16/17)"),
        COLUMNS,
    )


@register(
    "fikit-preempt",
    "FIKIT Fig. 19/20: B runs continuously, A arrives every second; JCT under FIKIT vs default "
    "sharing (FIKIT §4.5.3)",
    PREEMPT_FULL,
    PREEMPT_QUICK,
)
def run_preempt(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    bench = Bench(params, seed)
    period, count = float(params["period_ms"]), int(params["count"])
    offset = float(params["offset_ms"])
    arrivals = (Arrivals.periodic(period, count, offset), Arrivals.closed_loop())
    # the last A task arrives at offset + (count - 1) x period; leave it a period to finish
    horizon = offset + count * period
    rows = [
        _row(bench, s, h, low, _run_pair(bench, h, low, arrivals, horizon))
        for s, h, low in _pairs(params)
    ]
    summary: dict[str, Any] = {**_summary(rows)}
    summary["unfinished_high_tasks_fikit"] = sum(count - r["high_tasks_fikit"] for r in rows)
    summary["paper"] = {
        "high_jct_speedup_vs_sharing": "Fig. 19: up to 15.77, one pair below 1",
        "low_jct_ratio_vs_sharing": PAPER["low_jct_ratio_vs_sharing_preempt"],
    }
    return ExperimentResult(
        "fikit-preempt",
        seed,
        dict(params),
        rows,
        summary,
        _plots("fikit_preempt", "fikit-preempt (Fig. 19/20)"),
        COLUMNS,
    )
