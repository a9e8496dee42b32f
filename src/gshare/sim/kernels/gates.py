"""When a task's kernel launch may reach the device: the three modes of the kernel-level model.

Who calls it: ``sim.kernels.stream.HostStream`` reports its tasks' events to its gate
(``arrive``, ``begin``, ``launch``, ``complete``, ``end``); the gate answers a launch by calling
``stream.dispatched(index, delay_ms)``, at once or later. The modes:

* ``SharingGate`` — NVIDIA's default sharing: every launch goes to the device at once; the
  device's time-slicing (``sim.kernels.device``) interleaves the processes. No priorities.
* ``ExclusiveGate`` — exclusive mode run by an external program (FIKIT §2.2): one task at a
  time, in arrival order; a task's launches wait until every task that arrived before it ended.
* ``FikitGate`` — ``policy.priority.FikitScheduler`` decides (the same policy a live priority
  server would run). Costs of the interception are the stream's (``HookCosts``); a launch the
  scheduler held reaches the device ``release_ms`` after its dispatch (the blocked host thread
  wakes up), one dispatched in the call that reported it at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gshare.policy.priority import (
    Dispatch,
    DispatchReason,
    FikitScheduler,
    KernelId,
    KernelSpan,
    TaskPhase,
)

if TYPE_CHECKING:
    from gshare.sim.kernels.stream import HostStream


class Gate:
    """The sharing gate (every launch at once); the other modes override what they need."""

    hooked = False
    """Whether launches pass through FIKIT's interception (and pay ``HookCosts``)."""

    def arrive(self, stream: HostStream, task_id: str) -> None:
        """A task of ``stream`` arrived (it may wait for the stream's previous task)."""

    def begin(self, stream: HostStream, task_id: str) -> None:
        """The stream starts running the task (its first host segment begins)."""

    def launch(self, stream: HostStream, task_id: str, index: int, kernel: KernelId) -> None:
        stream.dispatched(index, 0.0)

    def complete(self, stream: HostStream, task_id: str) -> None:
        """The task's oldest kernel on the device finished."""

    def end(self, stream: HostStream, task_id: str) -> None:
        """The task finished (all its kernels completed)."""

    def measuring(self, stream: HostStream) -> bool:
        """Whether the stream's next task runs in FIKIT's measurement phase."""
        return False

    def add_run(self, stream: HostStream, run: list[tuple[KernelId, float, float]]) -> None:
        """A measured run of the stream (measurement phase only)."""


class SharingGate(Gate):
    """Default sharing: nothing is held."""


@dataclass
class ExclusiveGate(Gate):
    """One task at a time, in arrival order."""

    _order: deque[str] = field(default_factory=deque)
    _held: dict[str, tuple[HostStream, int]] = field(default_factory=dict)

    def arrive(self, stream: HostStream, task_id: str) -> None:
        self._order.append(task_id)

    def launch(self, stream: HostStream, task_id: str, index: int, kernel: KernelId) -> None:
        if self._order and self._order[0] == task_id:
            stream.dispatched(index, 0.0)
        else:
            self._held[task_id] = (stream, index)

    def end(self, stream: HostStream, task_id: str) -> None:
        if self._order and self._order[0] == task_id:
            self._order.popleft()
        elif task_id in self._order:
            self._order.remove(task_id)
        if self._order:
            held = self._held.pop(self._order[0], None)
            if held is not None:
                held[0].dispatched(held[1], 0.0)


@dataclass
class FikitGate(Gate):
    """Kernel launches decided by ``FikitScheduler`` (see the module docstring)."""

    scheduler: FikitScheduler
    clock: Callable[[], float]
    """The event loop's time."""
    release_ms: float = 0.0
    _pending: dict[str, tuple[HostStream, int]] = field(default_factory=dict)
    reasons: dict[DispatchReason, int] = field(default_factory=dict)
    hooked = True

    def _now(self) -> float:
        return self.clock()

    def _apply(self, decisions: list[Dispatch], launching: str | None = None) -> None:
        for d in decisions:
            self.reasons[d.reason] = self.reasons.get(d.reason, 0) + 1
            stream, index = self._pending.pop(d.task_id)
            delay = 0.0 if d.task_id == launching else self.release_ms
            stream.dispatched(index, delay)

    def begin(self, stream: HostStream, task_id: str) -> None:
        self._apply(self.scheduler.begin_task(task_id, stream.name, self._now()))

    def launch(self, stream: HostStream, task_id: str, index: int, kernel: KernelId) -> None:
        self._pending[task_id] = (stream, index)
        self._apply(self.scheduler.launch(task_id, kernel, self._now()), launching=task_id)

    def complete(self, stream: HostStream, task_id: str) -> None:
        self._apply(self.scheduler.complete(task_id, self._now()))

    def end(self, stream: HostStream, task_id: str) -> None:
        self._apply(self.scheduler.end_task(task_id, self._now()))

    def measuring(self, stream: HostStream) -> bool:
        return self.scheduler.phase(stream.name) is TaskPhase.MEASURING

    def add_run(self, stream: HostStream, run: list[tuple[KernelId, float, float]]) -> None:
        self.scheduler.profile(stream.name).add_run([KernelSpan(k, s, e) for k, s, e in run])
