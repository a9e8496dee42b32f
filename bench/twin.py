"""The digital twin's fidelity: one workflow scenario run live and simulated, in one run.

Usage: ``python bench/twin.py [--quick] [--json PATH] [--scenario FILE] [--duration-s S]``

One scenario file (default ``examples/scenarios/mlp-chain.yaml``: a 3-stage chain of MLP
functions with a 100 ms end-to-end SLO, Poisson arrivals, beside a plain function) and one
seed, so both worlds see the same arrival times:

1. **live, ESG** — a real ``gshare serve --workflow-policy esg``; the scenario's functions are
   deployed and each workflow function is profiled live (``gshare profile``; ``--quick``: a
   short trial per point). Then a **calibration** run: the same scenario with another seed
   (other arrival times at the same load), from which the platform's latency spread (each
   request's latency above the run's median, drawn per simulated request) and two platform
   constants are measured — per
   stage task, the live stage latency beyond the profiled time of the configurations ESG chose
   (``dispatch_ms``: the hop to the instance, the input's decoding, a quota change), and per
   request, the client's latency beyond the server's (``frontend_ms``: the HTTP exchange).
   Then the **evaluation**: ``gshare load`` drives the scenario open loop
   (``experiments.scenario_load``);
2. **simulated, ESG** — ``gshare simulate`` of the same scenario for the same duration, with
   the profiles the live server measured and the two constants (in place of the scenario's
   transfer latencies, which the constants include; ``experiments.scenario_sim``);
3. **live, FaST-GShare** — the server restarted on the same state directory (functions and
   profiles kept) with ``--workflow-policy fast-gshare``, driven by the same arrivals.

Summary: ``slo_hit_rate_live``, ``slo_hit_rate_sim``, ``abs_hit_rate_diff_pp``,
``p50_ratio_sim_over_live``, ``p99_ratio_sim_over_live``, ``esg_vs_fastgshare_hit_rate_live``
(ESG's hit rate minus FaST-GShare's, pp), ``esg_vs_fastgshare_cost_live`` (ESG's cost per
request over FaST-GShare's), the calibrated constants, the per-world figures behind them, and
``done_when`` (docs/DESIGN.md §15: ``abs_hit_rate_diff_pp`` <= 10 and ``p50_ratio_sim_over_live`` in
0.8-1.25).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, machine_load, print_table, write_json
from gshare.experiments.scenario_load import deploy, run_load
from gshare.experiments.scenario_sim import fetch_live_profiles, simulate
from gshare.scenario import load_scenario
from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIO = REPO / "examples" / "scenarios" / "mlp-chain.yaml"
PROFILE_QUOTAS = [25, 50, 75, 100]


def _profile(srv: ServeProcess, names: list[str], batches: list[int], trial_s: float) -> None:
    """``gshare profile`` each function and wait for the rows."""
    c = srv.client()
    for n in names:
        c.start_profile(n, quota_pct=PROFILE_QUOTAS, batch=batches, trial_s=trial_s)

        def done(n: str = n) -> bool:
            st = c.profile_status(n)
            if st.get("state") not in ("running", "done"):
                raise RuntimeError(f"profiling {n} failed: {st}")
            return st.get("state") == "done"

        wait_until(done, 600, f"the profile of {n}")
        print(f"  profiled {n}: {len(c.profile_status(n).get('table', []))} rows", flush=True)


def _workflow_stats(result: Any, name: str) -> dict[str, Any]:
    st: dict[str, Any] = result.summary["workflows"][name]
    return st


def _mean(counters: dict[str, float], name: str, labels: str = "") -> float | None:
    key = f"{{{labels}}}" if labels else ""
    n = counters.get(f"{name}_count{key}")
    return counters[f"{name}_sum{key}"] / n if n else None


def _tasks_by_quota(stats: dict[str, Any]) -> dict[str, float]:
    """A live world's tasks per ``stage@quota%`` (the server's counters over the run)."""
    c = (stats.get("server") or {}).get("counters") or {}
    out = {}
    for k, v in c.items():
        if k.startswith("gshare_workflow_tasks_total{") and v:
            labels = dict(x.split("=", 1) for x in k[k.index("{") + 1 : -1].split(","))
            out[f"{labels['stage']}@{labels['quota_pct']}"] = v
    return dict(sorted(out.items()))


def _decision_ms(stats: dict[str, Any]) -> float | None:
    """A live world's mean decision time per serving attempt (plan + dispatch), ms."""
    c = (stats.get("server") or {}).get("counters") or {}
    m = _mean(c, "gshare_workflow_decision_seconds")
    return m * 1000.0 if m is not None else None


