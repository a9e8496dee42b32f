"""FIKIT on one device: priority queues, task switching, gap filling and runtime feedback.

Who calls it: the device's kernel-level mechanism — the simulator's FIKIT mode
(``sim.kernels``) and, later, the live runtime's priority server — owns one ``FikitScheduler``
per device and drives it with events, always passing the current time in ms:

* ``add_service(name, priority, profile)`` — a function (task key) on this device, with its
  spec ``priority`` (0-9, higher first) and its kernel profile (empty: it starts measuring);
* ``begin_task(task_id, service, now_ms)`` / ``end_task(task_id, now_ms)`` — one run (request,
  batch, training step) of a service starts / has finished (all its kernels completed);
* ``launch(task_id, kernel, now_ms)`` — the task's host wants to launch ``kernel`` (its
  interception point: a CUDA launch hook, a torch module pre-hook); the host waits until the
  launch is dispatched;
* ``complete(task_id, now_ms)`` — the oldest dispatched, unfinished kernel of the task finished
  on the device. A mechanism that cannot observe completions (CUDA without events) reports it at
  the ``Dispatch.predicted_end_ms`` it was given.

Each call returns the ``Dispatch`` decisions to carry out now, in order: the host of each
dispatched launch may submit it. Dispatch order is execution order: the mechanism runs the
dispatched kernels of the device first come, first served (FIKIT Fig. 7: "the GPU executes
the kernel in the same queue in FIFO order"). The scheduler never reads a clock and does no I/O;
its state is plain data, ``snapshot()`` copies it out.

What must hold (tested in ``tests/policy/test_priority_*.py``):

* a launch of the highest registered priority class is dispatched in the call that reports it
  (a high-priority kernel never waits for the scheduler), and a kernel of a lower class is never
  dispatched while a launch of the top active class waits: a high-priority kernel waits on the
  device at most behind the fills already dispatched into its current gap;
* every fill is predicted (SK + ``fill_overhead_ms``, after what the device still has to run)
  to end within the predicted gap it fills — so the fills of a gap add up to at most the gap
  when kernels take their SK — and gaps shorter than ``min_gap_ms`` are not filled;
* with one priority class every launch is dispatched in the call that reports it, i.e. in
  launch order: FIKIT reduces to FIFO sharing;
* every launch is dispatched exactly once, and a held launch is dispatched at the latest when
  every task of a higher class has ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from gshare.policy.priority.fikit import MIN_GAP_MS, Fit, fill_remaining
from gshare.policy.priority.kernel_id import KernelId
from gshare.policy.priority.profile import KernelProfile
from gshare.policy.priority.queues import PendingLaunch, PriorityQueues, check_priority

# NOTE — FIKIT scheduling (§3.2: priority queues, fill inter-kernel idle time, runtime
# feedback, task switching; §2.2 the two phases). The *top class* is the highest priority of the
# tasks running now. Its launches are dispatched at once, first come first served among its
# tasks ("equal priorities interleave in FIFO order", the paper's case C). A launch of a lower
# class waits in its priority queue. When every running kernel of the top class has completed,
# the top class is in a gap: its predicted length is SG of the kernel that just ended (the
# smallest over the top tasks); gaps under ``min_gap_ms`` are skipped, the others are filled by
# BestPrioFit until nothing fits, and a launch queued while the gap is open triggers a rescan.
# Runtime feedback: the next top-class launch ends the gap at once (nothing more is filled; what
# was dispatched still runs) and, with ``gap_feedback_alpha`` > 0, the observed gap corrects the
# prediction of that kernel ID (EWMA). Task switching: a task of a higher class that begins takes
# the top class at once, so the next launch of a running lower task is held (its kernels already
# dispatched complete). A service without a complete profile (fewer than ``measure_runs`` runs)
# is measuring: its gaps are not filled and its kernels fill no gap (their SK is unknown).
#
# NOTE — backlog horizon (gshare's, not in the paper; ``backlog_horizon_ms``). The paper's tasks
# "immediately pause and give way" to a later high-priority task, which is only possible if the
# device queue holds little: kernels already handed to the GPU cannot be taken back. A task that
# is the top class but not of the highest *registered* class (a best-effort task running alone)
# is therefore dispatched only while the predicted device time of the dispatched, unfinished
# kernels (SK each) is at most the horizon, and the fills of its gaps stay within the horizon
# too; a task of the highest registered class is never held. Invariant: a high-priority task
# that begins finds at most the horizon plus one kernel of lower-class work on the device. Why
# and measurements: docs/journal/priority.md.


class TaskPhase(Enum):
    """FIKIT's two phases of a service (§2.2, Fig. 3)."""

    MEASURING = "measuring"
    """Fewer than ``measure_runs`` runs profiled: no gap of it is filled, it fills none."""
    SHARING = "sharing"
    """Profiled: its gaps are predicted and filled; its kernels may fill others' gaps."""


