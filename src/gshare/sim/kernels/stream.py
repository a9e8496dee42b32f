"""One process on the device: a host thread that runs its tasks' launch streams.

Who calls it: ``sim.kernels.scenario`` creates one ``HostStream`` per service and feeds it task
arrivals; the stream reports to its ``Gate`` and submits dispatched kernels to the
``KernelDevice`` (its CUDA context is the stream's name).

A task runs its ``TaskModel``: before kernel i the host works ``host_ms[i]`` (times a per-task
jitter), then launches it. ``HostMode.SYNC``: the next host segment starts when the kernel
completed; ``HostMode.ASYNC``: when the launch was dispatched (at most ``queue_depth`` kernels
outstanding). A task ends when its last kernel completed; the stream then starts its next task
(tasks of one service run one at a time, in arrival order).

Interception costs (``HookCosts``, FIKIT mode only, with where the numbers come from):

* ``intercept_ms`` (2 µs) — every launch: the kernel ID (name from a per-function cache — the
  paper's -rdynamic name is a ``dladdr``, 0.02 µs measured on this machine; grid and block come
  with the launch), a hash lookup, and publishing the launch to the scheduler through shared
  memory with a futex wake (one syscall, ~1-2 µs). A launch of the top class does not wait for
  an answer: the holder never pays a round trip (why: docs/journal/priority.md);
* ``release_ms`` (30 µs) — a held launch reaches the device this long after its dispatch: the
  blocked host thread is woken over a socket; half of gshare's measured Unix-socket round trip
  (``bench/token_rtt.py``: 63 µs p50);
* ``measure_ms`` (40 µs) — every kernel in the measurement phase: two ``cudaEventRecord``, a
  ``cudaEventSynchronize`` (the host waits for the kernel and is woken) and the symbolised
  backtrace that yields the kernel's name (``backtrace`` + ``backtrace_symbols`` over ~30
  frames: 6-10 µs measured on this machine). The event figures are estimates (no GPU here). The
  measurement phase also makes an ASYNC host synchronous (it waits on every kernel's event).
  The measuring mechanism removes its own per-kernel cost from the gaps it records.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gshare.sim.engine import EventLoop
from gshare.sim.kernels.catalogue import HostMode, TaskModel
from gshare.sim.kernels.device import KernelDevice, KernelJob
from gshare.sim.kernels.gates import Gate
from gshare.sim.priorities import PRIO_CLIENT


@dataclass(frozen=True, slots=True)
class HookCosts:
    """FIKIT's interception costs (module docstring)."""

    intercept_ms: float = 0.002
    release_ms: float = 0.03
    measure_ms: float = 0.04


@dataclass(frozen=True, slots=True)
class Jitter:
    """Per-task multiplicative noise (lognormal, mean 1) on kernel durations and host segments."""

    kernel_sigma: float = 0.05
    host_sigma: float = 0.1


@dataclass(slots=True)
class TaskRecord:
    """One task of a service: when it arrived, began and ended (ms)."""

    service: str
    index: int
    arrival_ms: float
    begin_ms: float = float("nan")
    end_ms: float = float("nan")
    measured: bool = False
    """It ran in FIKIT's measurement phase."""

    @property
    def jct_ms(self) -> float:
        return self.end_ms - self.arrival_ms

    @property
    def done(self) -> bool:
        return self.end_ms == self.end_ms  # not NaN


