"""The controller's gauges in ``/metrics``: instances per function and state, requested and
achieved shares, the predicted rate, the queue, the admission's service interval, reserved and
used memory.

Who calls it: ``Controller.reconcile``, once per period, after the step and the drains. What
must hold: it only writes the gauges (the instance gauge is cleared and set whole, so states
that emptied disappear); profiling instances are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gshare.runtime.control.records import FunctionState, LiveInstance
from gshare.runtime.metrics import Metrics


def set_gauges(
    metrics: Metrics,
    instances: Mapping[str, LiveInstance],
    functions: Mapping[str, FunctionState],
    queued: Callable[[str], int],
    service_interval_s: Callable[[str], float | None],
) -> None:
    """Set the gauges from the controller's records; ``queued``: requests waiting at the
    gateway for a function (``Gateway.queued``); ``service_interval_s``: its admission's
    measured interval (``Gateway.service_interval_s``; a function without one has no series)."""
    mt = metrics
    mt.instances.clear()
    counts: dict[tuple[str, str], int] = {}
    for i in instances.values():
        if i.profiling:
            continue
        key = (i.function, i.state.value)
        counts[key] = counts.get(key, 0) + 1
        mt.requested_share.labels(i.function, i.instance_id).set(i.share.quota_request)
        if i.achieved_share is not None:
            mt.achieved_share.labels(i.function, i.instance_id).set(i.achieved_share)
        if i.token_idle_hold_ms is not None:
            mt.token_idle_hold.labels(i.function, i.instance_id).set(i.token_idle_hold_ms / 1e3)
    for (fn, st), n in counts.items():
        mt.instances.labels(fn, st).set(n)
    for name, fs in functions.items():
        mt.predicted_rps.labels(name).set(fs.predicted_rps)
        mt.queued.labels(name).set(queued(name))
        interval = service_interval_s(name)
        if interval is not None:
            mt.admission_interval.labels(name).set(interval)
        if fs.memory.usage:
            usage = fs.memory.usage.values()
            mt.memory_reserved.labels(name).set(sum(u.limit_mb for u in usage))
            mt.memory_used.labels(name).set(sum(u.samples[-1][0] for u in usage if u.samples))


__all__ = ["set_gauges"]
