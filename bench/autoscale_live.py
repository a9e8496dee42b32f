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

Then the same segment is simulated (``sim.cluster``, same autoscaler, period, keep-alive and
bounds, the live cold-start model ``LIVE_FORK_COLD_START_MS``, the runtime's token protocol)
with one config whose throughput is what the first server measured (``quota_request × 1000 /
busy ms`` per request, as the controller estimates it), the same for both autoscalers.

Summary per autoscaler (``gshare-burst``, ``fast-heuristic``): ``slo_violation_pct``,
``mean_instances``, ``p99_ms``, and ``sim_slo_violation_pct`` / ``sim_mean_instances``.

    .venv/bin/python bench/autoscale_live.py [--quick] [--json PATH] [--rate RPS] \
        [--seconds S] [--offset-s S] [--max-instances N]

``--quick``: a 30 s segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from _common import bench_parser, machine_load, percentile, print_table, write_json
from gshare.policy.autoscale import ScaleConfig
from gshare.policy.control import ControlParams
from gshare.policy.tokens import LIVE_TOKEN_CONFIG
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim import workload
from gshare.sim.cluster import LIVE_FORK_COLD_START_MS, ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop
from gshare.testing import ServeProcess

ROOT = Path(__file__).resolve().parent.parent
AUTOSCALERS = ("gshare-burst", "fast-heuristic")
SLO_MS = 100.0
SHARE = {"sm_pct": 25, "quota_request": 0.1, "quota_limit": 0.1}
BATCH = {"max_batch": 1, "max_wait_ms": 0}
KEEP_ALIVE_S = 30.0
WARMUP_REQUESTS = 32
"""Warm-up requests, one per 0.25 s (not measured)."""
SIM_WARMUP_S = 8.0
"""The simulated twin of the live warm-up (a few requests/s until the throughput is measured)."""
BODY = bytes(64 * 4)  # zeros: a valid float32 input of the built-in mlp


def segment(rate_rps: float, seconds: float, offset_s: float) -> np.ndarray:
    """Arrival times (ms from 0) of the LLM code trace scaled to ``rate_rps``, the window
    ``[offset_s, offset_s + seconds)`` of it."""
    t = workload.scale_to_rate(workload.azure_llm(), rate_rps)
    lo, hi = offset_s * 1000.0, (offset_s + seconds) * 1000.0
    seg = t[(t >= lo) & (t < hi)] - lo
    return seg


async def _replay(url: str, name: str, times_ms: np.ndarray) -> list[tuple[float, float, int]]:
    """Send one request at each time; (scheduled ms, latency ms, status) per request."""
    out: list[tuple[float, float, int]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(at_ms: float) -> None:
            delay = at_ms / 1000.0 - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            start = time.perf_counter()
            try:
                r = await client.post(
                    f"/function/{name}",
                    content=BODY,
                    headers={"content-type": "application/octet-stream"},
                )
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            out.append((at_ms, (time.perf_counter() - start) * 1000.0, status))

        await asyncio.gather(*(one(float(t)) for t in times_ms))
    return out


def run_live(
    autoscaler: str,
    times_ms: np.ndarray | None,
    max_instances: int,
    tmp: Path,
    make_segment: Any = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """One server with ``autoscaler``; ``times_ms`` None: build the segment with
    ``make_segment(measured throughput per instance)`` once the instance measured it."""
    with ServeProcess(
        "--autoscaler", autoscaler, state_dir=tmp / f"state-{autoscaler}", cwd=ROOT
    ) as srv:
        c = srv.client()
        name = "live-as"
        c.deploy(
            {
                "name": name,
                "model": "mlp",
                "device": "cpu",
                "resources": SHARE,
                "batching": BATCH,
                "slo_ms": SLO_MS,
                "min_instances": 0,
                "max_instances": max_instances,
                "keep_alive_s": KEEP_ALIVE_S,
            }
        )
        # warm up gently (4 requests/s, so the rate history stays far below one instance's
        # capacity); the instance's throughput as the controller estimates it for new
        # instances: quota_request × 1000 / busy ms per request (Triton statistics' compute time)
        for _ in range(WARMUP_REQUESTS):
            c.invoke_raw(name, BODY)
            time.sleep(0.25)
        stats = httpx.get(f"{srv.url}/v2/models/{name}/stats", timeout=10.0).json()
        ci = stats["model_stats"][0]["inference_stats"]["compute_infer"]
        busy_ms = float(ci["ns"]) / 1e6 / max(1, int(ci["count"]))
        tput = [float(SHARE["quota_request"]) * 1000.0 / busy_ms]
        if times_ms is None:
            times_ms = make_segment(statistics.median(tput))
        assert times_ms is not None
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):  # a missed sample is not a failure
                    samples.append(int(c.get(name)["replicas"]))
                stop.wait(0.25)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        results = asyncio.run(_replay(srv.url, name, times_ms))
        stop.set()
        th.join()
    lat = [r[1] for r in results]
    bad = sum(1 for r in results if r[2] != 200 or r[1] > SLO_MS)
    return times_ms, {
        "autoscaler": autoscaler,
        "world": "live",
        "requests": len(results),
        "errors": sum(1 for r in results if r[2] != 200),
        "slo_violation_pct": 100.0 * bad / max(1, len(results)),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "mean_instances": statistics.fmean(samples) if samples else 0.0,
        "throughput_rps_per_instance": tput[0],
        "busy_ms_per_request": busy_ms,
    }


def run_sim(
    autoscaler: str, times_ms: np.ndarray, max_instances: int, tput_rps: float, seed: int
) -> dict[str, Any]:
    """The same segment in the simulator: one config of the live instances' throughput.

    The live controller's throughput of an instance is ``quota_request × 1000 / busy_ms`` (busy
    time per request measured by the gateway); the simulated model runs ``busy_ms`` per request
    at quota 100 % (linear in the batch) and the simulated token scheduler gates it at the
    share's quota, with the runtime's token protocol (``LIVE_TOKEN_CONFIG``, token reuse)."""
    batch = int(BATCH["max_batch"])
    cfg_sm, cfg_q = float(SHARE["sm_pct"]), float(SHARE["quota_request"]) * 100.0
    busy_ms = (cfg_q / 100.0) * 1000.0 / tput_rps
    rows = [
        ProfilePoint("live-mlp", sm, q, b, b * busy_ms * (100.0 / q))
        for sm in (cfg_sm, 100.0)
        for q in (cfg_q, 100.0)
        for b in (1, 2, 4)
    ]
    table = ProfileTable(rows)
    config = ScaleConfig(
        sm_pct=cfg_sm,
        quota_pct=cfg_q,
        batch=batch,
        throughput_rps=tput_rps,
        latency_ms=batch * 1000.0 / tput_rps,
    )
    loop = EventLoop()
    cluster = SimCluster(
        loop,
        table,
        ClusterConfig(
            max_gpus=1,
            cold_start_ms=LIVE_FORK_COLD_START_MS,
            control=ControlParams(),
            autoscaler=autoscaler,
            launch=None,
            token_config=LIVE_TOKEN_CONFIG,
            token_reuse=True,
        ),
        np.random.default_rng(seed),
    )
    cluster.add_function(
        SimFunction(
            "live-as",
            "live-mlp",
            SLO_MS,
            (config,),
            max_instances=max_instances,
            max_wait_ms=float(BATCH["max_wait_ms"]),
            quota_limit_pct=float(SHARE["quota_limit"]) * 100.0,
            keep_alive_s=KEEP_ALIVE_S,
        )
    )
    # as live: a gentle warm-up (4 requests/s for SIM_WARMUP_S, not measured), then the segment
    warm_ms = SIM_WARMUP_S * 1000.0
    arrivals = np.concatenate([np.arange(0.0, warm_ms, 250.0), np.asarray(times_ms) + warm_ms])
    end = float(arrivals[-1]) + 1000.0
    cluster.log.warmup_ms = warm_ms
    workload.drive_open_loop(loop, cluster.gateway, "live-as", arrivals)
    cluster.start(until_ms=end)
    loop.run(until_ms=end)
    insts = [r["instances"] for r in cluster.timeline if r["t_s"] * 1000.0 >= warm_ms]
    loop.run()
    s = cluster.log.summary("live-as")
    return {
        "sim_slo_violation_pct": s["slo_violation_pct"],
        "sim_p99_ms": s["p99_ms"],
        "sim_mean_instances": statistics.fmean(insts) if insts else 0.0,
    }


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
            times, live = run_live(a, times, args.max_instances, Path(d), make_segment)
            # one simulated throughput for both (the first server's, which set the rate): the
            # servers' own measurements differ with the machine's load
            chosen.setdefault("sim_tput_rps", live["throughput_rps_per_instance"])
            live.update(run_sim(a, times, args.max_instances, chosen["sim_tput_rps"], args.seed))
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
        "sim_throughput_rps_per_instance": chosen["sim_tput_rps"],
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
