"""The LLM-trace autoscaling segment, live and simulated: the parts ``bench/autoscale_live.py``
and ``bench/fidelity.py`` share.

Who calls it: both benches import ``segment`` (the arrivals), ``run_live`` (one real
``gshare serve --autoscaler A`` serving the built-in mlp on the CPU device under the segment,
open loop) and ``run_sim`` (the same segment in ``sim.cluster`` with the live instance's measured
throughput). ``bench/autoscale_live.py``'s docstring describes the scenario; what must hold: the
simulated function has the live one's share, batching, SLO, keep-alive and bounds (the
constants below are the one source of both).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from _common import percentile
from gshare.experiments.client_pauses import quiet_collector
from gshare.experiments.fidelity import busy_factors_by_gap, fifo_waits_ms, fit_serial_ms
from gshare.experiments.scenario_load import platform_share_ms
from gshare.policy.admission import DEFAULT_MAX_LATENCY_SLO_FACTOR
from gshare.policy.autoscale import ScaleConfig
from gshare.policy.control import ControlParams
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim import workload
from gshare.sim.cluster import (
    LIVE_FORK_COLD_START_MS,
    ClusterConfig,
    SimCluster,
    SimFunction,
    cpu_runtime_fields,
)
from gshare.sim.engine import EventLoop
from gshare.testing import ServeProcess, wait_until

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
CALIB_S = 30.0
CALIB_OFFSET_S = 585.0
"""The under-load calibration: a window of the trace far from the measured segment's, with its
burst structure (at 10 requests/s: 44 % of its requests in seconds of 50 or more, the busiest
86, against 40 % and 137 in the segment; the 15 s from 600 s used before had none over 31),
chosen on those counts alone. At another rate the window starts at the same point of the
trace (``CALIB_OFFSET_S × CALIB_RATE_RPS / rate``; the scaled trace ends before 585 s at 20
requests/s and more)."""
CALIB_RATE_RPS = 10.0
"""The rate ``CALIB_OFFSET_S`` is given at."""
MIN_CALIB_REQUESTS = 50
"""Fewest requests the calibration window may hold (at some rates the scaled trace ends before
it, or it falls in an idle stretch): fewer is refused with the rate named."""


def segment(rate_rps: float, seconds: float, offset_s: float) -> np.ndarray:
    """Arrival times (ms from 0) of the LLM code trace scaled to ``rate_rps``, the window
    ``[offset_s, offset_s + seconds)`` of it."""
    t = workload.scale_to_rate(workload.azure_llm(), rate_rps)
    lo, hi = offset_s * 1000.0, (offset_s + seconds) * 1000.0
    seg = t[(t >= lo) & (t < hi)] - lo
    return seg


async def _replay(
    url: str,
    name: str,
    times_ms: np.ndarray,
    platform_ms: list[tuple[float, float]] | None = None,
    busy_ms: list[tuple[float, float]] | None = None,
    waits_ms: list[tuple[float, float, float]] | None = None,
    started_s: list[float] | None = None,
) -> list[tuple[float, float, int]]:
    """Send one request at each time; (scheduled ms, latency ms, status) per request.
    ``platform_ms``: appended, per answered request, (its scheduled ms, its latency beyond the
    instance's compute, token wait and queue: ``x-gshare-exec-ms``, ``-token-wait-ms``,
    ``-queue-ms``); ``busy_ms``: appended, per answered request, (its scheduled ms, its batch's
    compute time: ``x-gshare-exec-ms``; batch 1: the request's); ``waits_ms``: appended, per
    answered request, (its scheduled ms, its token wait, its queue at the instance:
    ``x-gshare-token-wait-ms``, ``-queue-ms``); ``started_s``: appended, the host's monotonic
    clock at the segment's time 0 (the server's controller reads the same clock)."""
    out: list[tuple[float, float, int]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:
        t0 = time.perf_counter()
        if started_s is not None:
            started_s.append(time.monotonic())

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
            lat = (time.perf_counter() - start) * 1000.0
            out.append((at_ms, lat, status))
            share = platform_share_ms(lat, r.headers) if status == 200 else None
            if platform_ms is not None and share is not None:
                platform_ms.append((at_ms, share))
            if busy_ms is not None and status == 200:
                busy_ms.append((at_ms, float(r.headers["x-gshare-exec-ms"])))
            if waits_ms is not None and status == 200:
                waits_ms.append(
                    (
                        at_ms,
                        float(r.headers.get("x-gshare-token-wait-ms", "nan")),
                        float(r.headers.get("x-gshare-queue-ms", "nan")),
                    )
                )

        await asyncio.gather(*(one(float(t)) for t in times_ms))
    return out


def calibration_times(rate_rps: float) -> np.ndarray:
    """The under-load calibration's arrivals (ms from 0): ``CALIB_S`` seconds of the trace scaled
    to ``rate_rps``, from the point ``CALIB_OFFSET_S`` is at ``CALIB_RATE_RPS``. Raises
    ``ValueError`` naming the rate when the window holds fewer than ``MIN_CALIB_REQUESTS``
    (at low rates its 30 s are a short stretch of the trace)."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise ValueError(f"the calibration needs a rate > 0 requests/s, got {rate_rps}")
    offset_s = CALIB_OFFSET_S * CALIB_RATE_RPS / rate_rps
    times = segment(rate_rps, CALIB_S, offset_s)
    if len(times) < MIN_CALIB_REQUESTS:
        raise ValueError(
            f"the under-load calibration window ({offset_s:.0f}-{offset_s + CALIB_S:.0f} s of "
            f"the LLM trace scaled to {rate_rps:.2f} requests/s) holds {len(times)} requests, "
            f"fewer than {MIN_CALIB_REQUESTS}: choose another rate"
        )
    return times