class DispatchReason(Enum):
    """Why a launch was dispatched."""

    TOP_CLASS = "top-class"
    """Its task is of the highest priority running now: dispatched at once (FIFO)."""
    GAP_FILL = "gap-fill"
    """Chosen by BestPrioFit to fill a predicted idle gap of the top class."""
    RESUMED = "resumed"
    """Held while a higher class ran (task switching); its class is the top class again."""
    BACKLOG = "backlog"
    """A top-class launch held by the backlog horizon, dispatched once the backlog drained."""


class SchedulerError(ValueError):
    """An event that contradicts the scheduler's state (unknown task, a launch while another of
    the same task waits, ...); the message names it."""


@dataclass(frozen=True, slots=True)
class FikitConfig:
    """Parameters of the FIKIT scheduler of one device."""

    min_gap_ms: float = MIN_GAP_MS
    """Gaps shorter than this are not filled (paper: 0.1 ms)."""
    measure_runs: int = 10
    """T: runs measured before a service enters the sharing phase (paper: 10-1000)."""
    gap_feedback_alpha: float = 0.0
    """Weight of an observed gap in the EWMA that corrects SG at run time (0: predictions stay
    the profile's SG; the gap still ends at the next top-class launch)."""
    fill_overhead_ms: float = 0.0
    """Cost charged per fill on top of its SK when fitting (0: the paper's BestPrioFit). A
    mechanism sets it to what a fill costs beyond its kernel (a context switch, the release of a
    held launch)."""
    backlog_horizon_ms: float = 0.2
    """A top-class task below the highest registered class is dispatched only while the
    dispatched, unfinished kernels sum (SK) to at most this (NOTE on the backlog horizon)."""
    unknown_kernel_ms: float = 0.05
    """Device time assumed for a kernel of unknown SK when predicting the backlog."""

    def __post_init__(self) -> None:
        if self.min_gap_ms < 0:
            raise SchedulerError(f"min_gap_ms must be >= 0, got {self.min_gap_ms}")
        if self.measure_runs < 1:
            raise SchedulerError(f"measure_runs must be >= 1, got {self.measure_runs}")
        if not (0.0 <= self.gap_feedback_alpha <= 1.0):
            raise SchedulerError(
                f"gap_feedback_alpha must be in [0, 1], got {self.gap_feedback_alpha}"
            )
        if self.fill_overhead_ms < 0 or self.backlog_horizon_ms < 0:
            raise SchedulerError("fill_overhead_ms and backlog_horizon_ms must be >= 0")
        if self.unknown_kernel_ms <= 0:
            raise SchedulerError(f"unknown_kernel_ms must be > 0, got {self.unknown_kernel_ms}")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A launch the host may submit now."""

    task_id: str
    kernel: KernelId
    reason: DispatchReason
    at_ms: float
    seq: int
    """The launch's arrival number (the mechanism matches it to its waiting host)."""
    predicted_ms: float | None
    """SK the scheduler assumed (None: unknown, ``unknown_kernel_ms`` was used)."""
    predicted_end_ms: float
    """When the scheduler expects the kernel to finish (FIFO after everything dispatched)."""


@dataclass(slots=True)
class ServiceCounters:
    """Per-service metrics (the live runtime exports them)."""

    launches: int = 0
    dispatched_top: int = 0
    fills: int = 0
    """Its kernels dispatched into another class's gap."""
    resumed: int = 0
    backlog_held: int = 0
    preemptions: int = 0
    """Launches held because a higher class was running (task switching)."""
    gaps_filled: int = 0
    """Gaps of its tasks that received at least one fill."""
    gaps_skipped: int = 0
    """Gaps of its tasks not filled: predicted shorter than ``min_gap_ms`` or unknown."""
    gaps_cut: int = 0
    """Gaps ended by its next launch while fills were still on the device (overrun)."""
    fill_ms: float = 0.0
    """Predicted device time of the fills put into its gaps."""


@dataclass(slots=True)
class _Service:
    name: str
    priority: int
    profile: KernelProfile
    counters: ServiceCounters = field(default_factory=ServiceCounters)


