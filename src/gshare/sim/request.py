"""Simulated requests and the log that turns them into metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class SimRequest:
    """One inference request travelling through the simulated platform."""

    request_id: int
    function: str
    arrival_ms: float
    slo_ms: float | None = None
    start_ms: float = -1.0
    """When its batch started on the GPU (asked for a token)."""
    queued_ms: float = -1.0
    """When it reached its instance's queue (-1: it did not)."""
    token_wait_ms: float = 0.0
    """Its batch's waits for a token, from asking to the grant (``sim.gpu``)."""
    instance_finish_ms: float = -1.0
    """When its instance finished it; ``finish_ms`` adds the platform latency (``sim.gateway``)."""
    finish_ms: float = -1.0
    instance_id: str = ""
    shed: bool = False
    """Refused at once by the gateway's admission control (the live 429): a miss."""

    @property
    def latency_ms(self) -> float:
        return self.finish_ms - self.arrival_ms

    @property
    def slo_met(self) -> bool:
        if self.shed:
            return False
        return self.slo_ms is None or self.latency_ms <= self.slo_ms + 1e-9


@dataclass
class RequestLog:
    """Completed requests; summary statistics over those that arrived after ``warmup_ms``."""

    warmup_ms: float = 0.0
    completed: list[SimRequest] = field(default_factory=list)
    submitted: int = 0

    def record(self, req: SimRequest) -> None:
        self.completed.append(req)

    def summary(
        self, function: str | None = None, until_ms: float | None = None
    ) -> dict[str, float]:
        """Throughput (req/s over the measured span), latency percentiles, SLO violations."""
        reqs = [
            r
            for r in self.completed
            if r.arrival_ms >= self.warmup_ms and (function is None or r.function == function)
        ]
        if not reqs:
            return {
                "requests": 0,
                "throughput_rps": 0.0,
                "p50_ms": float("nan"),
                "p99_ms": float("nan"),
                "mean_ms": float("nan"),
                "slo_violation_pct": 0.0,
            }
        lat = np.array([r.latency_ms for r in reqs])
        end = until_ms if until_ms is not None else max(r.finish_ms for r in reqs)
        span_s = max(1e-9, (end - self.warmup_ms) / 1000.0)
        viol = sum(1 for r in reqs if not r.slo_met)
        return {
            "requests": len(reqs),
            "throughput_rps": len(reqs) / span_s,
            "mean_ms": float(lat.mean()),
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "slo_violation_pct": 100.0 * viol / len(reqs),
        }
