"""The FaST-Profiler, simulated: closed-loop measurements of a function under a share.

FaST-GShare's profiler (§3.2) runs a function at every (SM %, quota, batch) point of a grid under
a closed-loop load and records latency and throughput; the autoscaler then picks configurations
from those profiles. In the simulator, "the platform" is the simulator, so a profile the
autoscaler can trust must be measured *in the simulator*. ``simulate_closed_loop`` runs one
client on one ``SimGpu`` under the token scheduler, with launch-gated bursts (the model
``token-fidelity`` validated: token-gated launch work ``LaunchGating.launch_ms(launch floor,
L100)``, device time L100), in a closed loop whose think time is the caller's ``ClosedLoopProtocol``
(``token-fidelity`` passes the 5 ms of the profiler that produced the shipped V100 table, RaPP's
script: warm-up, then inferences 5 ms apart, mean latency). ``simulated_profile`` runs it over a
grid with no think time (a *saturating* loop: each row is the sustainable service time per
batch, see its docstring), solo or on a GPU filled with neighbours (``colocation``).

Inputs are the quota-100 rows only (measured or interpolated): at quota 100 % a row is the
quota-100 latency (slowed by the neighbours' interference with ``colocation``); below, it is
what the simulator predicts. Who calls it: the ``token-fidelity`` experiment
(``simulate_closed_loop`` on every measured point) and experiments whose controller autoscales
from profiles (``fast-autoscale``: ``simulated_profile``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.profiles import ProfilePoint, ProfileTable, kernels_per_inference
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import InterferenceModel, SimGpu
from gshare.sim.instance import LaunchGating
from gshare.sim.priorities import PRIO_CLIENT

DEFAULT_WAKEUP_MS = 1.0
"""Wake-up charged to a token a burst had to wait for (``token-fidelity``'s constant)."""

CPU_RUNTIME_WAKEUP_MS = 0.3
"""The same wake-up for an instance of the live runtime on the CPU device: its batching thread
blocks in ``TokenClient.acquire`` and resumes when the grant arrives.

NOTE — CPU grant latency (measured, not fitted): a token round trip over the Unix socket is
63 µs p50 / 101 µs p99 (``bench/token_rtt.py``), and waking a thread blocked after a few ms of
compute takes 150–450 µs on the 2-core development VM (docs/journal/tokens.md, uncontended
tokens); 0.3 ms is their sum at the middle of that range. ``DEFAULT_WAKEUP_MS`` (1.0) was fitted
on the V100 table's GPU frontend (``token-fidelity``), where the hook also drains the stream;
charged to ~1-ms CPU requests it cut a quota-limited instance's capacity by half. Checked on
``bench/fidelity.py``'s ``llm-autoscale`` segment (the docs' fidelity table)."""


@dataclass(frozen=True)
class ClosedLoopProtocol:
    """The profiler's closed loop, as simulated."""

    window_ms: float = 40.0
    think_ms: float = 5.0
    warmup_requests: int = 3
    min_requests: int = 8
    min_measure_ms: float = 800.0
    max_requests: int = 180


def simulate_closed_loop(
    launch_ms: float,
    device_ms: float,
    quota: float,
    wakeup_ms: float,
    proto: ClosedLoopProtocol,
    sm_pct: float = 100.0,
) -> tuple[float, int]:
    """Mean latency of the profiler's closed loop for one launch-gated client, and the events.

    One ``SimGpu`` with one client (quota_request = quota_limit = ``quota``); each inference is
    ``run_burst(launch_ms, device_ms=device_ms)``; the next one starts ``think_ms`` after the
    last completes. The mean is over the requests after ``warmup_requests``, at least
    ``min_requests`` of them and ``min_measure_ms`` of simulated time, at most ``max_requests``.
    """
    loop = EventLoop()
    gpu = SimGpu(
        loop,
        token_config=TokenConfig(window_ms=proto.window_ms),
        interference=InterferenceModel(enabled=False),
        token_wakeup_ms=wakeup_ms,
    )
    gpu.add_client(ClientSpec("c", sm_pct, quota, quota))
    lat: list[float] = []
    state = {"k": 0, "t0": 0.0, "m0": -1.0}

    def start() -> None:
        state["t0"] = loop.now_ms
        gpu.run_burst("c", launch_ms, done, device_ms=device_ms)

    def done() -> None:
        k = state["k"]
        state["k"] = k + 1
        if k >= proto.warmup_requests:
            if state["m0"] < 0:
                state["m0"] = state["t0"]
            lat.append(loop.now_ms - state["t0"])
            enough = (
                len(lat) >= proto.min_requests and loop.now_ms - state["m0"] >= proto.min_measure_ms
            )
            if enough or len(lat) >= proto.max_requests:
                loop.stop()
                return
        loop.after(proto.think_ms, start, PRIO_CLIENT)

    start()
    loop.run()
    return sum(lat) / len(lat), loop.events_processed


def simulated_profile(
    table: ProfileTable,
    model: str,
    *,
    sm_values: Iterable[float],
    quota_values: Iterable[float],
    batches: Iterable[int],
    launch: LaunchGating | None = None,
    wakeup_ms: float = DEFAULT_WAKEUP_MS,
    proto: ClosedLoopProtocol | None = None,
    colocation: InterferenceModel | None = None,
) -> ProfileTable:
    """A profile table of ``model`` on the simulator's grid points (see the module docstring).

    By default the loop is *saturating* (no think time: the next full batch is ready as soon as
    the last completes), so each row's latency is the instance's service time per batch under
    load and ``batch * 1000 / latency`` its sustainable throughput — what an autoscaler that
    sizes a fleet by throughput needs. (The shipped table's rows were measured with 5 ms of
    think time, which lets a quota-limited instance look faster than it can sustain.)

    ``colocation``: profile each configuration on a GPU *filled* with neighbours (the other
    100 − sm % of the SMs busy), so device time is slowed by ``colocation.slowdown(100 − sm)``.
    That is the packing the autoscaler's RPR assumes (a GPU tiled with copies); solo profiles
    (None, FaST-GShare's) overstate what a packed instance sustains when bursts interfere.
    """
    launch = launch or LaunchGating()
    proto = proto or ClosedLoopProtocol(think_ms=0.0)
    floor = table.launch_floor_ms(model, launch.floor_quantile_pct)
    kernels = kernels_per_inference().get(model)
    rows: list[ProfilePoint] = []
    for b in sorted(set(batches)):
        for sm in sorted(set(sm_values)):
            l100 = table.latency_ms(model, sm, 100.0, b)
            if colocation is not None:
                l100 *= colocation.slowdown(max(0.0, 100.0 - sm))
            gated = launch.launch_ms(floor, l100, kernels)
            for q in sorted(set(quota_values)):
                if q >= 100.0:
                    lat = l100
                else:
                    lat, _ = simulate_closed_loop(
                        gated, l100, q / 100.0, wakeup_ms, proto, sm_pct=sm
                    )
                rows.append(ProfilePoint(model, sm, q, b, lat))
    return ProfileTable(rows)
