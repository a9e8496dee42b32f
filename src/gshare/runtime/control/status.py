"""The live status of a server as one JSON document: what the status page (``/ui``) draws.

Who calls it: ``ControlApi.status_view`` for ``GET /system/status`` (bearer token). Read-only:
it looks at the controller's devices, the placer's rectangles, the instances and the gateway's
recent latencies, and changes nothing.

Shape (every size in the units of its name)::

    {"time_s": ..., "devices": [{"index", "node_id", "name", "alive", "memory_capacity_mb",
       "rects": [{"instance", "function", "x", "y", "w", "h"}]}],        # x: quota %, y: SM %
     "functions": [{"name", "slo_ms", "priority", "observed_rps", "predicted_rps", "p50_ms",
       "p99_ms", "latency_samples", "queued",
       "instances": [{"id", "state", "device", "sm_pct", "quota_request", "quota_limit",
                      "achieved_share", "mem_limit_mb"}]}],
     "workflows": [{"name", "version", "slo_ms", "stages": [{"name", "function", "after"}],
       "missing_functions", "requests", "slo_hit_rate", "p50_ms", "p99_ms",
       "latency_samples"}]}
"""

from __future__ import annotations

import time

from gshare.runtime.control.fences import FENCE
from gshare.runtime.control.loop import Controller
from gshare.runtime.gateway.router import Gateway


def status_view(
    c: Controller, gateway: Gateway, workflows: list[dict[str, object]] | None = None
) -> dict[str, object]:
    """The document described in the module doc, from the controller's records and its
    gateway's latencies and queues (``workflows``: the workflow runner's ``status()``, none when
    not given)."""
    bindings = c.placer.bindings()
    by_instance = {iid: inst for iid, inst in c.instances.items()}
    devices: list[dict[str, object]] = []
    for d in c.devices:
        rects = []
        for iid, b in sorted(bindings.items()):
            if b.gpu != d.index or iid.startswith(FENCE):  # a lost node's device
                continue
            inst = by_instance.get(iid)
            rects.append(
                {
                    "instance": iid,
                    "function": inst.function if inst else "?",
                    "x": round(b.rect.x, 3),
                    "y": round(b.rect.y, 3),
                    "w": round(b.rect.w, 3),
                    "h": round(b.rect.h, 3),
                }
            )
        agent = c.agents.get(d.node_id)
        mem = None
        if agent is not None and d.local_index < len(agent.info.device_memory_mb):
            mem = agent.info.device_memory_mb[d.local_index]
        devices.append(
            {
                "index": d.index,
                "node_id": d.node_id,
                "name": d.name,
                "alive": bool(agent and agent.alive),
                "memory_capacity_mb": mem,
                "rects": rects,
            }
        )
    functions = []
    for name in sorted(c.functions):
        fs = c.functions[name]
        p50, p99, n = gateway.latency_quantiles(name)
        insts = sorted(
            (i for i in c.instances.values() if i.function == name and not i.profiling),
            key=lambda i: i.instance_id,
        )
        functions.append(
            {
                "name": name,
                "slo_ms": fs.spec.slo_ms,
                "priority": fs.spec.priority,
                "observed_rps": round(fs.observed_rps, 3),
                "predicted_rps": round(fs.predicted_rps, 3),
                "p50_ms": None if p50 is None else round(p50, 2),
                "p99_ms": None if p99 is None else round(p99, 2),
                "latency_samples": n,
                "queued": gateway.queued(name),
                "instances": [
                    {
                        "id": i.instance_id,
                        "state": i.state.value,
                        "device": i.device.index,
                        "sm_pct": i.share.sm_pct,
                        "quota_request": i.share.quota_request,
                        "quota_limit": i.share.quota_limit,
                        "achieved_share": None
                        if i.achieved_share is None
                        else round(i.achieved_share, 4),
                        "mem_limit_mb": i.share.mem_mb or None,
                    }
                    for i in insts
                ],
            }
        )
    return {
        "time_s": time.time(),
        "devices": devices,
        "functions": functions,
        "workflows": workflows or [],
    }


__all__ = ["status_view"]
