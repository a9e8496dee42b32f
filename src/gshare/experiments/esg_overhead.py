"""``esg-overhead`` — ESG §5.3-5.4: scheduling overhead of ESG_1Q (Fig. 10), A* vs brute force
with 256 configurations per function at group sizes g = 3 and 4, and the sensitivity to K
(Fig. 11).

1. Decision time in simulation: ESG (``pareto=True``, g = 3, K = 5, the 448-configuration grid)
   runs the three settings as in ``esg-endtoend``; the wall-clock time of every ``plan_stage``
   call (ESG_1Q with its SLO split) is measured (``time.perf_counter``) →
   ``esg_decision_ms_mean[setting]`` (target <= 10 ms), with its p50/p95/max and a box plot.
2. Search cost with 256 configurations per function (``ConfigGrid.esg_256()``: batch {1, 2, 4,
   8} x vCPUs 1..16 x vGPUs {1, 2, 4, 7}): for every application and SLO level, the first SLO
   group of a fresh request (g = 3: the three stages of the 3-stage applications and the first
   three of the 5-stage one; g = 4: the first four stages of the 5-stage one) with the group's
   target from the dominator-based split, searched by
   * ``esg_1q`` literal (``pareto=False``, Appendix B as written) and with Pareto pruning
     (``pareto=True``, what the simulator's ESG uses) — median of ``astar_repeats`` runs;
   * a plain-Python brute force (``python_brute_force``: every path enumerated, prefix sums
     shared, the K best kept in a heap — the paper's kind of enumeration, 7,258 ms at 256
     configurations); at g = 4 (256^4 = 4.3e9 paths) it is timed on the paths of the first
     ``python_g4_heads`` first-stage options and extrapolated linearly (marked);
   * part 1's numpy-vectorised brute force (``astar.brute_force``), a stronger reference.
   ``speedup_vs_bruteforce_g3`` = total plain-Python time / total A* (pareto) time over the
   g = 3 cases; ``speedup_vs_numpy_bruteforce_g3`` the same against numpy; ``_literal``
   variants use the literal A*. ``astar_equals_bruteforce`` is true when, in every case, both
   A* variants found the same optimal cost as every brute force run on it.
3. K sensitivity (Fig. 11): ESG with K in ``k_values`` in strict-light (the paper's setting)
   and relaxed-heavy (where invokers are busy, so the K-1 alternatives matter); hit rate, cost
   normalised to K = 5, mean decision time → ``k_sensitivity[setting][K]``.

Decision times are wall-clock on this machine (shared cores: expect jitter); the brute-force
comparisons run sequentially after the simulations.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.esg_common import cell_rows, grouped_bars, run_cells
from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.policy.workflow.astar import Infeasible, brute_force, esg_1q, fits_target
from gshare.policy.workflow.replan import plan_remaining
from gshare.workflows.catalogue import APPLICATION_CHAINS, application
from gshare.workflows.config import ConfigGrid, ConfigOption
from gshare.workflows.perf import PerfModel

FULL: dict[str, Any] = {
    "settings": ["strict-light", "moderate-normal", "relaxed-heavy"],
    "warmup_s": 5.0,
    "measure_s": 25.0,
    "drain_s": 120.0,
    "initial_warm_per_pool": 5,
    "workers": 2,
    "k_values": [1, 5, 10, 20, 40, 80],
    "k_settings": ["strict-light", "relaxed-heavy"],
    "slo_levels": ["strict", "moderate", "relaxed"],
    "grid": "esg_256",
    "g3_apps": list(APPLICATION_CHAINS),
    "python_bruteforce": True,
    "python_g4_heads": 1,
    "numpy_g4": True,
    "astar_repeats": 5,
}
QUICK: dict[str, Any] = {
    "warmup_s": 1.0,
    "measure_s": 2.0,
    "drain_s": 60.0,
    "workers": 1,
    "k_values": [1, 5],
    "k_settings": ["strict-light"],
    "slo_levels": ["moderate"],
    "grid": "small",
    "g3_apps": ["image-classification"],
    "python_g4_heads": 1,
    "astar_repeats": 2,
}
SMALL_GRID = ConfigGrid(batches=(1, 2, 4, 8), vcpus=(1, 2, 4, 8), vgpus=(1, 2))
"""32 configurations per function: the quick mode's search space."""


# -- plain-Python brute force ---------------------------------------------------------------------


