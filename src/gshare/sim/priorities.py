"""Event priorities of the simulator's event loops: at equal virtual time, lower runs first.

One table for every model (the GPU cluster of ``sim.cluster`` and the workflow cluster of
``sim.workflow``), so that the order of simultaneous events is visible in one place. Events of
equal time and priority run in the order they were scheduled (``sim.engine``).
"""

from __future__ import annotations

from typing import Final

PRIO_PHASE: Final = 0
"""An experiment switches a phase (clients on/off) before anything else of that instant."""
PRIO_TICK: Final = 1
"""A GPU's token-window tick: quotas roll over before anything else happens at that instant."""
PRIO_FINISH: Final = 2
"""A workflow task finishes (its container is free before new work is dispatched)."""
PRIO_GPU: Final = 3
"""A burst's launches or device work end on a simulated GPU."""
PRIO_CONTAINER: Final = 3
"""A workflow container becomes ready (after its cold start)."""
PRIO_CONTROL: Final = 4
"""The GPU cluster's controller step (periodic, or a cold-start nudge)."""
PRIO_DEFAULT: Final = 5
"""Anything scheduled without a priority (instance batch timers, cold-start ends)."""
PRIO_ARRIVAL: Final = 5
"""A request arrives from a workload."""
PRIO_CLIENT: Final = 5
"""A closed-loop client (the profiler's) sends its next request."""
PRIO_PREWARM: Final = 7
"""The workflow cluster's pre-warming tick."""
PRIO_EVICT: Final = 8
"""A workflow container's keep-alive expires."""
PRIO_ROUND: Final = 9
"""The workflow scheduler's round: after every arrival and finish of the instant."""

__all__ = [
    "PRIO_ARRIVAL",
    "PRIO_CLIENT",
    "PRIO_CONTAINER",
    "PRIO_CONTROL",
    "PRIO_DEFAULT",
    "PRIO_EVICT",
    "PRIO_FINISH",
    "PRIO_GPU",
    "PRIO_PHASE",
    "PRIO_PREWARM",
    "PRIO_ROUND",
    "PRIO_TICK",
]
