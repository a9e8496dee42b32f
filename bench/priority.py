"""FIKIT live: a high-priority resnet50 at half load beside a saturating low-priority resnet50 on
one device — alone, with equal priorities (today's tokens) and with FIKIT.

Usage: ``python bench/priority.py [--quick] [--json PATH] [--duration-s S] [--load F]
[--low-clients N] [--overhead-rounds R] [--device-cores LIST] [--max-rate RPS]``

``--quick`` (a smoke run for CI, seconds per phase): the test-size model, which takes about a
millisecond, so that the gateway rather than the model would be the load at "half load":
hi's rate is capped at 60 req/s (``--max-rate``). Its ratios say little; the full run's do.

What runs: two real ``gshare serve`` processes, both pinned (with everything they start: Ray,
the node agent and its token server, the instances) to the **device core set** — the last core
of this process's affinity by default (``--device-cores``; one core on the 2-core VM) — while
this client runs on the other cores: server A with ``--priority-sharing tokens`` (today's token
sharing), server B with ``--priority-sharing fikit`` (the default). Each serves ``hi``: the
built-in ``resnet50`` (full size; ``--quick``: the test-size model), one instance with the whole
device (``sm_pct`` 100, quota 0.5 / limit 1.0), ``max_batch`` 1, priority 8, its input as raw
float32 bytes. Every phase below uses the same seeded arrival times.

1. **Warm-up**: 15 sequential requests to each ``hi`` (B's instance measures its first 10: the
   measurement phase; the bench waits until B reports ``sharing``).
2. **Overhead alone** (``overhead_pct_alone``): ``--overhead-rounds`` x
   ``--overhead-requests`` pairs of sequential requests, one to A's ``hi`` and one to B's, each
   server first in every other pair, so that machine noise falls on both alike;
   ``overhead_pct_alone`` = median latency on B (FIKIT on, sharing phase) ÷ median on A (FIKIT
   off) − 1, in % (``overhead_pct_alone_mean``: the same with means). The service time (their
   pooled median) sets the load: ``rate = --load / service time`` (0.5: half load).
3. **alone**: Poisson arrivals at ``rate`` to B's ``hi`` for ``--duration-s`` (p50 / p99).
4. **equal** (today's tokens): A gets ``lo``, the same model and share with the *same* priority
   (8), driven by a closed loop of ``--low-clients`` clients (saturating: a request always
   waits), while ``hi`` gets the same Poisson arrivals.
5. **fikit**: B gets ``lo`` with priority 1 (after its own measurement phase, run alone), the
   same closed loop, the same arrivals to ``hi``.

Summary (the issue's done-when in brackets):

* ``high_p99_ratio_vs_alone`` -- hi's p99 under FIKIT ÷ its p99 alone [<= 1.3];
* ``sharing_p99_over_fikit_p99`` -- hi's p99 with equal priorities ÷ under FIKIT [>= 1.5];
* ``low_throughput_ratio`` -- lo's completed requests per second under FIKIT ÷ with equal
  priorities [>= 0.5];
* ``overhead_pct_alone`` -- above [<= 5];
* ``per_op_us_top`` / ``per_op_us_publish`` / ``token_rtt_us`` -- the per-op cost of FIKIT in an
  instance, measured in this process on a real board (``FikitHost``): what a top-class instance
  in the sharing phase adds at every preemption point (read the board's top class, the gap and
  measurement tests), the same plus publishing a gap after the op (only after ops whose profile
  predicts a gap >= 0.1 ms), and, for comparison, one token acquire + release round trip over
  the Unix socket (what a per-op round trip would cost);
* the rest: p50s, throughputs, lo's preemptions and fills (``/metrics``), the machine load.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from _common import bench_parser, machine_load, percentile, print_table, write_json
from gshare.testing import ServeProcess, wait_until

ROOT = Path(__file__).resolve().parent.parent


def spec(name: str, priority: int) -> dict[str, Any]:
    return {
        "name": name,
        "model": "resnet50",
        "device": "cpu",
        "resources": {"sm_pct": 100, "quota_request": 0.5, "quota_limit": 1.0},
        "batching": {"max_batch": 1, "max_wait_ms": 0},
        "min_instances": 1,
        "max_instances": 1,
        "slo_ms": 60000,
        "keep_alive_s": 3600,
        "priority": priority,
    }


def payload(quick: bool) -> bytes:
    import numpy as np

    side = 32 if quick else 224
    rng = np.random.default_rng(0)
    return rng.random((3, side, side), dtype=np.float32).tobytes()


_CLIENTS: dict[str, httpx.Client] = {}


def post(url: str, name: str, body: bytes) -> float:
    """One request on a kept-alive connection to ``url``; its latency in ms."""
    c = _CLIENTS.get(url)
    if c is None:
        c = _CLIENTS[url] = httpx.Client(timeout=300)
    t0 = time.perf_counter()
    r = c.post(
        f"{url}/function/{name}", content=body, headers={"content-type": "application/octet-stream"}
    )
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000.0


def metric(url: str, name: str, function: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(f'{name}{{function="{function}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


async def run_phase(
    url: str, body: bytes, times: list[float], low_clients: int, duration_s: float
) -> dict[str, Any]:
    """Poisson requests to ``hi`` at ``times`` (s); a closed loop on ``lo`` when
    ``low_clients`` > 0. Returns hi's latencies and lo's completions within the phase."""
    hdr = {"content-type": "application/octet-stream"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        lat: list[float] = []
        errors = 0
        lo_done = 0
        stop = asyncio.Event()
        t0 = time.perf_counter()

        async def one(at: float) -> None:
            nonlocal errors
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            s = time.perf_counter()
            try:
                r = await client.post(f"{url}/function/hi", content=body, headers=hdr)
                r.raise_for_status()
                lat.append((time.perf_counter() - s) * 1000.0)
            except httpx.HTTPError:
                errors += 1

        async def low() -> None:
            nonlocal lo_done, errors
            while not stop.is_set():
                try:
                    r = await client.post(f"{url}/function/lo", content=body, headers=hdr)
                    r.raise_for_status()
                    if time.perf_counter() - t0 <= duration_s:
                        lo_done += 1
                except httpx.HTTPError:
                    errors += 1

        lows = [asyncio.create_task(low()) for _ in range(low_clients)]
        await asyncio.gather(*(one(a) for a in times))
        stop.set()
        await asyncio.gather(*lows)
        return {
            "lat": lat,
            "errors": errors,
            "lo_rps": lo_done / duration_s if low_clients else math.nan,
        }


def per_op_cost(tmp: Path) -> dict[str, float]:
    """µs per preemption point of a top-class FIKIT instance (no gap / publishing a gap), and a
    token round trip, measured here on a real board and token server."""
    import torch

    from gshare.policy.priority import FikitConfig, KernelId, KernelSpan
    from gshare.policy.priority.profile import profile_from_runs
    from gshare.policy.tokens import ClientSpec, TokenConfig
    from gshare.runtime.instance.fikit import FikitHost
    from gshare.runtime.tokens import TokenClient, TokenServer
    from gshare.runtime.tokens.board import MODE_FIKIT, BoardClient, BoardWriter

    w = BoardWriter(str(tmp / "b.board"), MODE_FIKIT)
    w.assign("a", 9)
    w.assign("b", 9)
    layer = torch.nn.ReLU()
    x = torch.zeros(4)
    op = KernelId.cpu("ReLU", [[4]])

    def profile(sg: float) -> dict[str, Any]:
        run = [KernelSpan(op, 0.0, 0.1), KernelSpan(op, 0.1 + sg, 0.2 + sg)]
        return profile_from_runs("f", [run]).to_records()

    cfg = FikitConfig(measure_runs=1)
    plain = FikitHost(BoardClient(w.path, "a"), "a", profile(0.0), config=cfg)
    pub = FikitHost(BoardClient(w.path, "b"), "b", profile(1.0), config=cfg)
    pub._set_post_hook(False)  # time after_op directly
    for h in (plain, pub):
        h.worker_ident = threading.get_ident()
        h.begin_batch()
    n = 200_000
    args = (x,)

    def loop(fn: Any) -> float:
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, time.perf_counter() - t0)
        return best / n * 1e6

    def top() -> None:
        plain.must_yield()
        plain.before_op(layer, args)

    def publish() -> None:
        pub.must_yield()
        pub.before_op(layer, args)
        pub.after_op(layer, args, x)

    base = loop(lambda: None)
    out = {"per_op_us_top": loop(top) - base, "per_op_us_publish": loop(publish) - base}
    plain.close()
    pub.close()
    w.remove_file()
    sock = str(tmp / "t.sock")
    with TokenServer(sock, TokenConfig()) as ts:
        ts.add_client(ClientSpec("c", 100.0, 1.0, 1.0))
        c = TokenClient(sock, "c")
        rtts = []
        for _ in range(2000):
            t0 = time.perf_counter()
            c.acquire()
            c.release(0.0)
            rtts.append((time.perf_counter() - t0) * 1e6)
        c.close()
    out["token_rtt_us"] = statistics.median(rtts)
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--duration-s", type=float, default=None, help="per phase (default 90)")
    parser.add_argument("--load", type=float, default=0.5, help="hi's load, fraction of alone")
    parser.add_argument("--low-clients", type=int, default=2)
    parser.add_argument("--overhead-rounds", type=int, default=None)
    parser.add_argument("--overhead-requests", type=int, default=None)
    parser.add_argument("--device-cores", default=None, help="e.g. 1 or 2,3 (default: last)")
    parser.add_argument(
        "--max-rate", type=float, default=None, help="cap on hi's rate, req/s (quick: 60)"
    )
    args = parser.parse_args()
    quick = args.quick
    duration = args.duration_s or (10.0 if quick else 90.0)
    rounds = args.overhead_rounds or (3 if quick else 10)
    per_round = args.overhead_requests or (5 if quick else 12)
    mine = sorted(os.sched_getaffinity(0))
    cores_arg = args.device_cores
    device = {int(c) for c in cores_arg.split(",")} if cores_arg else {mine[-1]}
    client_cores = set(mine) - device or set(mine)
    body = payload(quick)
    tmp = Path(tempfile.mkdtemp(prefix="gs-prio-", dir="/tmp"))
    summary: dict[str, Any] = {"device_cores": sorted(device), "quick": quick}
    rows: list[dict[str, Any]] = []

    summary.update(per_op_cost(tmp))
    os.sched_setaffinity(0, device)  # the servers (and all they start) inherit it
    a, b = (
        ServeProcess("--priority-sharing", m, state_dir=tmp / m, cwd=ROOT, tiny_models=quick)
        for m in ("tokens", "fikit")
    )
    try:
        a.start()
        b.start()
        os.sched_setaffinity(0, client_cores)
        ca, cb = a.client(), b.client()
        for c in (ca, cb):
            c.deploy(spec("hi", 8))
        for srv in (a, b):
            for _ in range(15):
                post(srv.url, "hi", body)
        wait_until(lambda: cb.get("hi")["fikit"]["phase"] == "sharing", 120, "B's hi to share")

        # 2. overhead alone, interleaved rounds
        lat_a: list[float] = []
        lat_b: list[float] = []
        for r in range(rounds * per_round):  # alternate, each server first in turn
            first, second = (a, b) if r % 2 == 0 else (b, a)
            t1, t2 = post(first.url, "hi", body), post(second.url, "hi", body)
            lat_a.append(t1 if first is a else t2)
            lat_b.append(t2 if first is a else t1)
        service_ms = statistics.median(lat_a + lat_b)
        summary["overhead_pct_alone"] = (
            statistics.median(lat_b) / statistics.median(lat_a) - 1
        ) * 100
        summary["overhead_pct_alone_mean"] = (
            statistics.mean(lat_b) / statistics.mean(lat_a) - 1
        ) * 100
        summary["service_ms"] = service_ms
        rate = args.load * 1000.0 / service_ms
        cap = args.max_rate or (60.0 if quick else None)
        if cap is not None:
            rate = min(rate, cap)
        summary["hi_rate_rps"] = rate
        times = arrivals(rate, duration, args.seed)

        def phase(name: str, url: str, lows: int) -> dict[str, Any]:
            res = asyncio.run(run_phase(url, body, times, lows, duration))
            lat = res["lat"]
            row = {
                "mode": name,
                "hi_requests": len(lat),
                "hi_p50_ms": percentile(lat, 50),
                "hi_p99_ms": percentile(lat, 99),
                "lo_rps": res["lo_rps"],
                "errors": res["errors"],
            }
            rows.append(row)
            return row

        # 3. alone (FIKIT on, one function)
        alone = phase("alone", b.url, 0)
        # 4. equal priorities on the token server
        ca.deploy(spec("lo", 8))
        for _ in range(3):
            post(a.url, "lo", body)
        equal = phase("equal", a.url, args.low_clients)
        ca.delete("lo")
        # 5. FIKIT: lo below hi
        cb.deploy(spec("lo", 1))
        for _ in range(15):
            post(b.url, "lo", body)
        wait_until(lambda: cb.get("lo")["fikit"]["phase"] == "sharing", 120, "B's lo to share")
        pre0 = metric(b.url, "gshare_fikit_preemptions_total", "lo")
        fills0 = metric(b.url, "gshare_fikit_fill_kernels_total", "lo")
        fikit = phase("fikit", b.url, args.low_clients)
        time.sleep(2.5)  # the controller's next report
        fikit["lo_preemptions"] = metric(b.url, "gshare_fikit_preemptions_total", "lo") - pre0
        fikit["lo_fills"] = metric(b.url, "gshare_fikit_fill_kernels_total", "lo") - fills0

        summary["high_p99_ratio_vs_alone"] = fikit["hi_p99_ms"] / alone["hi_p99_ms"]
        summary["sharing_p99_over_fikit_p99"] = equal["hi_p99_ms"] / fikit["hi_p99_ms"]
        summary["low_throughput_ratio"] = fikit["lo_rps"] / equal["lo_rps"]
        for r in (alone, equal, fikit):
            summary[f"hi_p50_ms_{r['mode']}"] = r["hi_p50_ms"]
            summary[f"hi_p99_ms_{r['mode']}"] = r["hi_p99_ms"]
        summary["lo_rps_equal"] = equal["lo_rps"]
        summary["lo_rps_fikit"] = fikit["lo_rps"]
        summary["lo_preemptions"] = fikit["lo_preemptions"]
        summary["lo_fills"] = fikit["lo_fills"]
        summary["errors"] = sum(r["errors"] for r in rows)
    finally:
        os.sched_setaffinity(0, set(mine))
        for srv in (a, b):
            if srv.proc is not None:
                srv.stop(timeout_s=60)
    summary.update(machine_load())
    print_table(
        "FIKIT live: hi (Poisson, half load) beside a saturating lo, one device",
        ["mode", "hi requests", "hi p50 ms", "hi p99 ms", "lo rps", "errors"],
        [
            [r["mode"], r["hi_requests"], r["hi_p50_ms"], r["hi_p99_ms"], r["lo_rps"], r["errors"]]
            for r in rows
        ],
    )
    keys = [
        "high_p99_ratio_vs_alone",
        "sharing_p99_over_fikit_p99",
        "low_throughput_ratio",
        "overhead_pct_alone",
        "overhead_pct_alone_mean",
        "per_op_us_top",
        "per_op_us_publish",
        "token_rtt_us",
        "service_ms",
        "hi_rate_rps",
        "lo_preemptions",
        "lo_fills",
        "loadavg_1m",
        "cpu_pressure_pct",
    ]
    print_table("summary", ["key", "value"], [[k, summary.get(k, math.nan)] for k in keys])
    write_json(args.json, summary, rows=rows)


if __name__ == "__main__":
    main()