def _noise(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    if sigma <= 0:
        return np.ones(n)
    return np.asarray(rng.lognormal(-0.5 * sigma * sigma, sigma, n))


@dataclass
class HostStream:
    """A service's process: its tasks, its host thread, its context on the device."""

    name: str
    model: TaskModel
    loop: EventLoop
    device: KernelDevice
    gate: Gate
    rng: np.random.Generator
    jitter: Jitter = field(default_factory=Jitter)
    hooks: HookCosts = field(default_factory=HookCosts)
    on_task_done: Callable[[TaskRecord], None] | None = None
    records: list[TaskRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[TaskRecord] = deque()
        self._task: TaskRecord | None = None
        self._task_id = ""
        self._durs: np.ndarray = np.zeros(0)
        self._hosts: np.ndarray = np.zeros(0)
        self._next = 0  # next kernel index to launch
        self._done = 0  # kernels completed
        self._inflight = 0
        self._blocked = False  # ASYNC: the launch waits for a free queue slot
        self._sync = True
        self._measuring = False
        self._spans: list[tuple[float, float]] = []
        self._offset = 0.0
        self._intercept = self.hooks.intercept_ms if self.gate.hooked else 0.0

    # -- arrivals -------------------------------------------------------------------------------

    def arrive(self) -> TaskRecord:
        """A task arrives now; it starts when the stream's previous tasks have ended."""
        rec = TaskRecord(self.name, len(self.records), self.loop.now_ms)
        self.records.append(rec)
        self.gate.arrive(self, self._tid(rec))
        self._queue.append(rec)
        if self._task is None:
            self._begin_next()
        return rec

    @property
    def busy(self) -> bool:
        return self._task is not None

    def _tid(self, rec: TaskRecord) -> str:
        return f"{self.name}#{rec.index}"

    def _begin_next(self) -> None:
        if not self._queue:
            return
        rec = self._queue.popleft()
        self._task = rec
        self._task_id = self._tid(rec)
        rec.begin_ms = self.loop.now_ms
        n = len(self.model.kernels)
        self._durs = np.array([k.duration_ms for k in self.model.kernels]) * _noise(
            self.rng, self.jitter.kernel_sigma, n
        )
        self._hosts = np.array(self.model.host_ms) * _noise(self.rng, self.jitter.host_sigma, n)
        self._next = self._done = self._inflight = 0
        self._blocked = False
        self._measuring = self.gate.measuring(self)
        rec.measured = self._measuring
        self._sync = self._measuring or self.model.host_mode is HostMode.SYNC
        self._spans = []
        self._offset = 0.0
        self.gate.begin(self, self._task_id)
        self._schedule_launch(0, 0.0)

    # -- the host thread ------------------------------------------------------------------------

    def _schedule_launch(self, i: int, extra_ms: float) -> None:
        delay = float(self._hosts[i]) + self._intercept + extra_ms
        self.loop.after(delay, lambda: self._launch(i), PRIO_CLIENT)

    def _launch(self, i: int) -> None:
        self._next = i + 1
        self.gate.launch(self, self._task_id, i, self.model.kernels[i].kernel)

    def dispatched(self, index: int, delay_ms: float) -> None:
        """The gate lets kernel ``index`` go; it reaches the device ``delay_ms`` later."""
        if delay_ms > 0:
            self.loop.after(delay_ms, lambda: self._submit(index), PRIO_CLIENT)
        else:
            self._submit(index)

    def _submit(self, index: int) -> None:
        self._inflight += 1
        job = KernelJob(float(self._durs[index]), functools.partial(self._completed, index))
        if self._measuring:
            job.on_start = self._measured_start
        self.device.submit(self.name, job)
        n = len(self.model.kernels)
        if not self._sync and index + 1 < n:
            if self._inflight >= self.model.queue_depth:
                self._blocked = True
            else:
                self._schedule_launch(index + 1, 0.0)

    def _measured_start(self, t: float) -> None:
        self._spans.append((t - self._offset, -1.0))

    def _completed(self, index: int, t: float) -> None:
        self._inflight -= 1
        self._done += 1
        if self._measuring:
            start, _ = self._spans[index]
            self._spans[index] = (start, t - self._offset)
            self._offset += self.hooks.measure_ms
        self.gate.complete(self, self._task_id)
        n = len(self.model.kernels)
        if self._done == n:
            self._finish_task()
            return
        if self._sync:
            extra = self.hooks.measure_ms if self._measuring else 0.0
            self._schedule_launch(index + 1, extra)
        elif self._blocked:
            self._blocked = False
            self._schedule_launch(self._next, 0.0)

    def _finish_task(self) -> None:
        rec = self._task
        assert rec is not None
        rec.end_ms = self.loop.now_ms
        if self._measuring:
            kernels = self.model.kernels
            self.gate.add_run(
                self, [(kernels[i].kernel, s, e) for i, (s, e) in enumerate(self._spans)]
            )
        self._task = None
        self.gate.end(self, self._task_id)
        if self.on_task_done is not None:
            self.on_task_done(rec)
        if self._task is None:
            self._begin_next()
