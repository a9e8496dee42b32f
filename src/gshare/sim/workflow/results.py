"""What one workflow-simulator run measured (``WorkflowSim.run`` returns a ``WorkflowRunResult``):
per-request outcomes (latency, SLO hit, cost) and the wall-clock time of the policy calls, with
the statistics the ``esg-*`` experiments report. Definitions: ``simulator``'s module doc
(Metrics, Cost)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request's result."""

    request_id: int
    application: str
    arrival_ms: float
    slo_ms: float
    latency_ms: float | None
    """End-to-end latency; ``None`` if unfinished when the run ended."""
    cost_usd: float
    measured: bool
    cold_starts: int
    remote_inputs: int

    @property
    def hit(self) -> bool:
        return self.latency_ms is not None and self.latency_ms <= self.slo_ms


@dataclass
class WorkflowRunResult:
    """Everything one run measured (module NOTE, Metrics/Cost)."""

    scheduler: str
    requests: list[RequestOutcome]
    plan_ms: np.ndarray
    """Wall-clock ms of every ``plan_stage`` call."""
    select_ms: np.ndarray
    """Wall-clock ms of every ``select_invoker`` call."""
    counters: dict[str, float]
    """tasks, jobs, cold/warm/adopted starts, prewarms started, evictions, local/remote inputs,
    configuration misses, NoInvoker answers, utilisation, events, ... (see ``_counters``)."""
    peak_vcpus: list[int]
    """Per invoker, the most vCPUs ever held at once (<= capacity, tested)."""
    peak_vgpus: list[int]
    horizon_ms: float
    end_ms: float

    def measured(self, application: str | None = None) -> list[RequestOutcome]:
        return [
            r
            for r in self.requests
            if r.measured and (application is None or r.application == application)
        ]

    def applications(self) -> list[str]:
        return list(dict.fromkeys(r.application for r in self.requests))

    def stats(self, application: str | None = None) -> dict[str, float]:
        """SLO hit rate, latency percentiles (unfinished requests count with their age at the end
        — a lower bound), mean cost per request, over the measured requests."""
        rs = self.measured(application)
        n = len(rs)
        if n == 0:
            return {
                "requests": 0.0,
                "slo_hit_rate": float("nan"),
                "cost_per_request_usd": float("nan"),
                "cost_usd": 0.0,
                "p50_ms": float("nan"),
                "p95_ms": float("nan"),
                "p99_ms": float("nan"),
                "mean_ms": float("nan"),
                "unfinished": 0.0,
                "slo_ms": float("nan"),
            }
        lat = np.array(
            [r.latency_ms if r.latency_ms is not None else self.end_ms - r.arrival_ms for r in rs]
        )
        cost = sum(r.cost_usd for r in rs)
        return {
            "requests": float(n),
            "slo_hit_rate": sum(r.hit for r in rs) / n,
            "cost_usd": cost,
            "cost_per_request_usd": cost / n,
            "mean_ms": float(lat.mean()),
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "unfinished": float(sum(r.latency_ms is None for r in rs)),
            "slo_ms": float(np.mean([r.slo_ms for r in rs])),
        }

    def decision_stats(self) -> dict[str, float]:
        """Mean / p50 / p95 / max wall-clock ms of the policy calls."""
        out: dict[str, float] = {}
        for name, arr in (("plan", self.plan_ms), ("select", self.select_ms)):
            out[f"{name}_calls"] = float(len(arr))
            out[f"{name}_ms_mean"] = float(arr.mean()) if len(arr) else float("nan")
            out[f"{name}_ms_p50"] = float(np.percentile(arr, 50)) if len(arr) else float("nan")
            out[f"{name}_ms_p95"] = float(np.percentile(arr, 95)) if len(arr) else float("nan")
            out[f"{name}_ms_max"] = float(arr.max()) if len(arr) else float("nan")
        return out


__all__ = ["RequestOutcome", "WorkflowRunResult"]
