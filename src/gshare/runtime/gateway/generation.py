"""What the gateway knows of a generative function: its per-token SLO, its TTFT admission state
and its instances' engine counters.

Who uses it: the controller gives ``router.Gateway.add_function`` a ``GenerativeRoute`` for a
generative function (``FunctionRoute.gen``); ``gateway.streams`` admits requests against it and
feeds it first tokens; ``gateway.channel`` keeps the last ``ST_STATS`` frame of each instance
connection (``InstanceChannel.engine_stats``), which ``EngineCollector`` sums per function at
``/metrics`` time.

TTFT admission (``policy.admission``, applied to first tokens): a request's "service" here is
its wait for a first token, so the estimate is the mean interval between first tokens while
requests were waiting for one (``first_token``), and the backlog is the requests that wait for
their first token — queued at the gateway, or at an instance (its engine's waiting queue and
prefills). A request predicted to get its first token later than ``ttft_ms`` (times the
gateway's ``max_latency_slo_factor``) is shed at once with 429.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gshare.policy.admission import ServiceEstimate
from gshare.spec import FunctionSpec


@dataclass
class GenerativeRoute:
    """A generative function's state at the gateway (module doc)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    awaiting_first: int = 0
    """Requests admitted that have not had their first token (nor their answer) yet."""
    first_token: ServiceEstimate = field(default_factory=ServiceEstimate)

    @classmethod
    def for_spec(cls, spec: FunctionSpec) -> GenerativeRoute:
        slo = spec.slo
        return cls(slo.ttft_ms, slo.tpot_ms) if slo is not None else cls()


ENGINE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("running", "gshare_generate_running_sequences", "Sequences holding KV in the engines"),
    ("waiting", "gshare_generate_waiting_sequences", "Sequences waiting in the engines"),
    ("kv_bytes", "gshare_generate_kv_bytes", "KV-cache bytes the engines hold"),
    ("kv_limit_bytes", "gshare_generate_kv_limit_bytes", "KV-cache limits of the engines, bytes"),
)
ENGINE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("cancelled", "gshare_generate_engine_cancelled", "Sequences the engines cancelled"),
    ("refused", "gshare_generate_engine_refused", "Sequences the engines refused"),
    ("preemptions", "gshare_generate_engine_preemptions", "Sequence preemptions at steps"),
    ("steps", "gshare_generate_engine_steps", "Engine steps (one time-token burst each)"),
    ("finished", "gshare_generate_engine_finished", "Sequences the engines finished"),
    ("busy_s", "gshare_generate_engine_busy_seconds", "Seconds the engines' steps ran"),
)


def parse_stats(payload: bytes) -> dict[str, float]:
    """An ``ST_STATS`` payload's numbers ({} when it is not a JSON object of numbers)."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if isinstance(v, int | float)}


class EngineCollector(Collector):
    """Reads ``(function, stats)`` pairs at scrape time (the gateway's live connections)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        per: dict[str, dict[str, float]] = {}
        pairs: Iterable[tuple[str, Mapping[str, float]]] = self.source()
        for function, stats in pairs:
            acc = per.setdefault(function, {})
            for k, v in stats.items():
                acc[k] = acc.get(k, 0.0) + v
        for key, name, doc in ENGINE_GAUGES:
            g = GaugeMetricFamily(
                name, doc + " (summed over the function's instances)", labels=["function"]
            )
            for fn, acc in sorted(per.items()):
                g.add_metric([fn], acc.get(key, 0.0))
            yield g
        for key, name, doc in ENGINE_COUNTERS:
            c = CounterMetricFamily(
                name, doc + " (summed over the function's connected instances)", labels=["function"]
            )
            for fn, acc in sorted(per.items()):
                c.add_metric([fn], acc.get(key, 0.0))
            yield c


__all__ = ["ENGINE_COUNTERS", "ENGINE_GAUGES", "GenerativeRoute", "EngineCollector", "parse_stats"]
