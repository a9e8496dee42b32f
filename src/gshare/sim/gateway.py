"""The simulated gateway: routes each request of a function to one of its instances.

Routing is ``policy.routing.choose_instance`` (the live gateway's rule): join the shortest
queue among ready instances, ties by instance id for determinism (the instances are kept sorted
by id); while a function has only instances that are still starting, the request waits in the
queue of the least loaded of them (it is served after the cold start); while it has none at
all, the request waits at the gateway (``on_cold`` tells the controller at once) and is handed
to the first instance that is added. Nothing accepted is dropped: ``pending`` counts what is
still waiting.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

from gshare.policy.routing import Candidate, choose_instance
from gshare.sim.engine import EventLoop
from gshare.sim.instance import SimInstance
from gshare.sim.request import RequestLog, SimRequest


class Gateway:
    def __init__(self, loop: EventLoop, log: RequestLog | None = None) -> None:
        self.loop = loop
        self.log = log or RequestLog()
        self._instances: dict[str, list[SimInstance]] = {}
        self._pending: dict[str, deque[SimRequest]] = {}
        self._slo_ms: dict[str, float | None] = {}
        self._next_id = 0
        self.arrivals: dict[str, int] = {}
        """Requests submitted per function (the controller's rate measurements read it)."""
        self.last_activity_ms: dict[str, float] = {}
        """Later of the last arrival and the last answer per function (keep-alive's clock)."""
        self.outstanding: dict[str, int] = {}
        """Requests submitted and not completed, per function."""
        self.on_complete_hooks: list[Callable[[SimRequest], None]] = []
        self.on_cold: Callable[[str], None] | None = None
        """Called when a request arrives for a function with no instance (a cold start)."""

    def register(self, function: str, slo_ms: float | None = None) -> None:
        self._instances.setdefault(function, [])
        self._pending.setdefault(function, deque())
        self._slo_ms[function] = slo_ms
        self.arrivals.setdefault(function, 0)
        self.outstanding.setdefault(function, 0)

    def instances(self, function: str) -> list[SimInstance]:
        return list(self._instances.get(function, []))

    def add_instance(self, inst: SimInstance) -> None:
        fn = inst.config.function
        if fn not in self._instances:
            self.register(fn)
        bisect.insort(self._instances[fn], inst, key=lambda i: i.instance_id)
        pending = self._pending[fn]
        while pending:
            inst.enqueue(pending.popleft())

    def remove_instance(self, inst: SimInstance) -> None:
        """Stop routing to ``inst`` and drain it (its queued requests still complete)."""
        fn = inst.config.function
        if inst in self._instances.get(fn, []):
            self._instances[fn].remove(inst)
        inst.drain()

    def pending(self, function: str) -> int:
        return len(self._pending.get(function, ()))

    def completed(self, req: SimRequest) -> None:
        """Instances call this for each finished request."""
        self.log.record(req)
        self.outstanding[req.function] -= 1
        self.last_activity_ms[req.function] = self.loop.now_ms
        for hook in self.on_complete_hooks:
            hook(req)

    def submit(self, function: str) -> SimRequest:
        """A request arrives now; route it."""
        if function not in self._instances:
            raise KeyError(f"unknown function {function!r}")
        self._next_id += 1
        req = SimRequest(self._next_id, function, self.loop.now_ms, self._slo_ms.get(function))
        self.arrivals[function] += 1
        self.outstanding[function] += 1
        self.last_activity_ms[function] = self.loop.now_ms
        self.log.submitted += 1
        live = [i for i in self._instances[function] if not i.draining and not i.stopped]
        pick = choose_instance(
            [Candidate(i.outstanding, i.ready) for i in live], wait_at_starting=True
        )
        if pick is None:
            self._pending[function].append(req)
            if self.on_cold is not None:
                self.on_cold(function)
            return req
        live[pick].enqueue(req)
        return req
