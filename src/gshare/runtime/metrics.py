"""The Prometheus metrics of one server (``/metrics``): the gateway records requests, the
controller sets the instance and rate gauges."""

from __future__ import annotations

import bisect
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
GC_PAUSE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""A young collection takes tens of microseconds; a full one over an unfrozen server heap took
40 ms (``runtime.server.freeze_startup_heap``)."""
ADMISSION_GAP_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.015, 0.02, 0.05, 0.1, 0.2,
    0.5, 1.0,
)  # fmt: skip
"""The admission's gaps: a few ms apart where it decides (their mean x outstanding against
0.75 x the SLO), and never over ``policy.admission.MAX_GAP_S``."""


# -- metrics -----------------------------------------------------------------------------------


class Metrics:
    """The Prometheus metrics of one server (its own registry, served at ``/metrics``)."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "gshare_requests",
            "Requests answered, by function and HTTP code",
            ["function", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "gshare_request_latency_seconds",
            "Gateway arrival to response, successful requests",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.slo_violations = Counter(
            "gshare_slo_violations",
            "Successful requests slower than the function's slo_ms",
            ["function"],
            registry=r,
        )
        self.token_wait = Histogram(
            "gshare_token_wait_seconds",
            "Time a request's batch waited for its time token",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gshare_queue_wait_seconds",
            "Time a request waited (gateway queue + instance batching) before its batch ran",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.batch_size = Histogram(
            "gshare_batch_size",
            "Requests per batch",
            ["function"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.retries = Counter(
            "gshare_request_retries",
            "Requests re-sent after an instance crash",
            ["function"],
            registry=r,
        )
        self.shed = Counter(
            "gshare_requests_shed",
            "Requests refused with 429 at arrival: reason slo (predicted to miss the SLO, "
            "policy.admission) or queue_cap",
            ["function", "reason"],
            registry=r,
        )
        self.cancelled = Counter(
            "gshare_requests_cancelled",
            "Requests whose client disconnected before the answer (dropped if not started)",
            ["function"],
            registry=r,
        )
        self.payload_bytes = Counter(
            "gshare_instance_payload_bytes",
            "Payload bytes between the gateway and its instances, by direction (request, "
            "response) and path: lane (shared memory, instance.lanes) or socket",
            ["direction", "path"],
            registry=r,
        )
        self.node_up = Gauge(
            "gshare_node_up",
            "1 for each node whose agent answers; a lost node's series is removed",
            ["node"],
            registry=r,
        )
        self.queued = Gauge(
            "gshare_queue_length", "Requests waiting for an instance", ["function"], registry=r
        )
        self.admission_interval = Gauge(
            "gshare_admission_interval_seconds",
            "The SLO admission's measured service interval (the mean gap between answers while "
            "others waited); it sheds when (outstanding + 1) x it exceeds the factor x the SLO",
            ["function"],
            registry=r,
        )
        self.admission_gap = Histogram(
            "gshare_admission_gap_seconds",
            "The gaps between answers that the SLO admission's service interval averages (both "
            "answers given while others were outstanding)",
            ["function"],
            buckets=ADMISSION_GAP_BUCKETS_S,
            registry=r,
        )
        self.instances = Gauge(
            "gshare_instances", "Instances by state", ["function", "state"], registry=r
        )
        self.achieved_share = Gauge(
            "gshare_achieved_share",
            "Fraction of device time an instance used over the last reconcile period",
            ["function", "instance"],
            registry=r,
        )
        self.token_idle_hold = Gauge(
            "gshare_token_idle_hold_seconds",
            "Device time a token of an instance was held beyond its busy time, per token, over "
            "the last reconcile period (the token protocol's hand-overs: grant, wake-up, "
            "release)",
            ["function", "instance"],
            registry=r,
        )
        self.requested_share = Gauge(
            "gshare_requested_share",
            "Quota request of an instance (guaranteed share)",
            ["function", "instance"],
            registry=r,
        )
        self.predicted_rps = Gauge(
            "gshare_predicted_rps",
            "Rate the autoscaler sized the function for",
            ["function"],
            registry=r,
        )
        self.restarts = Counter(
            "gshare_instance_restarts", "Instance restarts after a crash", ["function"], registry=r
        )
        self.cold_starts = Counter(
            "gshare_cold_starts", "Instances started", ["function"], registry=r
        )
        self.memory_reserved = Gauge(
            "gshare_memory_reserved_mb",
            "Memory the function's instances have reserved (their limits), MiB",
            ["function"],
            registry=r,
        )
        self.memory_used = Gauge(
            "gshare_memory_used_mb",
            "Peak model memory of the function's instances' last batches, summed, MiB",
            ["function"],
            registry=r,
        )
        self.memory_steps = Counter(
            "gshare_memory_scale_steps",
            "Steps the instances' memory limits grew by (resource-centric sizing)",
            ["function"],
            registry=r,
        )
        self.memory_kills_avoided = Counter(
            "gshare_memory_kills_avoided",
            "Requests that needed more than the limit and got it by a grow instead of a kill",
            ["function"],
            registry=r,
        )
        self.memory_refusals = Counter(
            "gshare_memory_refusals",
            "Requests failed because their memory need could not be granted",
            ["function"],
            registry=r,
        )

        self.fikit_preemptions = Counter(
            "gshare_fikit_preemptions",
            "Ops (torch module calls) the function's instances held because a higher priority "
            "class was active on their device (FIKIT task switching)",
            ["function"],
            registry=r,
        )
        self.fikit_fills = Counter(
            "gshare_fikit_fill_kernels",
            "Ops the function's instances ran inside a higher class's predicted idle gaps "
            "(FIKIT BestPrioFit fills)",
            ["function"],
            registry=r,
        )
        self.fikit_measure = Counter(
            "gshare_fikit_measure_seconds",
            "Wall time of the function's measured batches (FIKIT measurement phase)",
            ["function"],
            registry=r,
        )

        self.generate_ttft = Histogram(
            "gshare_generate_ttft_seconds",
            "Generative functions: gateway arrival to the first streamed token",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.generate_tpot = Histogram(
            "gshare_generate_tpot_seconds",
            "Generative functions: mean time per output token after the first, per request",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.generate_tokens = Counter(
            "gshare_generate_tokens",
            "Generative functions: tokens of finished requests, kind prompt or completion",
            ["function", "kind"],
            registry=r,
        )
        self.gc_pauses = _GcPauses()
        r.register(self.gc_pauses)
        self._engine_source: Collector | None = None

        r.register(_ConnectionCounters())

    def watch_collector(self) -> Callable[[], None]:
        """Time every garbage collection of this process into ``gc_pauses``; returns the call
        that stops it. Who calls: the server's lifespan (start and shutdown); one watcher per
        process, since ``gc.callbacks`` is process-wide."""
        return self.gc_pauses.watch()

    def add_engine_collector(self, collector: Collector) -> None:
        """The generative engines' gauges and counters, read at scrape time
        (``gateway.generation.EngineCollector``); registered once."""
        if self._engine_source is None:
            self._engine_source = collector
            self.registry.register(collector)

    def forget_function(self, function: str) -> None:
        """Drop every series of a deleted function (so ``/metrics`` does not keep them)."""
        for m in list(vars(self).values()):
            names = getattr(m, "_labelnames", ())
            if not names or names[0] != "function":
                continue
            for key in list(getattr(m, "_metrics", {})):
                if key and key[0] == function:
                    with contextlib.suppress(KeyError):
                        m.remove(*key)

    def forget_instance(self, function: str, instance: str) -> None:
        for g in (self.achieved_share, self.token_idle_hold, self.requested_share):
            with contextlib.suppress(KeyError):
                g.remove(function, instance)


class ConnectionCounts:
    """What the HTTP protocol (``gateway.http_protocol``) counts: connections refused over the
    caps and closed by the read and write deadlines. One per process (``CONNECTION_COUNTERS``):
    uvicorn makes the protocol objects, so they cannot be handed a ``Metrics``."""

    refused = 0
    refused_per_client = 0
    read_timeouts = 0
    write_timeouts = 0


CONNECTION_COUNTERS = ConnectionCounts()
"""The process's connection counts, read by ``/metrics`` at scrape time."""


class _GcPauses(Collector):
    """``gshare_server_gc_pause_seconds``: the process's garbage collections by generation,
    counted into plain lists by a ``gc.callbacks`` hook and read at scrape time.

    NOTE — the hook touches no Prometheus metric: a collection can start inside any allocation,
    also one a thread makes while it holds a metric's lock (``labels``, a scrape's copy of the
    children), and an ``observe`` from the hook would then wait for that lock in the thread
    that holds it, for ever. Plain lists of numbers need no lock and allocate nothing the
    collector tracks."""

    def __init__(self) -> None:
        self._counts = [[0] * (len(GC_PAUSE_BUCKETS_S) + 1) for _ in range(3)]
        self._sums_s = [0.0, 0.0, 0.0]
        self._started = [0.0]

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started[0] = time.perf_counter()
            return
        gen = int(info.get("generation", 2))
        if not 0 <= gen <= 2:
            return
        dt = time.perf_counter() - self._started[0]
        self._counts[gen][bisect.bisect_left(GC_PAUSE_BUCKETS_S, dt)] += 1  # first le >= dt
        self._sums_s[gen] += dt

    def watch(self) -> Callable[[], None]:
        gc.callbacks.append(self._on_collection)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._on_collection)

        return stop

    def collect(self) -> Iterator[HistogramMetricFamily]:
        h = HistogramMetricFamily(
            "gshare_server_gc_pause_seconds",
            "The server process's garbage collections, by generation (every request in flight "
            "waits for one)",
            labels=["generation"],
        )
        for gen in range(3):
            counts, acc, buckets = list(self._counts[gen]), 0, []
            for le, n in zip([*map(str, GC_PAUSE_BUCKETS_S), "+Inf"], counts, strict=True):
                acc += n
                buckets.append((le, acc))
            h.add_metric([str(gen)], buckets, self._sums_s[gen])
        yield h


class _ConnectionCounters(Collector):
    """``CONNECTION_COUNTERS`` as Prometheus counters, read at scrape time."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = CONNECTION_COUNTERS
        yield CounterMetricFamily(
            "gshare_connections_refused",
            "HTTP connections closed at once because --max-connections were open",
            value=c.refused,
        )
        yield CounterMetricFamily(
            "gshare_connections_read_timeouts",
            "HTTP connections closed because a request did not arrive within its deadline",
            value=c.read_timeouts,
        )
        yield CounterMetricFamily(
            "gshare_connections_refused_per_client",
            "HTTP connections closed at once because their client address had its cap open",
            value=c.refused_per_client,
        )
        yield CounterMetricFamily(
            "gshare_connections_write_timeouts",
            "HTTP connections aborted because their client did not read a response in time",
            value=c.write_timeouts,
        )


__all__ = [
    "CONNECTION_COUNTERS",
    "GC_PAUSE_BUCKETS_S",
    "LATENCY_BUCKETS_S",
    "ConnectionCounts",
    "Metrics",
]