def python_brute_force(
    options: Sequence[Sequence[ConfigOption]],
    target_ms: float,
    *,
    k_best: int = 5,
    first_heads: int | None = None,
) -> tuple[float | None, int]:
    """Plain-Python exhaustive search with ``esg_1q``'s objective and constraint: every path is
    enumerated (prefix sums over the first stages shared, an inner loop over the last stage)
    and the ``k_best`` cheapest feasible ones are kept in a heap. Returns ``(cheapest cost or
    None, paths evaluated)``. ``first_heads`` restricts the first stage to its first options
    (time order) — for timing a fraction of a space too large to enumerate."""
    lists = [sorted(o, key=lambda x: (x.time_ms, x.cost_usd, x.config)) for o in options]
    if first_heads is not None:
        lists[0] = lists[0][:first_heads]
    times = [[o.time_ms for o in lst] for lst in lists]
    costs = [[o.cost_usd for o in lst] for lst in lists]
    last = list(zip(times[-1], costs[-1], strict=True))
    best: list[tuple[float, float]] = []  # max-heap by cost: (-cost, -time)
    kth = math.inf
    evaluated = 0
    heads = itertools.product(*(range(len(t)) for t in times[:-1])) if len(lists) > 1 else [()]
    for head in heads:
        t_head = c_head = 0.0
        for j, i in enumerate(head):
            t_head += times[j][i]
            c_head += costs[j][i]
        evaluated += len(last)
        for t_last, c_last in last:
            t = t_head + t_last
            if fits_target(t, target_ms):
                c = c_head + c_last
                if len(best) < k_best:
                    heapq.heappush(best, (-c, -t))
                    if len(best) == k_best:
                        kth = -best[0][0]
                elif c < kth:
                    heapq.heapreplace(best, (-c, -t))
                    kth = -best[0][0]
    if not best:
        return None, evaluated
    return min(-c for c, _ in best), evaluated


# -- search cases --------------------------------------------------------------------------------


def search_cases(
    grid: ConfigGrid, slo_levels: Sequence[str], g3_apps: Sequence[str]
) -> list[dict[str, Any]]:
    """The (application, SLO level, g) cases of part 2 (module doc): the first SLO group of a
    fresh request and its target."""
    perf = PerfModel.default()
    cases: list[dict[str, Any]] = []
    for g in (3, 4):
        apps = (
            g3_apps
            if g == 3
            else [a for a in APPLICATION_CHAINS if len(APPLICATION_CHAINS[a]) >= 4]
        )
        for app in apps:
            for level in slo_levels:
                wf = application(app, level)  # type: ignore[arg-type]
                opts = {s.function: perf.options(s.function, grid) for s in wf.stages}
                rp = plan_remaining(
                    wf,
                    (),
                    0.0,
                    0.0,
                    options=opts,
                    max_group_size=g,
                    for_stages=(wf.stages[0].name,),
                )
                gp = rp.groups[0]
                if len(gp.group.stages) != g:
                    continue
                lists = [opts[wf.function_of(s)] for s in gp.group.stages]
                cases.append(
                    {
                        "g": g,
                        "application": app,
                        "slo_level": level,
                        "stages": gp.group.stages,
                        "target_ms": gp.target_ms,
                        "lists": lists,
                    }
                )
    return cases


def _timed(fn: Any, repeats: int) -> tuple[Any, float]:
    out = None
    ms = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        ms.append((time.perf_counter() - t0) * 1000.0)
    return out, statistics.median(ms)


def _cost(res: Any) -> float | None:
    return None if isinstance(res, Infeasible) else float(res.best.cost_usd)


