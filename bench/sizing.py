"""BulkX sizing solvers at BulkX's scale: the exact specialised solver against the MILP (HiGHS).

BulkX (appendix) sizes 32 resource components from 10,000 candidate demands each and
reports 10-15 ms with OR-Tools. This bench builds 32 components from the real Azure Functions
apps gshare ships (``sim.sizing.pick_apps``: per-app memory percentiles, demands drawn by
inverse-CDF interpolation, the apps' durations as execution times), solves each with
``policy.sizing.solve_sizing`` (exact) and ``solve_sizing_milp`` (the reference MILP on scipy's
HiGHS) in the same run, and checks that both reach the same optimum objective on every
instance (``agree``).

What is measured, exactly:

* ``ms_per_10k_x_32_exact`` — wall time of the exact solver over 32 components × 10,000
  demands (the sum of the 32 solves), the best of ``--repeat`` runs, each history handed over
  as two numpy columns (``policy.sizing.History``, as an OR-Tools model gets its data);
* ``ms_per_10k_x_32_exact_from_objects`` — the same from lists of 10,000 ``Demand`` objects
  each: the solve plus reading 320,000 Python objects into those columns;
* the MILP at full scale: one component of 10,000 demands under a ``--milp-limit-s`` time limit
  (120 s): ``milp_s_10k_one_component`` and ``milp_10k_proved`` (whether HiGHS proved the
  optimum in time); ``ms_per_10k_x_32_milp_at_least`` = 32 × that time when it did not — a
  lower bound, not an extrapolation of a finished solve;
* the agreement check on instances the MILP finishes: the same 32 components with
  ``--milp-demands`` demands each (200 in the full run): ``milp_s_per_component`` and
  ``exact_ms_per_component_small``, and ``agree`` over all of them.

Options: ``--quick`` (4 components, 1,000 and 50 demands), ``--json PATH``, ``--seed N``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from _common import bench_parser, machine_load, print_table, write_json
from gshare.policy.sizing import Demand, History, solve_sizing, solve_sizing_milp
from gshare.sim.sizing import load_apps, pick_apps

COST_FACTOR = 1.0
WASTE_THRESHOLD = 0.1
STEP_COST_MB = 16.0
"""The live controller's settings (``runtime.control.memory``)."""


def histories(n_components: int, n_demands: int, seed: int) -> list[list[Demand]]:
    apps = pick_apps(load_apps(), n_components)
    rng = np.random.default_rng(seed)
    out = []
    for a in apps:
        d = a.demand_mb(rng.uniform(0, 1, n_demands))
        t = a.exec_s(rng.uniform(0, 1, n_demands))
        out.append([Demand(float(x), float(y)) for x, y in zip(d, t, strict=True)])
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--components", type=int, default=32)
    parser.add_argument("--demands", type=int, default=10_000)
    parser.add_argument("--milp-demands", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--milp-limit-s", type=float, default=120.0)
    args = parser.parse_args()
    if args.quick:
        args.components, args.demands, args.milp_demands, args.repeat = 4, 1_000, 50, 2
        args.milp_limit_s = 0.0  # no full-scale MILP in --quick
    kw: dict[str, Any] = {"step_cost_mb": STEP_COST_MB}

    big = histories(args.components, args.demands, args.seed)
    big_cols = [History.of(h) for h in big]
    best_s = best_objects_s = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for c in big_cols:
            solve_sizing(c, COST_FACTOR, WASTE_THRESHOLD, **kw)
        t1 = time.perf_counter()
        for h in big:
            solve_sizing(h, COST_FACTOR, WASTE_THRESHOLD, **kw)
        best_s = min(best_s, t1 - t0)
        best_objects_s = min(best_objects_s, time.perf_counter() - t1)

    full_milp_s: float | None = None
    proved: bool | None = None
    if args.milp_limit_s > 0:
        from gshare.policy.sizing.milp import MilpNotSolved

        t0 = time.perf_counter()
        try:
            m = solve_sizing_milp(
                big[0], COST_FACTOR, WASTE_THRESHOLD, time_limit_s=args.milp_limit_s, **kw
            )
            e = solve_sizing(big[0], COST_FACTOR, WASTE_THRESHOLD, **kw)
            proved = abs(m.objective_mb - e.objective_mb) <= 1e-9 * max(1.0, e.objective_mb)
        except MilpNotSolved:
            proved = False
        full_milp_s = time.perf_counter() - t0

    small = histories(args.components, args.milp_demands, args.seed + 1)
    rows = []
    agree = True
    exact_s = milp_s = 0.0
    for i, h in enumerate(small):
        t0 = time.perf_counter()
        e = solve_sizing(h, COST_FACTOR, WASTE_THRESHOLD, **kw)
        t1 = time.perf_counter()
        m = solve_sizing_milp(h, COST_FACTOR, WASTE_THRESHOLD, **kw)
        t2 = time.perf_counter()
        same = abs(e.objective_mb - m.objective_mb) <= 1e-9 * max(1.0, abs(e.objective_mb))
        agree = agree and same
        exact_s += t1 - t0
        milp_s += t2 - t1
        rows.append(
            {
                "component": i,
                "demands": len(h),
                "exact_ms": round((t1 - t0) * 1000, 3),
                "milp_s": round(t2 - t1, 3),
                "objective_exact_mb": e.objective_mb,
                "objective_milp_mb": m.objective_mb,
                "init_mb": e.init_mb,
                "step_mb": e.step_mb,
                "agree": same,
            }
        )
    n = len(small)
    scale = f"{args.demands // 1000}k_x_{args.components}"
    summary: dict[str, Any] = {
        f"ms_per_{scale}_exact": round(best_s * 1000, 2),
        f"ms_per_{scale}_exact_from_objects": round(best_objects_s * 1000, 2),
        "milp_s_10k_one_component": None if full_milp_s is None else round(full_milp_s, 1),
        "milp_10k_proved": proved,
        f"ms_per_{scale}_milp_at_least": None
        if full_milp_s is None or proved
        else round(full_milp_s * 1000 * args.components),
        "milp_demands": args.milp_demands,
        "milp_s_per_component": round(milp_s / n, 3),
        "exact_ms_per_component_small": round(exact_s / n * 1000, 3),
        "agree": agree,
        "bulkx_reported_ms_per_10k_x_32": "10-15 (OR-Tools)",
        **machine_load(),
    }
    print_table(
        "BulkX sizing solvers",
        ["case", "exact", "MILP (HiGHS)"],
        [
            [
                f"{args.components} x {args.demands} demands",
                f"{best_s * 1000:.1f} ms ({best_objects_s * 1000:.1f} from Demand objects)",
                "—"
                if full_milp_s is None
                else f"1 component: {full_milp_s:.0f} s ({'optimal' if proved else 'no optimum'})",
            ],
            [
                f"{args.components} x {args.milp_demands} demands",
                f"{exact_s * 1000:.1f} ms",
                f"{milp_s:.1f} s (agree: {agree})",
            ],
        ],
    )
    write_json(args.json, summary, rows=rows)


if __name__ == "__main__":
    main()
