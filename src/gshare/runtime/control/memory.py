"""The controller's side of resource-centric memory sizing (BulkX; docs/DESIGN.md §5).

Who calls it: ``Controller`` keeps one ``FunctionMemory`` per function. ``plan`` gives the
memory an instance starts with (``InstanceLaunch.mem_mb``, ``mem_step_mb``, ``mem_max_mb``);
``observe`` takes each instance's ``MemoryUsage`` from its node's status (the per-batch peaks
the instance measured, and the ledger's counters); ``resolve`` re-solves ``init``/``step`` of a
``mem_mb: auto`` function from the peaks seen (``policy.sizing.solve_sizing``) when enough new
ones arrived, and returns the new plan for the controller to push to the running instances
(``set_memory``) and use for the next ones.

What must hold: a fixed ``mem_mb`` and a manual ``{init, step, max}`` are never changed; an
``auto`` plan never has ``init`` below 0 or ``step`` below ``MIN_STEP_MB``; the history is
bounded (``HISTORY``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gshare.policy.memory import MemoryPlan
from gshare.policy.sizing import Demand, SizingError, solve_sizing
from gshare.runtime.messages import MemoryUsage
from gshare.spec import FunctionSpec, MemSteps

AUTO_INIT_MB = 0.0
"""``auto`` before any measurement: start with no memory reserved ..."""
AUTO_STEP_MB = 64.0
"""... and grow by this much."""
MIN_STEP_MB = 8.0
HISTORY = 2_000
"""Per-batch peaks kept per function for the solver (the most recent)."""
RESOLVE_AFTER = 8
"""New peaks needed before ``auto`` is re-solved."""
COST_FACTOR = 1.0
"""BulkX's cost factor of a scale-up step relative to reserved memory (``policy.sizing``)."""
WASTE_THRESHOLD = 0.1
"""BulkX's bound on the waste of over-allocation (``policy.sizing``)."""
STEP_COST_MB = 16.0
"""The price of one scale-up in MiB of reservation (``policy.sizing``'s ``step_cost_mb``):
live, a grow costs a round trip to the ledger and a watchdog period, so the literal objective's
one-MiB steps would be the wrong answer (docs/journal/sizing.md)."""


@dataclass
class FunctionMemory:
    """One function's memory sizing state (see the module doc)."""

    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """(peak MiB, execution s) per measured batch, oldest first."""
    seen: dict[str, int] = field(default_factory=dict)
    """Per instance: ``samples_total`` already taken (restarts count again from 0)."""
    new_since_solve: int = 0
    solved: MemoryPlan | None = None
    usage: dict[str, MemoryUsage] = field(default_factory=dict)
    """The last ``MemoryUsage`` of each live instance."""

    def plan(self, spec: FunctionSpec) -> MemoryPlan:
        res = spec.resources
        if isinstance(res, str):
            return MemoryPlan()
        mem = res.mem_mb
        if isinstance(mem, MemSteps):
            return MemoryPlan(float(mem.init), float(mem.step), float(mem.max))
        if mem == "auto":
            return self.solved or MemoryPlan(AUTO_INIT_MB, AUTO_STEP_MB, 0.0)
        return MemoryPlan(float(mem), 0.0, float(mem))

    def observe(self, instance_id: str, usage: MemoryUsage) -> tuple[int, int, int]:
        """Take an instance's report; returns the growth since its last one, for the metrics:
        (grows, steps, refusals)."""
        old = self.usage.get(instance_id)
        self.usage[instance_id] = usage
        delta = (
            (0, 0, 0)
            if old is None
            else (
                max(0, usage.grows - old.grows),
                max(0, usage.steps - old.steps),
                max(0, usage.refusals - old.refusals),
            )
        )
        if old is None:
            delta = (usage.grows, usage.steps, usage.refusals)
        seen = self.seen.get(instance_id, 0)
        if usage.samples_total < seen:  # restarted: counting again
            seen = 0
        fresh = min(usage.samples_total - seen, len(usage.samples))
        if fresh > 0:
            self.history.extend(usage.samples[-fresh:])
            self.new_since_solve += fresh
        self.seen[instance_id] = usage.samples_total
        return delta

    def forget(self, instance_id: str) -> None:
        self.seen.pop(instance_id, None)
        self.usage.pop(instance_id, None)

    def resolve(self, spec: FunctionSpec) -> MemoryPlan | None:
        """Re-solve an ``auto`` function's sizing when ``RESOLVE_AFTER`` new peaks arrived;
        the new plan when it changed, else None."""
        res = spec.resources
        if isinstance(res, str) or res.mem_mb != "auto":
            return None
        if self.new_since_solve < RESOLVE_AFTER or not self.history:
            return None
        self.new_since_solve = 0
        try:
            s = solve_sizing(
                [Demand(peak, max(exec_s, 1e-6)) for peak, exec_s in self.history],
                COST_FACTOR,
                WASTE_THRESHOLD,
                step_cost_mb=STEP_COST_MB,
            )
        except SizingError:
            return None
        plan = MemoryPlan(max(0.0, s.init_mb), max(MIN_STEP_MB, s.step_mb), 0.0)
        if plan == self.solved:
            return None
        self.solved = plan
        return plan


__all__ = ["FunctionMemory", "MemoryPlan"]
