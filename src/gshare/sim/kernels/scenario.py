"""Run services on one kernel-level device in one of three modes, and measure FIKIT profiles.

Who calls it: the ``fikit-*`` experiments (``gshare.experiments.fikit``) and the tests. A
*service* is one process with a calibrated ``TaskModel``, a priority and an arrival pattern;
``run_scenario`` runs a set of them on one ``KernelDevice`` in ``Mode.EXCLUSIVE``,
``Mode.SHARING`` or ``Mode.FIKIT`` and returns every task's arrival, begin and end.
``measure_profile`` runs FIKIT's measurement phase of one service alone (T runs, instrumented)
and returns its ``KernelProfile``; experiments measure once and reuse the profile, as FIKIT
loads a service's profile by its task key.

Arrivals: ``closed_loop`` — back-to-back tasks (the next arrives when the previous ends, plus
``think_ms``) until the horizon or ``count``; ``periodic`` — ``count`` tasks every ``period_ms``
from ``offset_ms``; ``burst`` — ``count`` tasks at ``offset_ms``. Tasks of one service run one at
a time (a task that arrives while the previous one runs waits; its JCT counts the wait).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from gshare.policy.priority import (
    DispatchReason,
    FikitConfig,
    FikitScheduler,
    KernelProfile,
    SchedulerView,
)
from gshare.sim.engine import EventLoop
from gshare.sim.kernels.catalogue import TaskModel
from gshare.sim.kernels.device import (
    DEFAULT_SWITCH_MS,
    DEFAULT_TIMESLICE_MS,
    DeviceStats,
    KernelDevice,
)
from gshare.sim.kernels.gates import ExclusiveGate, FikitGate, Gate, SharingGate
from gshare.sim.kernels.stream import HookCosts, HostStream, Jitter, TaskRecord
from gshare.sim.priorities import PRIO_ARRIVAL


class Mode(Enum):
    EXCLUSIVE = "exclusive"
    SHARING = "sharing"
    FIKIT = "fikit"


class ArrivalKind(Enum):
    CLOSED_LOOP = "closed-loop"
    PERIODIC = "periodic"
    BURST = "burst"


@dataclass(frozen=True, slots=True)
class Arrivals:
    kind: ArrivalKind = ArrivalKind.CLOSED_LOOP
    count: int | None = None
    """Tasks to issue (None: closed loop until the horizon)."""
    period_ms: float = 1000.0
    offset_ms: float = 0.0
    think_ms: float = 0.0

    @classmethod
    def closed_loop(cls, count: int | None = None, think_ms: float = 0.0) -> Arrivals:
        return cls(ArrivalKind.CLOSED_LOOP, count, think_ms=think_ms)

    @classmethod
    def periodic(cls, period_ms: float, count: int, offset_ms: float = 0.0) -> Arrivals:
        return cls(ArrivalKind.PERIODIC, count, period_ms, offset_ms)

    @classmethod
    def burst(cls, count: int, offset_ms: float = 0.0) -> Arrivals:
        return cls(ArrivalKind.BURST, count, offset_ms=offset_ms)


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    model: TaskModel
    priority: int = 0
    arrivals: Arrivals = field(default_factory=Arrivals)


@dataclass(frozen=True, slots=True)
class DeviceParams:
    timeslice_ms: float = DEFAULT_TIMESLICE_MS
    switch_ms: float = DEFAULT_SWITCH_MS


@dataclass
class ScenarioResult:
    mode: Mode
    horizon_ms: float
    records: dict[str, list[TaskRecord]]
    device: DeviceStats
    scheduler: SchedulerView | None = None
    reasons: dict[DispatchReason, int] = field(default_factory=dict)
    events: int = 0

    def done(self, service: str) -> list[TaskRecord]:
        return [r for r in self.records[service] if r.done]

    def mean_jct_ms(self, service: str, *, skip_measured: bool = True) -> float:
        rs = [r for r in self.done(service) if not (skip_measured and r.measured)]
        return float(np.mean([r.jct_ms for r in rs])) if rs else float("nan")


def run_scenario(
    services: Sequence[Service],
    mode: Mode,
    *,
    horizon_ms: float,
    seed: int = 0,
    device: DeviceParams | None = None,
    hooks: HookCosts | None = None,
    jitter: Jitter | None = None,
    fikit: FikitConfig | None = None,
    profiles: Mapping[str, KernelProfile] | None = None,
    trace: list[tuple[str, float, float, float]] | None = None,
) -> ScenarioResult:
    """Run ``services`` on one device until ``horizon_ms`` (module docstring). FIKIT mode uses
    ``profiles`` by service name (a service without one starts measuring); they are copied, so
    the caller's profiles do not grow. ``trace`` collects the device's kernel trace
    (``KernelDevice.trace``)."""
    loop = EventLoop()
    dp = device or DeviceParams()
    dev = KernelDevice(loop, dp.timeslice_ms, dp.switch_ms, trace=trace)
    hk = hooks or HookCosts()
    gate: Gate
    sched: FikitScheduler | None = None
    if mode is Mode.SHARING:
        gate = SharingGate()
    elif mode is Mode.EXCLUSIVE:
        gate = ExclusiveGate()
    else:
        sched = FikitScheduler(fikit or FikitConfig())
        for s in services:
            prof = (profiles or {}).get(s.name)
            copy = KernelProfile.from_records(prof.to_records()) if prof is not None else None
            sched.add_service(s.name, s.priority, copy)
        gate = FikitGate(sched, lambda: loop.now_ms, hk.release_ms)
    streams: dict[str, HostStream] = {}
    for i, s in enumerate(services):
        rng = np.random.default_rng([seed, i])
        st = HostStream(s.name, s.model, loop, dev, gate, rng, jitter or Jitter(), hk)
        streams[s.name] = st
        _drive(loop, st, s.arrivals, horizon_ms)
    loop.run(until_ms=horizon_ms)
    return ScenarioResult(
        mode,
        horizon_ms,
        {name: st.records for name, st in streams.items()},
        dev.stats,
        sched.snapshot() if sched is not None else None,
        dict(gate.reasons) if isinstance(gate, FikitGate) else {},
        loop.events_processed,
    )


def _drive(loop: EventLoop, st: HostStream, a: Arrivals, horizon_ms: float) -> None:
    if a.kind is ArrivalKind.CLOSED_LOOP:
        issued = [0]

        def next_task(_: TaskRecord | None = None) -> None:
            if a.count is not None and issued[0] >= a.count:
                return
            if loop.now_ms >= horizon_ms:
                return
            issued[0] += 1
            st.arrive()

        def done(rec: TaskRecord) -> None:
            if a.think_ms > 0:
                loop.after(a.think_ms, next_task, PRIO_ARRIVAL)
            else:
                next_task()

        st.on_task_done = done
        loop.at(a.offset_ms, next_task, PRIO_ARRIVAL)
        return
    n = a.count or 0
    for k in range(n):
        t = a.offset_ms + (k * a.period_ms if a.kind is ArrivalKind.PERIODIC else 0.0)
        if t <= horizon_ms:
            loop.at(t, st.arrive, PRIO_ARRIVAL)


def measure_profile(
    name: str,
    model: TaskModel,
    runs: int,
    *,
    seed: int = 0,
    device: DeviceParams | None = None,
    hooks: HookCosts | None = None,
    jitter: Jitter | None = None,
) -> tuple[KernelProfile, ScenarioResult]:
    """FIKIT's measurement phase of one service alone: ``runs`` instrumented back-to-back runs
    (FIKIT §3.2: "the task exclusively uses the GPU"); returns the profile and the run."""
    sched = FikitScheduler(FikitConfig(measure_runs=runs))
    sched.add_service(name, 0)
    loop = EventLoop()
    dp = device or DeviceParams()
    dev = KernelDevice(loop, dp.timeslice_ms, dp.switch_ms)
    hk = hooks or HookCosts()
    gate = FikitGate(sched, lambda: loop.now_ms, hk.release_ms)
    st = HostStream(
        name, model, loop, dev, gate, np.random.default_rng([seed, 7919]), jitter or Jitter(), hk
    )
    _drive(loop, st, Arrivals.closed_loop(runs), float("inf"))
    loop.run()
    result = ScenarioResult(
        Mode.FIKIT, loop.now_ms, {name: st.records}, dev.stats, sched.snapshot(), {}, 0
    )
    return sched.profile(name), result
