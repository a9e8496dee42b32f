"""The simulator of resource-centric sizing (BulkX; experiment ``bulkx-sizing``).

* ``apps`` — the 990 Azure Functions 2019 apps (memory and duration percentiles, invocations
  per minute; joined on ``HashApp``) and how an invocation is drawn from them;
* ``accounting`` — what each policy (fixed at the maximum, fixed at p99 with kills, BulkX
  solved on a training prefix, BulkX re-solved per window) reserves per invocation, with
  ``policy.sizing.solve_sizing`` and the run-time growth rule ``policy.memory.grow_limit``;
* ``cluster`` — the capacity model: a memory-bounded cluster of ``policy.memory.DeviceMemory``
  ledgers in virtual time (``sim.engine``), and the highest invocation rate each policy
  sustains with the same total memory.
"""

from gshare.sim.sizing.accounting import (
    AppInvocations,
    AppOutcome,
    PolicyKind,
    PolicySpec,
    Reservation,
    draw_invocations,
    evaluate,
    reservation,
)
from gshare.sim.sizing.apps import AppTrace, TraceError, load_apps, pick_apps
from gshare.sim.sizing.cluster import (
    Capacity,
    RunResult,
    StreamItem,
    draw_stream,
    simulate,
    sustained_rate,
)

__all__ = [
    "AppInvocations",
    "AppOutcome",
    "AppTrace",
    "Capacity",
    "PolicyKind",
    "PolicySpec",
    "Reservation",
    "RunResult",
    "StreamItem",
    "TraceError",
    "draw_invocations",
    "draw_stream",
    "evaluate",
    "load_apps",
    "pick_apps",
    "reservation",
    "simulate",
    "sustained_rate",
]
