"""A deployed function as the gateway sees it: its queue, its instances' connections and what
the gateway measures of it (arrivals, the admission's service estimate, recent latencies).

Who uses it: ``router.Gateway`` keeps one ``FunctionRoute`` per function (``Gateway.routes``),
created by ``add_function``; ``gateway.stages`` (``staged``), ``gateway.streams`` and
``gateway.generation`` (``gen``) read and update it on the gateway's event loop, the only
thread that touches it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gshare.policy.admission import ServiceEstimate
from gshare.runtime.gateway.channel import InstanceChannel, Pending
from gshare.runtime.gateway.generation import GenerativeRoute

RECENT_LATENCIES = 1_000
"""Latencies kept per function for the status page's quantiles."""


@dataclass
class FunctionRoute:
    """A deployed function as the gateway sees it."""

    name: str
    slo_ms: float | None
    max_batch: int
    queue: deque[Pending] = field(default_factory=deque)
    channels: dict[str, InstanceChannel] = field(default_factory=dict)
    arrivals: int = 0
    last_arrival_s: float | None = None
    """``Gateway.clock`` at the last arrival (None: none since the server started)."""
    last_done_s: float | None = None
    """``Gateway.clock`` at the last answer (idle since the later of it and the last arrival)."""
    inputs: list[dict[str, object]] = field(default_factory=list)
    start_error: str | None = None
    """Why the function's last instance start failed (queued requests fail with it)."""
    waiting_reason: str | None = None
    """Why no instance can be started for it now (the controller's "no room ..."); a request
    that times out waiting for an instance names it. Cleared when an instance connects."""
    exec_ms_per_item: float | None = None
    """EWMA of the busy time per request (exec_ms / batch): the unprofiled throughput."""
    service: ServiceEstimate = field(default_factory=ServiceEstimate)
    """The measured service interval while backlogged (``policy.admission``)."""
    rr: int = 0
    staged: int = 0
    """Jobs of this function waiting in the live workflow scheduler's AFW queues
    (``gateway.stages``): queued demand the controller must see like ``queue``."""
    internal: bool = False
    """The controller's own route (a profiling instance): not reachable over HTTP or gRPC."""
    closed: bool = False
    """Being deleted: new requests get 410, the ones at instances finish (``close_function``)."""
    recent_latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_LATENCIES))
    """Latencies of the most recent successful requests (the status page's p50/p99)."""
    gen: GenerativeRoute | None = None  # a generative function's (gateway.generation)


__all__ = ["RECENT_LATENCIES", "FunctionRoute"]