def light_load(
    url: str, client: Any, name: str, body: Any, n: int, pace_s: float
) -> tuple[list[float], float, dict[str, Any]]:
    """``n`` sequential requests to ``name``, one per ``pace_s``: the platform's share of each
    answered request after the first quarter (the instance's first inferences), its busy time per
    request and the instance statistics' ``compute_infer`` then. The platform's share is the
    client's latency beyond the busy time (the gateway's compute statistics): the HTTP exchange,
    the gateway, the hop to the instance — what the simulator draws per request
    (``ClusterConfig.platform_ms``)."""
    lat_ms = []
    for _ in range(n):
        t = time.perf_counter()
        if isinstance(body, bytes):
            client.invoke_raw(name, body)
        else:
            client.invoke(name, body)
        lat_ms.append((time.perf_counter() - t) * 1000.0)
        time.sleep(pace_s)
    stats = httpx.get(f"{url}/v2/models/{name}/stats", timeout=10.0).json()
    ci: dict[str, Any] = stats["model_stats"][0]["inference_stats"]["compute_infer"]
    busy_ms = float(ci["ns"]) / 1e6 / max(1, int(ci["count"]))
    return [max(0.0, x - busy_ms) for x in lat_ms[n // 4 :]], busy_ms, ci


def function_spec(name: str, max_instances: int) -> dict[str, Any]:
    """The live function: the built-in mlp on the CPU device with the segment's share,
    batching, SLO, bounds and keep-alive (the simulated twin's, ``run_sim``)."""
    return {
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


def run_live(
    autoscaler: str,
    times_ms: np.ndarray | None,
    max_instances: int,
    tmp: Path,
    make_segment: Any = None,
    calibrate_under_load: bool = False,
    calibrate_after: bool = False,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One server with ``autoscaler``; ``times_ms`` None: build the segment with
    ``make_segment(measured throughput per instance)`` once the instance measured it.

    ``calibrate_under_load``: before the segment, measure the busy time per request and the
    platform latency per request under the segment's load (``busy_ms_under_load_calibration``,
    ``platform_ms_under_load``: each answer's latency beyond the instance's compute, token wait
    and queue, less its wait in the platform's serial stage; ``platform_serial_ms``: that
    stage's service time, fitted on ``burst_probe``; ``cold_start_ms``: the latency of its first
    request after it scaled to zero, ``cold_request_ms``, less the platform's median and a first
    inference): another function of the same model and
    share (``live-cal``, deleted after) is sent ``CALIB_S`` seconds of the trace at the
    segment's mean rate (``calibration_times``), then ``burst_probe``; the measured
    function's instances and rate history are untouched. ``calibrate_after`` (with
    ``calibrate_under_load``): the same calibration again after the segment, on a fresh function
    (``calibration_after``: the same ``CALIBRATION_FIELDS``), so that the two bracket it."""
    with ServeProcess(
        "--autoscaler", autoscaler, state_dir=tmp / f"state-{autoscaler}", cwd=ROOT
    ) as srv:
        c = srv.client()
        name = "live-as"
        c.deploy(function_spec(name, max_instances))
        # warm up gently (4 requests/s, so the rate history stays far below one instance's
        # capacity); the instance's throughput as the controller estimates it for new
        # instances: quota_request × 1000 / busy ms per request (Triton statistics' compute time)
        platform_ms, busy_ms, ci = light_load(srv.url, c, name, BODY, WARMUP_REQUESTS, 0.25)
        warmed_s = time.monotonic()
        tput = [float(SHARE["quota_request"]) * 1000.0 / busy_ms]
        if times_ms is None:
            times_ms = make_segment(statistics.median(tput))
        assert times_ms is not None
        cal = _under_load(srv, c, times_ms) if calibrate_under_load else {}
        samples: list[int] = []
        sampled_at_s: list[float] = []
        stop = threading.Event()
        t_start = time.perf_counter()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):  # a missed sample is not a failure
                    samples.append(int(c.get(name)["replicas"]))
                    sampled_at_s.append(round(time.perf_counter() - t_start, 2))
                stop.wait(0.25)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        seg_platform: list[tuple[float, float]] = []
        seg_busy: list[tuple[float, float]] = []
        seg_waits: list[tuple[float, float, float]] = []
        started: list[float] = []
        with quiet_collector() as gcp:  # its own pauses are not the server's latency
            results = asyncio.run(
                _replay(srv.url, name, times_ms, seg_platform, seg_busy, seg_waits, started)
            )
        stop.set()
        th.join()
        # the controller's period ticks from a period before the segment to its end, in ms of
        # the segment (the simulator ticks there: ``run_sim``'s ``segment_ticks_ms``)
        end_ms = float(times_ms[-1]) + 1000.0
        ticks_ms = [
            round((t - started[0]) * 1000.0, 3) for t in c.info().get("control_ticks_s", [])
        ]
        ticks_ms = [t for t in ticks_ms if -1000.0 <= t <= end_ms]
        # the function's idle time between its warm-up and the segment (the calibration, on
        # another function): longer than its keep-alive, so the segment starts cold
        idle_s = started[0] - warmed_s
        # the busy time per request under the segment's load (the warm-up's is measured at a
        # few requests/s): what the simulator's model is checked against
        after = httpx.get(f"{srv.url}/v2/models/{name}/stats", timeout=10.0).json()
        ca = after["model_stats"][0]["inference_stats"]["compute_infer"]
        n_run = max(1, int(ca["count"]) - int(ci["count"]))
        busy_ms_run = (float(ca["ns"]) - float(ci["ns"])) / 1e6 / n_run
        after_cal = None
        if calibrate_under_load and calibrate_after:
            after_cal = _under_load(srv, c, times_ms, "live-cal-after")
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
        "busy_ms_per_request_under_load": busy_ms_run,
        **{k: cal.get(k) for k in CALIBRATION_FIELDS},
        "calibration_after": after_cal,
        "answers": [[round(at, 3), round(lat, 3), st] for at, lat, st in results],
        # diagnostics (the simulator does not read them): the segment's own platform share and
        # busy time per answer, beside the calibration's
        "segment_platform_ms": [[round(at, 3), round(ms, 4)] for at, ms in seg_platform],
        "segment_busy_ms": [[round(at, 3), round(ms, 4)] for at, ms in seg_busy],
        "segment_waits_ms": [[round(at, 3), round(t, 4), round(q, 4)] for at, t, q in seg_waits],
        "replicas": [[t, n] for t, n in zip(sampled_at_s, samples, strict=True)],
        # the generator's own collections left after the freeze (ms of the segment, generation,
        # ms): an answer arriving during one is timed late by it (``client_pauses``)
        "client_gc": {**gcp.summary(), "pauses_ms": gcp.since(t_start)},
        "control_ticks_ms": ticks_ms,
        "idle_before_segment_s": round(idle_s, 3),
        "platform_ms": platform_ms,
    }


CALIBRATION_FIELDS = (
    "busy_ms_under_load_calibration",
    "busy_samples_ms_calibration",
    "platform_ms_under_load",
    "platform_serial_ms",
    "cold_start_ms",
    "first_busy_ms",
)
"""What ``_under_load`` measures, as ``run_live`` records it (``calibration_after`` holds the
same fields) and ``sim_inputs`` reads it."""


SCALED_TO_ZERO_WAIT_S = 3.0
"""The least time after the calibration function scaled to zero that ``cold_request_ms`` sends
its request: the LLM segment's cold starts came 3-6 s after its function had scaled to zero."""


def idle_before_cold_s(times_ms: np.ndarray, keep_alive_s: float = KEEP_ALIVE_S) -> float:
    """How long the segment's function sits idle before its cold starts (s): the longest gap
    between two of its arrivals that outlasts ``keep_alive_s`` (the function scaled to zero in
    it), or ``SCALED_TO_ZERO_WAIT_S`` when no gap does (what ``cold_request_ms`` then waits)."""
    gaps_s = np.diff(np.asarray(times_ms, dtype=float)) / 1000.0
    long = [float(g) for g in gaps_s if g > keep_alive_s]
    return max(long) if long else SCALED_TO_ZERO_WAIT_S


def cold_request_ms(
    c: Any, name: str, idle_s: float = SCALED_TO_ZERO_WAIT_S, timeout_s: float = 60.0
) -> float:
    """The latency (ms) of one request to the deployed function ``name`` once it has scaled to
    zero, as the segment's cold starts come: its keep-alive is set to 1 s, and the request goes
    ``idle_s`` after the call (the caller's last request to it), and at least
    ``SCALED_TO_ZERO_WAIT_S`` after its last instance has gone. ``WaitTimeout`` when it still
    has an instance after ``timeout_s``."""
    t_last = time.perf_counter()
    c.deploy({**function_spec(name, 1), "keep_alive_s": 1.0})
    wait_until(
        lambda: c.get(name).get("availableReplicas", 0) == 0,
        timeout_s,
        f"{name!r} to scale to zero",
        interval_s=0.1,
    )
    time.sleep(max(SCALED_TO_ZERO_WAIT_S, idle_s - (time.perf_counter() - t_last)))
    t0 = time.perf_counter()
    c.invoke_raw(name, BODY)
    return (time.perf_counter() - t0) * 1000.0


def _under_load(
    srv: ServeProcess, c: Any, times_ms: np.ndarray, cal: str = "live-cal"
) -> dict[str, Any]:
    """``run_live``'s under-load calibration (its docstring), as ``CALIBRATION_FIELDS``: busy ms
    per request; each answered request's (scheduled ms, busy ms); the platform latency samples
    (ms) of the answered requests after the first quarter, each less its wait in the platform's
    serial stage; that stage's service time (ms; ``burst_probe``); and the cold start (ms: the
    function's first request after it scaled to zero, ``cold_request_ms``, less the platform's
    median and a first inference's compute time); and the new function's first request's compute
    time (ms: a new instance's first inference). ``cal``: the calibration function's name
    (deployed here, deleted after).

    NOTE — the cold start after a scale to zero. Timed on the new function's first request, the
    cold start was 68-125 ms (96 on average) where the segment's, 3-6 s after its function had
    scaled to zero, took 96-156 ms (113 on average; ten servers). On one server, three
    functions' first requests took 78 ms after their deploy and 96-98 ms after a scale to zero
    (docs/journal/fidelity.md, section 16). How long the server had been idle matters too: 3 s
    after a scale to zero (2-3 s after the last request) the first request took 82-152 ms (98 at
    the median, 8 requests), 12-37 s after the last request 102-163 ms (129 at the median, 11
    requests; section 17). The segment's cold starts come after 37 s without a request, and the
    calibration's request now comes as long after its last one (``idle_before_cold_s``)."""
    # the window first: a rate it cannot serve is refused before anything is deployed
    rate = len(times_ms) / max(1e-9, float(times_ms[-1]) / 1000.0)
    cal_times = calibration_times(rate)
    # one instance: each answer's busy time goes with the gap since that instance's previous
    # request (``busy_factors_by_gap`` classes by the function's arrivals)
    c.deploy(function_spec(cal, 1))
    c.invoke_raw(cal, BODY)  # its instance is up (its first inference: below)
    stats_url = f"{srv.url}/v2/models/{cal}/stats"
    before = httpx.get(stats_url, timeout=10.0).json()["model_stats"][0]["inference_stats"]
    # the statistics so far are the first request's: a new instance's first inference
    first = before["compute_infer"]
    first_busy_ms = float(first["ns"]) / 1e6 / max(1, int(first["count"]))
    plat: list[tuple[float, float]] = []
    busy: list[tuple[float, float]] = []
    asyncio.run(_replay(srv.url, cal, cal_times, plat, busy))
    after = httpx.get(stats_url, timeout=10.0).json()["model_stats"][0]["inference_stats"]
    serial_ms = fit_serial_ms(asyncio.run(burst_probe(srv.url, cal)))
    restart_ms = cold_request_ms(c, cal, idle_before_cold_s(times_ms))
    c.delete(cal)
    b, a = before["compute_infer"], after["compute_infer"]
    n = max(1, int(a["count"]) - int(b["count"]))
    # the stage's waits at the calibration's own bursts come back in the simulator at its own;
    # within requests sent at one time, the lower platform latency took the shorter wait
    waits_at: dict[float, list[float]] = {}
    times = cal_times.tolist()
    for at, w in zip(times, fifo_waits_ms(times, serial_ms), strict=True):
        waits_at.setdefault(at, []).append(w)
    base = [
        max(0.0, p - (waits_at[at].pop(0) if waits_at.get(at) else 0.0)) for at, p in sorted(plat)
    ]
    base = base[len(base) // 4 :]
    cold_ms = max(0.0, restart_ms - (statistics.median(base) if base else 0.0) - first_busy_ms)
    return dict(
        zip(
            CALIBRATION_FIELDS,
            (
                (float(a["ns"]) - float(b["ns"])) / 1e6 / n,
                [[round(at, 3), round(ms, 4)] for at, ms in busy],
                base,
                serial_ms,
                cold_ms,
                first_busy_ms,
            ),
            strict=True,
        )
    )


BURST_SIZES = (1, 2, 4, 8)
BURST_REPS = 6
BURST_GAP_S = 0.3


async def burst_probe(url: str, name: str) -> list[tuple[int, float]]:
    """Bursts of k simultaneous requests to ``name`` (``BURST_SIZES`` × ``BURST_REPS``, in a
    shuffled order, ``BURST_GAP_S`` apart): per burst (k, the mean platform latency of its
    answered requests: latency beyond the timing headers). What
    ``experiments.fidelity.fit_serial_ms`` fits the platform's serial stage on."""
    order = [k for _ in range(BURST_REPS) for k in BURST_SIZES]
    np.random.default_rng(0).shuffle(order)
    out: list[tuple[int, float]] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:

        async def one() -> float | None:
            t = time.perf_counter()
            r = await client.post(
                f"/function/{name}",
                content=BODY,
                headers={"content-type": "application/octet-stream"},
            )
            lat = (time.perf_counter() - t) * 1000.0
            return platform_share_ms(lat, r.headers) if r.status_code == 200 else None

        for k in order:
            got = [p for p in await asyncio.gather(*(one() for _ in range(k))) if p is not None]
            if got:
                out.append((k, statistics.fmean(got)))
            await asyncio.sleep(BURST_GAP_S)
    return out


def sim_inputs(live: dict[str, Any], after: bool = False) -> tuple[float, dict[str, Any]]:
    """What the simulator takes from one live server run with ``calibrate_under_load``: the
    config's throughput (``quota_request × 1000 / busy ms`` at the under-load calibration) and
    the ``run_sim`` cluster fields — the platform samples under load, the serial stage's service
    time, the measured cold start and first inference's busy time (a record without it: the
    instance's first batch as the others), and the busy time's factors by arrival gap
    (``experiments.fidelity.busy_factors_by_gap`` on the calibration's answers). Used by
    ``bench/fidelity.py`` and ``bench/autoscale_live.py`` with ``throughput_from_busy``.
    ``after``: from the calibration after the segment (``run_live``'s ``calibrate_after``)."""
    if after:
        if not live.get("calibration_after"):
            raise ValueError("sim_inputs(after=True) needs a run_live(calibrate_after=True) record")
        live = live["calibration_after"]
    busy = live.get("busy_ms_under_load_calibration")
    if busy is None:
        raise ValueError("sim_inputs needs a run_live(..., calibrate_under_load=True) record")
    if not float(busy) > 0.0:
        raise ValueError(
            f"sim_inputs: the calibration measured a busy time of {busy} ms a request (it "
            "answered no request); its record cannot be simulated"
        )
    samples = live.get("busy_samples_ms_calibration") or []
    return float(SHARE["quota_request"]) * 1000.0 / float(busy), {
        "platform_ms": tuple(live["platform_ms_under_load"]),
        "platform_serial_ms": live["platform_serial_ms"],
        "cold_start_ms": live.get("cold_start_ms"),
        "first_busy_ms": live.get("first_busy_ms"),
        "busy_gap_factors": busy_factors_by_gap([a for a, _ in samples], [b for _, b in samples]),
    }


SLOWEST_KEPT = 30
"""How many of the slowest simulated answers ``run_sim`` keeps (``sim_slowest_ms``)."""


def run_sim(
    autoscaler: str,
    times_ms: np.ndarray,
    max_instances: int,
    tput_rps: float,
    seed: int,
    service_busy_ms: float | None = None,
    throughput_from_busy: bool = False,
    segment_ticks_ms: Sequence[float] = (),
    idle_before_s: float = 0.0,
    **cluster: Any,
) -> dict[str, Any]:
    """The same segment in the simulator: one config of the live instances' throughput.

    The live controller's throughput of an instance is ``quota_request × 1000 / busy_ms`` (busy
    time per request measured by the gateway); the simulated model runs ``busy_ms`` per request
    at quota 100 % (linear in the batch) and the simulated token scheduler gates it at the
    share's quota, with the runtime's token protocol (``LIVE_TOKEN_CONFIG``, token reuse).
    ``cluster``: more ``ClusterConfig`` fields (``bench/fidelity.py`` passes the CPU burst
    model and the busy-time noise); ``throughput_from_busy``: the simulated controller estimates
    the throughput from its instances' busy times as the live one does
    (``SimFunction.throughput_from_busy``), starting from ``tput_rps``. Besides the figures,
    ``sim_instances``: (s from the segment's start, instances) per control period, to set beside
    the live server's replica samples. ``segment_ticks_ms``: a live server's controller ticks (ms
    of the segment, ``run_live``'s ``control_ticks_ms``), where the simulated controller ticks
    too (``ClusterConfig.control_ticks_ms``); empty: every period from ``control_phase_ms``.
    ``idle_before_s``: the time without requests between the warm-up and the segment (``run_live``'s
    ``idle_before_segment_s``: the live function, idle past its keep-alive during the
    calibration, starts the segment cold)."""
    batch = int(BATCH["max_batch"])
    cfg_sm, cfg_q = float(SHARE["sm_pct"]), float(SHARE["quota_request"]) * 100.0
    busy_ms = service_busy_ms or (cfg_q / 100.0) * 1000.0 / tput_rps
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
    if idle_before_s < 0:
        raise ValueError(f"idle_before_s must be >= 0 (got {idle_before_s})")
    warm_ms = SIM_WARMUP_S * 1000.0
    seg0_ms = warm_ms + idle_before_s * 1000.0  # the segment's time 0
    if segment_ticks_ms:
        cluster["control_ticks_ms"] = tuple(seg0_ms + float(t) for t in segment_ticks_ms)
    loop = EventLoop()
    measured_cold_ms = cluster.pop("cold_start_ms", None)
    cold_start_ms = LIVE_FORK_COLD_START_MS if measured_cold_ms is None else float(measured_cold_ms)
    sim = SimCluster(
        loop,
        table,
        ClusterConfig(
            max_gpus=1,
            cold_start_ms=cold_start_ms,
            control=ControlParams(),
            autoscaler=autoscaler,
            **{
                **cpu_runtime_fields(),  # the live instance runs on the CPU device
                "admission_slo_factor": DEFAULT_MAX_LATENCY_SLO_FACTOR,  # gshare serve's
                **cluster,
            },
        ),
        np.random.default_rng(seed),
    )
    sim.add_function(
        SimFunction(
            "live-as",
            "live-mlp",
            SLO_MS,
            (config,),
            max_instances=max_instances,
            max_wait_ms=float(BATCH["max_wait_ms"]),
            quota_limit_pct=float(SHARE["quota_limit"]) * 100.0,
            keep_alive_s=KEEP_ALIVE_S,
            throughput_from_busy=throughput_from_busy,
        )
    )
    # as live: a gentle warm-up (4 requests/s for SIM_WARMUP_S, not measured), then the segment
    arrivals = np.concatenate([np.arange(0.0, warm_ms, 250.0), np.asarray(times_ms) + seg0_ms])
    end = float(arrivals[-1]) + 1000.0
    sim.log.warmup_ms = seg0_ms
    workload.drive_open_loop(loop, sim.gateway, "live-as", arrivals)
    sim.start(until_ms=end)
    loop.run(until_ms=end)
    insts = [r["instances"] for r in sim.timeline if r["t_s"] * 1000.0 >= seg0_ms]
    loop.run()
    s = sim.log.summary("live-as")
    seg = [r for r in sim.log.completed if r.arrival_ms >= seg0_ms]
    slow = [r for r in seg if r.latency_ms > SLO_MS]
    slowest = sorted(seg, key=lambda r: r.latency_ms)[-SLOWEST_KEPT:]
    return {
        "sim_shed": sim.gateway.shed.get("live-as", 0),
        "sim_over_slo_answered": sum(1 for r in slow if not r.shed),
        # diagnostics beside the live answers: the slowest answers (ms of the segment, latency)
        "sim_slowest_ms": [
            [round(r.arrival_ms - seg0_ms, 3), round(r.latency_ms, 3)] for r in slowest
        ],
        "sim_slo_violation_pct": s["slo_violation_pct"],
        "sim_p50_ms": s["p50_ms"],
        "sim_p99_ms": s["p99_ms"],
        "sim_mean_instances": statistics.fmean(insts) if insts else 0.0,
        "sim_instances": [
            [round(r["t_s"] - seg0_ms / 1000.0, 3), r["instances"]]
            for r in sim.timeline
            if r["t_s"] * 1000.0 >= seg0_ms
        ],
    }
