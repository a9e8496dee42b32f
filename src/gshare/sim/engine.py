"""The simulator's event loop: a heap of ``(time_ms, priority, seq, callback)`` in virtual time.

NOTE (docs/DESIGN.md §4, §8.3 — SimPy ``core.py``): events are ordered by virtual time, then by
a small integer priority (lower first; the one table is ``sim.priorities``: e.g. window ticks
before burst ends before arrivals at the same instant), then by a per-run sequence number, so a
run is deterministic for a seed. The loop is written by hand because it is the simulator's hot
path: ``bench/engine.py`` measures its events per second against the same model written with
SimPy in the same run.

Who calls it: every simulated mechanism (``sim.gpu``, ``sim.instance``, workloads) schedules
callbacks with ``at``/``after``; an experiment calls ``run(until_ms)``. A callback may schedule
further events; time never goes backwards (``at`` in the past is an error).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from gshare.sim.priorities import PRIO_DEFAULT

Callback = Callable[[], Any]


class SimulationError(RuntimeError):
    """A mechanism asked for something impossible (an event in the past, ...)."""


class EventLoop:
    """Deterministic discrete-event loop in virtual milliseconds."""

    __slots__ = ("_heap", "_seq", "now_ms", "events_processed", "_stopped")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Callback]] = []
        self._seq = 0
        self.now_ms = 0.0
        """Current virtual time; advanced only by ``run``."""
        self.events_processed = 0
        self._stopped = False

    def at(self, time_ms: float, callback: Callback, priority: int = PRIO_DEFAULT) -> None:
        """Schedule ``callback`` at absolute virtual time ``time_ms`` (>= now)."""
        if time_ms < self.now_ms - 1e-9:
            raise SimulationError(f"event at {time_ms} ms is before now ({self.now_ms} ms)")
        self._seq += 1
        heapq.heappush(self._heap, (time_ms, priority, self._seq, callback))

    def after(self, delay_ms: float, callback: Callback, priority: int = PRIO_DEFAULT) -> None:
        """Schedule ``callback`` ``delay_ms`` (>= 0) after now."""
        self.at(self.now_ms + delay_ms, callback, priority)

    def stop(self) -> None:
        """Stop ``run`` after the current event."""
        self._stopped = True

    @property
    def pending(self) -> int:
        return len(self._heap)

    def run(self, until_ms: float = float("inf")) -> None:
        """Process events in order until the heap is empty, ``until_ms`` or ``stop()``.

        On return ``now_ms`` is ``until_ms`` when that bound was reached (finite), so metrics
        that integrate over time can close their intervals at the horizon.
        """
        heap = self._heap
        pop = heapq.heappop
        self._stopped = False
        n = 0
        while heap and not self._stopped:
            t = heap[0][0]
            if t > until_ms:
                break
            _, _, _, cb = pop(heap)
            self.now_ms = t
            cb()
            n += 1
        self.events_processed += n
        if until_ms != float("inf") and not self._stopped and self.now_ms < until_ms:
            self.now_ms = until_ms