def calibrate(
    stats: dict[str, Any], scenario: Any, wf_name: str, profiles: dict[str, list[Any]]
) -> dict[str, float]:
    """``dispatch_ms`` and ``frontend_ms`` from a calibration run's client and server figures
    (module doc): the mean stage latency (queue + task) minus the profiled time of the quotas
    ESG chose there (weighted by its tasks), averaged over the stages; the client's mean
    latency minus the server's."""
    from gshare.profiles import ProfileTable

    c = stats["server"]["counters"]
    overheads = []
    for st in scenario.workflows[wf_name].stages:
        lat = _mean(c, "gshare_workflow_stage_latency_seconds", f"stage={st.name}")
        spec = scenario.functions[st.function]
        table = ProfileTable(profiles[st.function])
        tasks = {
            float(k.split("quota_pct=")[1].split(",")[0]): v
            for k, v in c.items()
            if k.startswith("gshare_workflow_tasks_total") and f"stage={st.name}" in k and v
        }
        if lat is None or not tasks:
            continue
        sm = spec.resources.sm_pct if spec.resources != "auto" else 50.0
        exec_ms = sum(n * table.latency_ms(st.function, sm, q, 1) for q, n in tasks.items()) / sum(
            tasks.values()
        )
        overheads.append(max(0.0, lat * 1000.0 - exec_ms))
    server_ms = _mean(c, "gshare_workflow_latency_seconds")
    client_ms = stats.get("mean_ms")
    return {
        "dispatch_ms": sum(overheads) / len(overheads) if overheads else 0.0,
        "frontend_ms": max(0.0, client_ms - server_ms * 1000.0)
        if client_ms is not None and server_ms is not None
        else 0.0,
    }


def _answered_ms(result: Any, wf_name: str) -> list[float]:
    return sorted(
        float(r["latency_ms"])
        for r in result.rows
        if r.get("kind") == "workflow" and r.get("name") == wf_name and r.get("status") == "ok"
    )


