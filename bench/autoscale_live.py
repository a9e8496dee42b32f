"""Autoscaling live: a shipped trace segment replayed against a real ``gshare serve``, with
gshare's default autoscaler (``gshare-burst``) and with FaST-GShare's Algorithm 1
(``fast-heuristic``), and the same segment simulated.

What it measures: a real ``gshare serve --autoscaler A`` (fork launcher, the default) serves
one function (built-in ``mlp`` on the CPU device, a fixed thin share so that a burst needs
several instances: SM 25 %, quota 0.1 guaranteed and at most 0.1; batch 1;
``slo_ms`` 100; 0..``max_instances`` instances; keep-alive 30 s). An open-loop client sends
the arrivals of a segment of the shipped Azure LLM code trace
(``sim.workload.azure_llm``), time-scaled to ``--rate`` requests/s mean (default: 10 % of one
instance's measured throughput, at most 40 rps — the machine is a shared 2-core VM; the trace's
bursts reach several times the mean), each at
its scheduled time whatever the answers do;
a request violates the SLO when it is not answered 200 within ``slo_ms``. A sampler reads the
function's non-draining instances from the control API every 0.25 s.

Before the segment each server measures, on another function and another window of the trace,
what the simulator takes (``_autoscale.run_live(calibrate_under_load=True)``): the busy time
and the platform's share per request under the segment's load, the busy time's dependence on
the idle gap before a request, the platform's serial stage (a burst probe) and a cold start.
Then the same segment is simulated (``sim.cluster``, same autoscaler, period, keep-alive and
bounds, the CPU runtime's burst model ``cpu_runtime_fields`` with its token protocol, the
gateway's admission control) from that server's measurements (``_autoscale.sim_inputs``, as
``bench/fidelity.py``'s LLM segment), the simulated controller estimating the throughput from
its instances' answers as the live gateway does (``throughput_from_busy``).

Summary per autoscaler (``gshare-burst``, ``fast-heuristic``): ``slo_violation_pct``,
``mean_instances``, ``p99_ms``, and ``sim_slo_violation_pct`` / ``sim_mean_instances``.

    .venv/bin/python bench/autoscale_live.py [--quick] [--json PATH] [--rate RPS] \
        [--seconds S] [--offset-s S] [--max-instances N]

``--quick``: a 30 s segment.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from _autoscale import AUTOSCALERS, BATCH, SHARE, SLO_MS, run_live, run_sim, segment, sim_inputs
from _common import bench_parser, machine_load, print_table, write_json


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--rate", type=float, default=None, help="mean requests/s (default: 0.1 x T, <= 40)"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="segment length (180; quick 30)"
    )
    parser.add_argument("--offset-s", type=float, default=0.0, help="segment start in the trace")
    parser.add_argument("--max-instances", type=int, default=4)
    args = parser.parse_args(argv)
    seconds = args.seconds or (30.0 if args.quick else 180.0)
    chosen: dict[str, float] = {}

    def make_segment(tput_rps: float) -> np.ndarray:
        rate = args.rate or min(40.0, 0.1 * tput_rps)
        chosen["rate_rps"] = rate
        seg = segment(rate, seconds, args.offset_s)
        if len(seg) == 0:
            raise SystemExit("the segment holds no arrival")
        return seg

    load = machine_load()
    rows = []
    times: np.ndarray | None = None
    with tempfile.TemporaryDirectory(prefix="gsauto-") as d:
        for a in AUTOSCALERS:
            times, live = run_live(
                a, times, args.max_instances, Path(d), make_segment, calibrate_under_load=True
            )
            tput, cluster = sim_inputs(live)  # this server's measurements
            sim = run_sim(
                a, times, args.max_instances, tput, args.seed, throughput_from_busy=True, **cluster
            )
            live.update(sim, sim_throughput_rps_per_instance=tput)
            rows.append(live)
            print(
                f"  {a}: live {live['slo_violation_pct']:.2f} % / "
                f"{live['mean_instances']:.2f} inst, sim {live['sim_slo_violation_pct']:.2f} % / "
                f"{live['sim_mean_instances']:.2f} inst",
                flush=True,
            )
    assert times is not None
    summary: dict[str, Any] = {
        "segment_s": seconds,
        "rate_rps": chosen["rate_rps"],
        "requests": int(len(times)),
    }
    for r in rows:
        a = r["autoscaler"]
        for k in (
            "slo_violation_pct",
            "mean_instances",
            "p99_ms",
            "sim_slo_violation_pct",
            "sim_mean_instances",
            "sim_throughput_rps_per_instance",
        ):
            summary[f"{k}_{a}"] = r[k]
    summary.update(load)
    print_table(
        "autoscaling live: LLM code trace segment",
        ["autoscaler", "viol %", "mean inst", "p99 ms", "sim viol %", "sim mean inst", "T/inst"],
        [
            [
                r["autoscaler"],
                r["slo_violation_pct"],
                r["mean_instances"],
                r["p99_ms"],
                r["sim_slo_violation_pct"],
                r["sim_mean_instances"],
                r["throughput_rps_per_instance"],
            ]
            for r in rows
        ],
    )
    write_json(
        args.json,
        summary,
        rows=rows,
        params={
            "rate": chosen["rate_rps"],
            "seconds": seconds,
            "offset_s": args.offset_s,
            "max_instances": args.max_instances,
            "share": SHARE,
            "batching": BATCH,
            "slo_ms": SLO_MS,
        },
    )
    return summary


if __name__ == "__main__":
    main()
