"""The request rows both worlds write and their summary: ``scenario_sim.simulate`` (``gshare
simulate``) and ``scenario_load.run_load`` (``gshare load``) write one row per arrival with
``REQUEST_COLUMNS`` (a function's with ``TIMING_COLUMNS`` too), check that every arrival has one
(``accounted``) and summarise them per workflow and function (``summarise``), so that the two
worlds' result files compare column for column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gshare.experiments.scenario_arrivals import Arrival
from gshare.scenario import Scenario
from gshare.stats import percentile_or_none

REQUEST_COLUMNS = (
    "kind",
    "name",
    "workload",
    "request",
    "arrival_ms",
    "latency_ms",
    "slo_ms",
    "hit",
    "status",
    "measured",
    "cost_uusd",
)
"""Columns of a request row, in both worlds (``scenario_load`` adds ``code``, ``late_ms`` and
``error``). ``status``: ``ok``, ``unfinished`` (no answer by the end), ``error`` (an HTTP error
or a failed connection), ``dropped_client`` (the load generator's ``--max-outstanding`` was
reached: never sent). ``cost_uusd``: the request's cost in micro-USD (1e-6 USD: the result
files keep 6 decimals), workflows in the simulator only."""
TIMING_COLUMNS = ("platform_ms", "exec_ms", "queue_ms", "token_wait_ms")
"""A function request's parts, in both worlds (None for a shed one, a workflow's): the wait in
its instance's queue, its batch's waits for a token, its compute (the batch's time on the device
less those waits) and the platform's share beyond them (live: the timing headers,
``scenario_load.platform_share_ms``; simulated: ``sim.instance`` and ``sim.gateway``)."""


def summarise(rows: Sequence[Mapping[str, Any]], scenario: Scenario) -> dict[str, Any]:
    """Per workflow and function, over the measured rows: ``requests`` (arrivals), the count
    of each status, ``slo_hit_rate`` (hits / requests: an unanswered, failed or dropped request
    is a miss; None without an SLO), latency percentiles over the answered ones, cost per
    request when the rows carry costs (``cost_per_request_usd``, and
    ``cost_per_1m_requests_usd``, which the result files' 6 decimals do not round away)."""
    out: dict[str, dict[str, Any]] = {"workflows": {}, "functions": {}}
    for w in scenario.workloads:
        group = "workflows" if w.kind == "workflow" else "functions"
        if w.target in out[group]:
            continue
        rs = [r for r in rows if r["kind"] == w.kind and r["name"] == w.target and r["measured"]]
        ok = [float(r["latency_ms"]) for r in rs if r["status"] == "ok"]
        slo = (
            scenario.workflows[w.target].slo_ms
            if w.kind == "workflow"
            else scenario.functions[w.target].slo_ms
        )
        n = len(rs)
        costs = [float(r["cost_uusd"]) for r in rs if r.get("cost_uusd") is not None]
        st: dict[str, Any] = {
            "requests": n,
            "answered": len(ok),
            "unfinished": sum(r["status"] == "unfinished" for r in rs),
            "errors": sum(r["status"] == "error" for r in rs),
            "dropped_client": sum(r["status"] == "dropped_client" for r in rs),
            "slo_ms": slo,
            "slo_hit_rate": (sum(bool(r["hit"]) for r in rs) / n) if n and slo else None,
            "p50_ms": percentile_or_none(ok, 50),
            "p95_ms": percentile_or_none(ok, 95),
            "p99_ms": percentile_or_none(ok, 99),
            "mean_ms": float(np.mean(ok)) if ok else None,
            "cost_per_request_usd": (sum(costs) / n / 1e6) if costs and n else None,
            "cost_per_1m_requests_usd": (sum(costs) / n) if costs and n else None,
        }
        out[group][w.target] = st
    return out


def accounted(rows: Sequence[Mapping[str, Any]], arrivals: Sequence[Arrival]) -> dict[str, Any]:
    """Every arrival has one row: counts per status and whether they add up."""
    by: dict[str, int] = {}
    for r in rows:
        by[str(r["status"])] = by.get(str(r["status"]), 0) + 1
    return {"arrivals": len(arrivals), "rows": len(rows), "by_status": by,
            "all_accounted": len(rows) == len(arrivals)}  # fmt: skip


__all__ = ["REQUEST_COLUMNS", "TIMING_COLUMNS", "accounted", "summarise"]