def _upper_median(sorted_ms: list[float]) -> float:
    return sorted_ms[len(sorted_ms) // 2] if sorted_ms else 0.0


def median_latency_ms(result: Any, wf_name: str) -> float:
    """The run's median answered workflow latency, ms, as ``spread_about_median`` and
    ``match_median`` take it (the upper median; 0.0 without an answered request)."""
    return _upper_median(_answered_ms(result, wf_name))


def spread_about_median(result: Any, wf_name: str) -> list[float]:
    """The calibration run's latency spread: each answered workflow request's latency less the
    run's median, ms (negative for the faster half) — drawn per request by the simulator
    (``WorkflowSimConfig.frontend_jitter_ms``).

    NOTE — both sides of the median. The faster half was once taken as 0, so no simulated
    request was faster than the model's own floor: on a machine where ``mlp-chain-tight``'s
    10-ms SLO lay below its median (13 ms), live runs met it 5.6 and 9.9 % of the time and the
    simulator never (``bench/fidelity.py``, full run). Above the median nothing changed."""
    lat = _answered_ms(result, wf_name)
    med = _upper_median(lat)
    return [x - med for x in lat]


def match_median(
    scenario: Any,
    wf_name: str,
    calib: Any,
    constants: dict[str, float],
    jitter: list[float],
    profiles: dict[str, list[Any]],
    seed: int,
    duration_s: float,
) -> dict[str, float]:
    """``constants`` with ``frontend_ms`` shifted so that the simulated **calibration** run
    (its seed, its duration) has the live calibration run's median workflow latency.

    NOTE — the constants are means (the server's counters hold sums), so a few slow requests of
    the calibration run raise them, and with the spread drawn on top the simulated median came
    out 18 % above the live one on ``mlp-chain-tight`` (``bench/fidelity.py``, full run, load
    2.5), moving its hit rate by 17 pp. The shift is fitted on the calibration run only, never on
    the run it is scored against."""
    live = _answered_ms(calib, wf_name)
    if not live:
        return constants
    sc = with_cluster(scenario, local_latency_ms=0.0, remote_latency_ms=0.0, **constants)
    sim = simulate(sc, duration_s=duration_s, seed=seed, live_profiles=profiles,
                   frontend_jitter_ms=jitter)  # fmt: skip
    p50 = sim.summary["workflows"][wf_name]["p50_ms"]
    if p50 is None:
        return constants
    shift = _upper_median(live) - float(p50)
    return {**constants, "frontend_ms": max(0.0, constants["frontend_ms"] + shift)}


def with_cluster(scenario: Any, **fields: float) -> Any:
    """The scenario with its cluster's fields replaced (the simulator reads them)."""
    doc = scenario.doc.model_copy(update={"cluster": scenario.cluster.model_copy(update=fields)})
    return dataclasses.replace(scenario, doc=doc)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    parser.add_argument("--duration-s", type=float, default=None)
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    duration_s = args.duration_s or (20.0 if args.quick else 60.0)
    calib_s = 10.0 if args.quick else 30.0  # at the scenario's own rate, another seed
    wf_name = next(w.target for w in scenario.workloads if w.kind == "workflow")
    wf_functions = sorted({s.function for s in scenario.workflows[wf_name].stages})
    max_batch = max(scenario.functions[f].batching.max_batch for f in wf_functions)
    batches = [b for b in (1, 2, 4, 8) if b <= max_batch]
    state = Path(tempfile.mkdtemp(prefix="gshare-twin-")) / "state"
    t0 = time.perf_counter()

    print(f"1. live, ESG ({duration_s:g} s of {wf_name})", flush=True)
    with ServeProcess("--workflow-policy", "esg", state_dir=state, cwd=REPO) as srv:
        deploy(srv.client(), scenario)
        _profile(srv, wf_functions, batches, 0.3 if args.quick else 1.0)
        live_profiles = fetch_live_profiles(srv.url, wf_functions, token=srv.token)
        print("  calibration run (the scenario's load, another seed)", flush=True)
        calib = run_load(
            scenario,
            srv.url,
            token=srv.token,
            duration_s=calib_s,
            seed=args.seed + 1000,
        )
        constants = calibrate(_workflow_stats(calib, wf_name), scenario, wf_name, live_profiles)
        jitter = spread_about_median(calib, wf_name)
        if jitter:  # the constants are means; the drawn spread carries the part off the median
            mean_jitter = sum(jitter) / len(jitter)
            constants["frontend_ms"] = max(0.0, constants["frontend_ms"] - mean_jitter)
        constants = match_median(
            scenario, wf_name, calib, constants, jitter, live_profiles, args.seed + 1000, calib_s
        )
        print(f"  calibrated: {constants}, {len(jitter)} jitter samples", flush=True)
        live = run_load(scenario, srv.url, token=srv.token, duration_s=duration_s, seed=args.seed)

    print("2. simulated, ESG", flush=True)
    sim_scenario = with_cluster(scenario, local_latency_ms=0.0, remote_latency_ms=0.0, **constants)
    sim = simulate(
        sim_scenario,
        duration_s=duration_s,
        seed=args.seed,
        live_profiles=live_profiles,
        frontend_jitter_ms=jitter,  # the spread measured above (frontend_ms excludes its mean)
    )

    print("3. live, FaST-GShare (same state: functions and profiles kept)", flush=True)
    with ServeProcess("--workflow-policy", "fast-gshare", state_dir=state, cwd=REPO) as srv:
        fast = run_load(scenario, srv.url, token=srv.token, duration_s=duration_s, seed=args.seed)

    lv, sv, fv = (_workflow_stats(r, wf_name) for r in (live, sim, fast))

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    hl, hs, hf = lv["slo_hit_rate"], sv["slo_hit_rate"], fv["slo_hit_rate"]
    summary: dict[str, Any] = {
        "scenario": str(
            args.scenario.relative_to(REPO) if args.scenario.is_relative_to(REPO) else args.scenario
        ),
        "workflow": wf_name,
        "duration_s": duration_s,
        "requests_live": lv["requests"],
        "requests_sim": sv["requests"],
        "slo_hit_rate_live": hl,
        "slo_hit_rate_sim": hs,
        "abs_hit_rate_diff_pp": abs(hs - hl) * 100.0 if hl is not None and hs is not None else None,
        "p50_ms_live": lv["p50_ms"],
        "p50_ms_sim": sv["p50_ms"],
        "p99_ms_live": lv["p99_ms"],
        "p99_ms_sim": sv["p99_ms"],
        "p50_ratio_sim_over_live": ratio(sv["p50_ms"], lv["p50_ms"]),
        "p99_ratio_sim_over_live": ratio(sv["p99_ms"], lv["p99_ms"]),
        "slo_hit_rate_live_fastgshare": hf,
        "esg_vs_fastgshare_hit_rate_live": (hl - hf) * 100.0
        if hl is not None and hf is not None
        else None,
        "cost_per_request_usd_live": lv.get("cost_per_request_usd"),
        "cost_per_request_usd_sim": sv.get("cost_per_request_usd"),
        "cost_per_request_usd_live_fastgshare": fv.get("cost_per_request_usd"),
        "esg_vs_fastgshare_cost_live": ratio(
            lv.get("cost_per_request_usd"), fv.get("cost_per_request_usd")
        ),
        "dispatch_ms": constants["dispatch_ms"],
        "frontend_ms": constants["frontend_ms"],
        "decision_ms_live": _decision_ms(lv),
        "decision_ms_live_fastgshare": _decision_ms(fv),
        "wall_s": time.perf_counter() - t0,
    }
    d, p50r = summary["abs_hit_rate_diff_pp"], summary["p50_ratio_sim_over_live"]
    summary["done_when"] = bool(
        d is not None and d <= 10 and p50r is not None and 0.8 <= p50r <= 1.25
    )
    summary.update(machine_load())
    rows = [
        {
            "world": w,
            **{
                k: st.get(k)
                for k in (
                    "requests",
                    "answered",
                    "slo_hit_rate",
                    "p50_ms",
                    "p99_ms",
                    "cost_per_request_usd",
                )
            },
            "tasks_by_stage_quota": _tasks_by_quota(st),
            "decision_ms_mean": _decision_ms(st),
        }
        for w, st in (("live esg", lv), ("sim esg", sv), ("live fast-gshare", fv))
    ]
    print_table(
        f"twin: {wf_name}",
        ["world", "requests", "hit rate", "p50 ms", "p99 ms", "cost/req USD"],
        [
            [
                r["world"],
                r["requests"],
                r["slo_hit_rate"],
                r["p50_ms"],
                r["p99_ms"],
                r["cost_per_request_usd"],
            ]
            for r in rows
        ],
    )
    for r in rows:
        if r["tasks_by_stage_quota"]:
            print(f"{r['world']} tasks by stage@quota: {r['tasks_by_stage_quota']}")
            print(f"{r['world']} mean decision: {r['decision_ms_mean']} ms")
    for k in (
        "abs_hit_rate_diff_pp",
        "p50_ratio_sim_over_live",
        "p99_ratio_sim_over_live",
        "esg_vs_fastgshare_hit_rate_live",
        "esg_vs_fastgshare_cost_live",
        "done_when",
    ):
        print(f"{k}: {summary[k]}")
    write_json(args.json, summary, rows=rows)
    if not summary["done_when"]:
        sys.exit(0)  # a bench reports; the README and the closing note carry the verdict


if __name__ == "__main__":
    main()