def run_search_case(case: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Time the A* variants and the brute forces on one case (module doc, part 2)."""
    lists, target, g = case["lists"], case["target_ms"], case["g"]
    reps = int(params["astar_repeats"])
    lit, lit_ms = _timed(lambda: esg_1q(lists, target, pareto=False), reps)
    par, par_ms = _timed(lambda: esg_1q(lists, target, pareto=True), reps)
    row: dict[str, Any] = {
        "g": g,
        "application": case["application"],
        "slo_level": case["slo_level"],
        "stages": " ".join(case["stages"]),
        "configs_per_function": len(lists[0]),
        "paths": math.prod(len(x) for x in lists),
        "target_ms": target,
        "astar_literal_ms": lit_ms,
        "astar_pareto_ms": par_ms,
        "astar_literal_generated": 0 if isinstance(lit, Infeasible) else lit.stats.generated,
        "cost_astar_literal": _cost(lit),
        "cost_astar_pareto": _cost(par),
    }
    costs = [row["cost_astar_literal"], row["cost_astar_pareto"]]
    if g == 3 or params.get("numpy_g4", True):
        npr, np_ms = _timed(lambda: brute_force(lists, target), 1)
        row["numpy_bruteforce_ms"] = np_ms
        row["cost_numpy_bruteforce"] = _cost(npr)
        costs.append(row["cost_numpy_bruteforce"])
    if params.get("python_bruteforce", True):
        if g == 3:
            t0 = time.perf_counter()
            c, n = python_brute_force(lists, target)
            row["python_bruteforce_ms"] = (time.perf_counter() - t0) * 1000.0
            row["python_bruteforce_extrapolated"] = False
            row["cost_python_bruteforce"] = c
            costs.append(c)
        else:
            heads = int(params["python_g4_heads"])
            t0 = time.perf_counter()
            _, n = python_brute_force(lists, target, first_heads=heads)
            part_ms = (time.perf_counter() - t0) * 1000.0
            row["python_bruteforce_ms"] = part_ms * row["paths"] / n
            row["python_bruteforce_extrapolated"] = True
    row["same_optimum"] = _same(costs)
    return row


def _same(costs: Sequence[float | None]) -> bool:
    if any(c is None for c in costs):
        return all(c is None for c in costs)
    vals = [float(c) for c in costs if c is not None]
    return max(vals) - min(vals) <= 1e-9 * max(1e-12, abs(min(vals)))


def _ratio(rows: Sequence[Mapping[str, Any]], num: str, den: str) -> float:
    rs = [r for r in rows if r.get(num) is not None and r.get(den) is not None]
    if not rs:
        return float("nan")
    return float(sum(r[num] for r in rs) / sum(r[den] for r in rs))


# -- the experiment -------------------------------------------------------------------------------


@register(
    "esg-overhead",
    "ESG §5.3-5.4: ESG_1Q decision time per setting, A* vs brute force at 256 configs "
    "(g = 3, 4), K = 1..80",
    FULL,
    QUICK,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    cell_params = {
        k: params[k] for k in ("warmup_s", "measure_s", "drain_s", "initial_warm_per_pool")
    }
    jobs: list[tuple[str, str, Mapping[str, Any], int, Mapping[str, Any]]] = []
    for st in params["settings"]:
        jobs.append((st, "esg", cell_params, seed, {}))
    for st in params["k_settings"]:
        for k in params["k_values"]:
            jobs.append(
                (
                    st,
                    "esg",
                    cell_params,
                    seed,
                    {"policy_kwargs": {"k_best": int(k)}, "label": f"esg-k{k}"},
                )
            )
    cells = run_cells(jobs, int(params["workers"]))
    n_set = len(params["settings"])
    sim_cells, k_cells = cells[:n_set], cells[n_set:]

    rows: list[dict[str, Any]] = []
    decision: dict[str, dict[str, float]] = {}
    dist: dict[str, list[float]] = {}
    for cell in sim_cells:
        d = cell["decision"]
        decision[cell["setting"]] = {
            k: d[k]
            for k in ("plan_calls", "plan_ms_mean", "plan_ms_p50", "plan_ms_p95", "plan_ms_max")
        }
        dist[cell["setting"]] = cell["plan_ms"]
        for r in cell_rows(cell, {"part": "decision_time"}):
            if r["application"] == "all":
                rows.append(r)

    k_rows = []
    k_jobs = [(st, k) for st in params["k_settings"] for k in params["k_values"]]
    for (_st, k), cell in zip(k_jobs, k_cells, strict=True):
        r = cell_rows(cell, {"part": "k_sensitivity", "k": int(k)})[0]
        k_rows.append(r)
    for st in params["k_settings"]:
        ref = next(
            (r["cost_per_request_usd"] for r in k_rows if r["k"] == 5 and r["setting"] == st), None
        )
        for r in k_rows:
            if r["setting"] == st:
                r["cost_normalized_k5"] = r["cost_per_request_usd"] / ref if ref else float("nan")
    rows.extend(k_rows)

    grid = ConfigGrid.esg_256() if params["grid"] == "esg_256" else SMALL_GRID
    search_rows = [
        dict(run_search_case(c, params), part="search")
        for c in search_cases(grid, params["slo_levels"], params["g3_apps"])
    ]
    rows.extend(search_rows)
    g3 = [r for r in search_rows if r["g"] == 3]
    g4 = [r for r in search_rows if r["g"] == 4]

    def mean_of(rs: Sequence[Mapping[str, Any]], key: str) -> float:
        vals = [float(r[key]) for r in rs if r.get(key) is not None]
        return float(np.mean(vals)) if vals else float("nan")

    summary: dict[str, Any] = {
        "esg_decision_ms_mean": {st: v["plan_ms_mean"] for st, v in decision.items()},
        "esg_decision_ms": decision,
        "esg_decision_under_10ms": all(v["plan_ms_mean"] <= 10.0 for v in decision.values()),
        "configs_per_function": len(grid),
        "speedup_vs_bruteforce_g3": _ratio(g3, "python_bruteforce_ms", "astar_pareto_ms"),
        "speedup_vs_bruteforce_g3_literal": _ratio(g3, "python_bruteforce_ms", "astar_literal_ms"),
        "speedup_vs_numpy_bruteforce_g3": _ratio(g3, "numpy_bruteforce_ms", "astar_pareto_ms"),
        "speedup_vs_numpy_bruteforce_g3_literal": _ratio(
            g3, "numpy_bruteforce_ms", "astar_literal_ms"
        ),
        "speedup_vs_bruteforce_g4_extrapolated": _ratio(
            g4, "python_bruteforce_ms", "astar_pareto_ms"
        ),
        "speedup_vs_numpy_bruteforce_g4": _ratio(g4, "numpy_bruteforce_ms", "astar_pareto_ms"),
        "bruteforce_python_ms_mean": {
            "g3": mean_of(g3, "python_bruteforce_ms"),
            "g4_extrapolated": mean_of(g4, "python_bruteforce_ms"),
        },
        "bruteforce_numpy_ms_mean": {
            "g3": mean_of(g3, "numpy_bruteforce_ms"),
            "g4": mean_of(g4, "numpy_bruteforce_ms"),
        },
        "astar_literal_ms_mean": {
            "g3": mean_of(g3, "astar_literal_ms"),
            "g4": mean_of(g4, "astar_literal_ms"),
        },
        "astar_pareto_ms_mean": {
            "g3": mean_of(g3, "astar_pareto_ms"),
            "g4": mean_of(g4, "astar_pareto_ms"),
        },
        "astar_equals_bruteforce": bool(search_rows)
        and all(r["same_optimum"] for r in search_rows),
        "search_cases": {"g3": len(g3), "g4": len(g4)},
        "k_sensitivity": {
            st: {
                str(r["k"]): {
                    "slo_hit_rate": r["slo_hit_rate"],
                    "cost_normalized_k5": r["cost_normalized_k5"],
                    "decision_ms_mean": r["plan_ms_mean"],
                    "p95_ms": r["p95_ms"],
                    "no_invoker": r["no_invoker"],
                }
                for r in k_rows
                if r["setting"] == st
            }
            for st in params["k_settings"]
        },
    }

    def fig10(result: ExperimentResult, folder: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        names = list(dist)
        ax.boxplot([dist[n] for n in names], showfliers=False, showmeans=True)
        ax.set_xticks(range(1, len(names) + 1))
        ax.set_xticklabels(names)
        ax.set_ylabel("ESG plan_stage wall time (ms)")
        ax.set_title("esg-overhead: decision time per setting (g = 3, K = 5)")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        out = folder / "overhead_decision_time.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    def search_fig(result: ExperimentResult, folder: Path) -> Path:
        groups = {
            f"g={g}": {
                "A* pareto": mean_of([r for r in search_rows if r["g"] == g], "astar_pareto_ms"),
                "A* literal": mean_of([r for r in search_rows if r["g"] == g], "astar_literal_ms"),
                "numpy brute force": mean_of(
                    [r for r in search_rows if r["g"] == g], "numpy_bruteforce_ms"
                ),
                "python brute force": mean_of(
                    [r for r in search_rows if r["g"] == g], "python_bruteforce_ms"
                ),
            }
            for g in (3, 4)
        }
        return grouped_bars(
            folder,
            "overhead_search_ms.png",
            groups,
            title=f"search time, {len(grid)} configs/function (g=4 python: extrapolated)",
            ylabel="ms (log scale)",
            logy=True,
        )

    def k_fig(result: ExperimentResult, folder: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax2 = ax.twinx()
        for st, style in zip(params["k_settings"], ("-", "--", ":"), strict=False):
            rs = [r for r in k_rows if r["setting"] == st]
            ks = [r["k"] for r in rs]
            ax.plot(
                ks,
                [r["plan_ms_mean"] for r in rs],
                "o" + style,
                color="tab:blue",
                label=f"decision ms (mean), {st}",
            )
            ax2.plot(
                ks,
                [r["cost_normalized_k5"] for r in rs],
                "s" + style,
                color="tab:red",
                label=f"cost / cost(K=5), {st}",
            )
            ax2.plot(
                ks,
                [r["slo_hit_rate"] for r in rs],
                "^" + style,
                color="tab:green",
                label=f"SLO hit rate, {st}",
            )
        ax.set_xscale("log")
        ax.set_xlabel("K")
        ax.set_ylabel("ms")
        ax.set_title("esg-overhead: K sensitivity")
        fig.legend(loc="upper left", fontsize=7)
        fig.tight_layout()
        out = folder / "overhead_k.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    return ExperimentResult(
        experiment="esg-overhead",
        seed=seed,
        params=dict(params),
        rows=rows,
        summary=summary,
        plots=[fig10, search_fig, k_fig],
        table_columns=[
            "part",
            "setting",
            "scheduler",
            "k",
            "g",
            "application",
            "slo_level",
            "plan_ms_mean",
            "slo_hit_rate",
            "astar_pareto_ms",
            "astar_literal_ms",
            "numpy_bruteforce_ms",
            "python_bruteforce_ms",
            "same_optimum",
        ],
    )