@dataclass(slots=True)
class _Task:
    task_id: str
    service: _Service
    inflight: deque[KernelId] = field(default_factory=deque)
    """Its dispatched, unfinished kernels, oldest first."""
    waiting: PendingLaunch | None = None
    """Its held launch (its host waits on it)."""
    last_kernel: KernelId | None = None
    """The last of its kernels that completed."""
    last_end_ms: float | None = None
    gap_end_ms: float | None = None
    """While in a fillable gap: its predicted end; None otherwise."""
    gap_fills: int = 0
    """Fills dispatched into its current gap and still on the device at its next launch."""


@dataclass(frozen=True, slots=True)
class ServiceView:
    """Read-only state of one service (``snapshot``)."""

    name: str
    priority: int
    phase: TaskPhase
    profiled_runs: int
    running_tasks: int
    counters: ServiceCounters


@dataclass(frozen=True, slots=True)
class SchedulerView:
    top_priority: int | None
    queued: int
    inflight: int
    device_free_ms: float
    services: Mapping[str, ServiceView]


@dataclass(slots=True)
class FikitScheduler:
    """The FIKIT scheduler of one device. See the module docstring for the protocol."""

    config: FikitConfig = field(default_factory=FikitConfig)
    _services: dict[str, _Service] = field(default_factory=dict)
    _tasks: dict[str, _Task] = field(default_factory=dict)
    _queues: PriorityQueues = field(default_factory=PriorityQueues)
    _seq: int = 0
    _inflight: deque[tuple[str, float]] = field(default_factory=deque)
    """Every dispatched, unfinished kernel as (task, predicted duration), in dispatch order."""
    _device_free_ms: float = 0.0
    """Predicted time the device finishes everything dispatched."""
    _sg: dict[tuple[str, KernelId], float] = field(default_factory=dict)
    """Gap predictions corrected at run time (feedback), by (service, kernel)."""
    _backlog_seqs: set[int] = field(default_factory=set)
    """Launches queued by the backlog horizon (not by a higher class)."""

    # -- services and tasks ---------------------------------------------------------------------

    def add_service(self, name: str, priority: int, profile: KernelProfile | None = None) -> None:
        """Register a function on this device; without a profile it starts measuring."""
        if name in self._services:
            raise SchedulerError(f"service {name!r} is already registered")
        check_priority(priority)
        self._services[name] = _Service(name, priority, profile or KernelProfile(name))

    def remove_service(self, name: str) -> None:
        svc = self._get_service(name)
        if any(t.service is svc for t in self._tasks.values()):
            raise SchedulerError(f"service {name!r} still has running tasks")
        del self._services[name]

    def profile(self, service: str) -> KernelProfile:
        """The service's profile; a measuring mechanism adds its runs to it."""
        return self._get_service(service).profile

    def phase(self, service: str) -> TaskPhase:
        svc = self._get_service(service)
        return self._phase(svc)

    def begin_task(self, task_id: str, service: str, now_ms: float) -> list[Dispatch]:
        """A run of ``service`` starts; a higher class takes over at once (task switching)."""
        if task_id in self._tasks:
            raise SchedulerError(f"task {task_id!r} is already running")
        svc = self._get_service(service)
        self._tasks[task_id] = _Task(task_id, svc)
        return self._release(now_ms)

    def end_task(self, task_id: str, now_ms: float) -> list[Dispatch]:
        """The run finished (its kernels completed); a lower class may become the top class."""
        t = self._get_task(task_id)
        if t.inflight or t.waiting is not None:
            raise SchedulerError(f"task {task_id!r} ended with kernels in flight or waiting")
        del self._tasks[task_id]
        return self._release(now_ms)

    # -- kernels --------------------------------------------------------------------------------

    def launch(self, task_id: str, kernel: KernelId, now_ms: float) -> list[Dispatch]:
        """The task's host wants to launch ``kernel``; it waits until dispatched."""
        t = self._get_task(task_id)
        if t.waiting is not None:
            raise SchedulerError(f"task {task_id!r} launched while its last launch waits")
        svc = t.service
        svc.counters.launches += 1
        self._seq += 1
        pending = PendingLaunch(task_id, kernel, svc.priority, self._seq, now_ms)
        top = self.top_priority()
        out: list[Dispatch] = []
        if svc.priority == top:
            self._end_gap(t, now_ms)  # runtime feedback: a top-class launch ends the gap
            if self._may_dispatch_top(svc, now_ms):
                out.append(self._dispatch(pending, DispatchReason.TOP_CLASS, now_ms))
                return out
            svc.counters.backlog_held += 1
            self._backlog_seqs.add(pending.seq)
        else:
            svc.counters.preemptions += 1
        t.waiting = pending
        self._queues.push(pending)
        out.extend(self._fill_open_gap(now_ms))
        return out

    def complete(self, task_id: str, now_ms: float) -> list[Dispatch]:
        """The task's oldest dispatched kernel finished on the device."""
        t = self._get_task(task_id)
        if not t.inflight:
            raise SchedulerError(f"task {task_id!r} completed a kernel it has not dispatched")
        kernel = t.inflight.popleft()
        for i, (tid, _) in enumerate(self._inflight):
            if tid == task_id:
                del self._inflight[i]
                break
        self._device_free_ms = now_ms + sum(d for _, d in self._inflight)
        t.last_kernel, t.last_end_ms = kernel, now_ms
        out = self._release(now_ms)
        if t.service.priority == self.top_priority() and not t.inflight and t.waiting is None:
            out.extend(self._open_gap(t, kernel, now_ms))
        return out

    # -- queries --------------------------------------------------------------------------------

    def top_priority(self) -> int | None:
        """The highest priority among the running tasks (None: none runs)."""
        return max((t.service.priority for t in self._tasks.values()), default=None)

    def highest_registered(self) -> int | None:
        return max((s.priority for s in self._services.values()), default=None)

    def sg_ms(self, service: str, kernel: KernelId) -> float | None:
        """The current gap prediction after ``kernel`` (SG, corrected by feedback)."""
        svc = self._get_service(service)
        return self._sg_of(svc, kernel)

    def snapshot(self) -> SchedulerView:
        running: dict[str, int] = {}
        for t in self._tasks.values():
            running[t.service.name] = running.get(t.service.name, 0) + 1
        return SchedulerView(
            top_priority=self.top_priority(),
            queued=len(self._queues),
            inflight=len(self._inflight),
            device_free_ms=self._device_free_ms,
            services={
                s.name: ServiceView(
                    s.name,
                    s.priority,
                    self._phase(s),
                    s.profile.runs,
                    running.get(s.name, 0),
                    ServiceCounters(**{k: getattr(s.counters, k) for k in _COUNTER_FIELDS}),
                )
                for s in self._services.values()
            },
        )

    # -- internals ------------------------------------------------------------------------------

    def _get_service(self, name: str) -> _Service:
        try:
            return self._services[name]
        except KeyError:
            raise SchedulerError(f"unknown service {name!r}") from None

    def _get_task(self, task_id: str) -> _Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise SchedulerError(f"unknown task {task_id!r}") from None

    def _phase(self, svc: _Service) -> TaskPhase:
        if svc.profile.runs >= self.config.measure_runs:
            return TaskPhase.SHARING
        return TaskPhase.MEASURING

    def _sk_of(self, svc: _Service, kernel: KernelId) -> float | None:
        if self._phase(svc) is TaskPhase.MEASURING:
            return None
        return svc.profile.sk_ms(kernel)

    def _sg_of(self, svc: _Service, kernel: KernelId) -> float | None:
        if self._phase(svc) is TaskPhase.MEASURING:
            return None
        corrected = self._sg.get((svc.name, kernel))
        return corrected if corrected is not None else svc.profile.sg_ms(kernel)

    def _backlog_ms(self) -> float:
        """Predicted device time of every dispatched, unfinished kernel (the running one whole:
        a kernel slower than its SK never lets the backlog grow past the horizon)."""
        return sum(d for _, d in self._inflight)

    def _may_dispatch_top(self, svc: _Service, now_ms: float) -> bool:
        if svc.priority == self.highest_registered():
            return True
        return self._backlog_ms() <= self.config.backlog_horizon_ms + 1e-9

    def _dispatch(self, p: PendingLaunch, reason: DispatchReason, now_ms: float) -> Dispatch:
        t = self._tasks[p.task_id]
        svc = t.service
        sk = self._sk_of(svc, p.kernel)
        dur = sk if sk is not None else self.config.unknown_kernel_ms
        if reason is DispatchReason.GAP_FILL:
            dur += self.config.fill_overhead_ms
        start = max(now_ms, self._device_free_ms) if self._inflight else now_ms
        self._device_free_ms = start + dur
        self._inflight.append((p.task_id, dur))
        t.inflight.append(p.kernel)
        c = svc.counters
        if reason is DispatchReason.TOP_CLASS:
            c.dispatched_top += 1
        elif reason is DispatchReason.GAP_FILL:
            c.fills += 1
        elif reason is DispatchReason.RESUMED:
            c.resumed += 1
        return Dispatch(p.task_id, p.kernel, reason, now_ms, p.seq, sk, self._device_free_ms)

    def _take(self, p: PendingLaunch, reason: DispatchReason, now_ms: float) -> Dispatch:
        """Dispatch a held launch (it leaves its queue)."""
        self._queues.remove(p)
        self._tasks[p.task_id].waiting = None
        return self._dispatch(p, reason, now_ms)

    def _release(self, now_ms: float) -> list[Dispatch]:
        """Dispatch the held launches of the top class, FIFO, as far as the backlog allows."""
        top = self.top_priority()
        if top is None:
            return []
        out: list[Dispatch] = []
        for p in self._queues.at_level(top):
            svc = self._tasks[p.task_id].service
            if not self._may_dispatch_top(svc, now_ms):
                break
            if p.seq in self._backlog_seqs:
                self._backlog_seqs.discard(p.seq)
                reason = DispatchReason.BACKLOG
            else:
                reason = DispatchReason.RESUMED
            out.append(self._take(p, reason, now_ms))
        if out:
            return out
        return self._fill_open_gap(now_ms)

    def _end_gap(self, t: _Task, now_ms: float) -> None:
        """Runtime feedback on a top-class launch: the gap is over; correct its prediction."""
        svc = t.service
        if t.gap_end_ms is not None and t.gap_fills and self._inflight:
            svc.counters.gaps_cut += 1  # fills of its gap are still on the device
        t.gap_end_ms = None
        t.gap_fills = 0
        alpha = self.config.gap_feedback_alpha
        if alpha > 0 and t.last_kernel is not None and t.last_end_ms is not None and not t.inflight:
            observed = max(0.0, now_ms - t.last_end_ms)
            old = self._sg_of(svc, t.last_kernel)
            if old is not None:
                self._sg[(svc.name, t.last_kernel)] = (1.0 - alpha) * old + alpha * observed

    def _open_gap(self, t: _Task, kernel: KernelId, now_ms: float) -> list[Dispatch]:
        """The top-class task ``t`` has no kernel left on the device: a gap starts now."""
        svc = t.service
        sg = self._sg_of(svc, kernel)
        if sg is None or sg < self.config.min_gap_ms:
            t.gap_end_ms = None
            svc.counters.gaps_skipped += 1
            return []
        t.gap_end_ms = now_ms + sg
        t.gap_fills = 0
        return self._fill_open_gap(now_ms)

    def _window_end(self) -> float | None:
        """End of the idle window all top-class tasks leave (None: no window)."""
        top = self.top_priority()
        if top is None:
            return None
        end: float | None = None
        for t in self._tasks.values():
            if t.service.priority != top:
                continue
            if t.gap_end_ms is None or t.inflight or t.waiting is not None:
                return None
            end = t.gap_end_ms if end is None else min(end, t.gap_end_ms)
        return end

    def _fill_open_gap(self, now_ms: float) -> list[Dispatch]:
        """BestPrioFit over the lower classes into what is left of the open window."""
        end = self._window_end()
        top = self.top_priority()
        if end is None or top is None or not len(self._queues):
            return []
        start = max(now_ms, self._device_free_ms) if self._inflight else now_ms
        remaining = end - start
        if top != self.highest_registered():  # the backlog horizon covers fills too
            remaining = min(remaining, self.config.backlog_horizon_ms - self._backlog_ms())

        def duration_of(p: PendingLaunch) -> float | None:
            if p.priority >= top:
                return None
            return self._sk_of(self._tasks[p.task_id].service, p.kernel)

        fits: list[Fit] = fill_remaining(
            self._queues, remaining, duration_of, overhead_ms=self.config.fill_overhead_ms
        )
        out: list[Dispatch] = []
        owners = [t for t in self._tasks.values() if t.service.priority == top]
        for f in fits:
            self._tasks[f.launch.task_id].waiting = None
            out.append(self._dispatch(f.launch, DispatchReason.GAP_FILL, now_ms))
            for o in owners:
                if o.gap_fills == 0:
                    o.service.counters.gaps_filled += 1
                o.gap_fills += 1
                o.service.counters.fill_ms += f.duration_ms / len(owners)
        return out


_COUNTER_FIELDS = tuple(ServiceCounters.__dataclass_fields__)
