"""A GPU that executes kernels of several processes by NVIDIA's time-slicing, in virtual time.

Who calls it: ``sim.kernels.stream.HostStream`` submits each dispatched kernel with
``submit(context, job)``; the device calls ``job.on_start`` / ``job.on_done``. Every mode of the
kernel-level model (exclusive, default sharing, FIKIT) runs on this same device, so they differ
only in *when* kernels are handed to it.

NOTE — default time-slicing (NVIDIA's documented behaviour; FIKIT §2.1 "time slicing").
Without MPS, kernels of different processes (CUDA contexts) never run at the same time. Each
context has a FIFO of submitted kernels; the GPU's scheduler runs one context at a time and
round-robins over the contexts that have work: the running context keeps the GPU while it has
work and its timeslice has not expired; a context with no work is skipped at once
(work-conserving). NVIDIA DRIVE OS "GPU scheduling": the timeslice "specifies the maximum time a
channel can use an engine uninterrupted"; the default TSG timeslice of NVIDIA's nvgpu driver is
1024 µs and its minimum 1000 µs (``NVGPU_TSG_TIMESLICE_DEFAULT_US``/``_MIN_US``) — we use the
default, which is also the setting most favourable to a latency-sensitive context. When the
slice expires while another context waits, the running kernel is preempted (Pascal+ compute
preemption) and resumes later where it stopped. A change of context costs ``switch_ms``; NVIDIA
publishes no figure (the MPS documentation only says that without MPS the scheduling resources
"must be swapped on and off the GPU"): we charge 25 µs, and ``fikit-sharing`` reports every pair
at 0 µs too (the setting most favourable to sharing). Nothing else slows the baseline.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gshare.sim.engine import EventLoop
from gshare.sim.priorities import PRIO_GPU

DEFAULT_TIMESLICE_MS = 1.024
DEFAULT_SWITCH_MS = 0.025


@dataclass(slots=True)
class KernelJob:
    """One kernel on the device."""

    duration_ms: float
    on_done: Callable[[float], None]
    """Called with the completion time."""
    on_start: Callable[[float], None] | None = None
    """Called with the time the kernel first starts executing."""
    remaining_ms: float = -1.0
    started_ms: float | None = None
    submitted_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.remaining_ms < 0:
            self.remaining_ms = self.duration_ms


@dataclass(slots=True)
class DeviceStats:
    busy_ms: float = 0.0
    """Time a kernel was executing."""
    switch_ms: float = 0.0
    """Time spent switching contexts."""
    switches: int = 0
    preemptions: int = 0
    kernels: int = 0


@dataclass
class KernelDevice:
    """One GPU in virtual time (module docstring)."""

    loop: EventLoop
    timeslice_ms: float = DEFAULT_TIMESLICE_MS
    switch_ms: float = DEFAULT_SWITCH_MS
    stats: DeviceStats = field(default_factory=DeviceStats)
    trace: list[tuple[str, float, float, float]] | None = None
    """When a list: every finished kernel is appended as ``(context, submitted, started,
    finished)`` (tests check execution order from it). None (the default): no trace."""

    def __post_init__(self) -> None:
        self._queues: dict[str, deque[KernelJob]] = {}
        self._ring: list[str] = []
        self._current: str | None = None
        self._slice_start = 0.0
        self._running: KernelJob | None = None
        self._run_start = 0.0
        self._busy_switching = False
        self._version = 0
        self._armed = -1

    def submit(self, context: str, job: KernelJob) -> None:
        """Hand a kernel of ``context`` to the device (its FIFO); it runs when scheduled."""
        q = self._queues.get(context)
        if q is None:
            q = self._queues[context] = deque()
            self._ring.append(context)
        job.submitted_ms = self.loop.now_ms
        q.append(job)
        if self._running is None and not self._busy_switching:
            self._schedule_next()
        elif self._running is not None and context != self._current:
            self._arm_slice_check()

    def pending(self, context: str) -> int:
        q = self._queues.get(context)
        return len(q) if q else 0

    @property
    def idle(self) -> bool:
        return self._running is None and not self._busy_switching

    # -- internals ------------------------------------------------------------------------------

    def _others_waiting(self) -> bool:
        return any(q for c, q in self._queues.items() if c != self._current)

    def _pick(self) -> str | None:
        now = self.loop.now_ms
        cur = self._current
        in_slice = now - self._slice_start < self.timeslice_ms - 1e-9
        if cur is not None and self._queues.get(cur) and (in_slice or not self._others_waiting()):
            return cur
        n = len(self._ring)
        start = self._ring.index(cur) + 1 if cur in self._ring else 0
        for i in range(n):
            c = self._ring[(start + i) % n]
            if self._queues[c]:
                return c
        return None

    def _schedule_next(self) -> None:
        ctx = self._pick()
        if ctx is None:
            return
        now = self.loop.now_ms
        if ctx != self._current:
            self._busy_switching = True
            self.stats.switches += 1
            self.stats.switch_ms += self.switch_ms
            self.loop.at(now + self.switch_ms, lambda: self._switched(ctx), PRIO_GPU)
            return
        if now - self._slice_start >= self.timeslice_ms - 1e-9:
            self._slice_start = now  # nobody else waits: a new slice
        self._start(ctx)

    def _switched(self, ctx: str) -> None:
        self._busy_switching = False
        self._current = ctx
        self._slice_start = self.loop.now_ms
        if self._queues[ctx]:
            self._start(ctx)
        else:
            self._schedule_next()

    def _start(self, ctx: str) -> None:
        job = self._queues[ctx].popleft()
        now = self.loop.now_ms
        self._running = job
        self._run_start = now
        if job.started_ms is None:
            job.started_ms = now
            if job.on_start is not None:
                job.on_start(now)
        self._version += 1
        v = self._version
        self.loop.at(now + job.remaining_ms, lambda: self._finish(v), PRIO_GPU)
        self._arm_slice_check()

    def _arm_slice_check(self) -> None:
        if self._running is None or self._armed == self._version or not self._others_waiting():
            return
        self._armed = self._version
        end = self._slice_start + self.timeslice_ms
        if end < self._run_start + self._running.remaining_ms - 1e-9:
            v = self._version
            self.loop.at(max(end, self.loop.now_ms), lambda: self._slice_expired(v), PRIO_GPU)

    def _slice_expired(self, version: int) -> None:
        if version != self._version or self._running is None or not self._others_waiting():
            return
        now = self.loop.now_ms
        job = self._running
        job.remaining_ms -= now - self._run_start
        self.stats.busy_ms += now - self._run_start
        self.stats.preemptions += 1
        assert self._current is not None
        self._queues[self._current].appendleft(job)
        self._running = None
        self._version += 1
        self._schedule_next()

    def _finish(self, version: int) -> None:
        if version != self._version:
            return
        job = self._running
        assert job is not None
        now = self.loop.now_ms
        self.stats.busy_ms += now - self._run_start
        self.stats.kernels += 1
        job.remaining_ms = 0.0
        self._running = None
        self._version += 1
        if self.trace is not None:
            assert self._current is not None and job.started_ms is not None
            self.trace.append((self._current, job.submitted_ms, job.started_ms, now))
        job.on_done(now)
        if self._running is None and not self._busy_switching:
            self._schedule_next()
