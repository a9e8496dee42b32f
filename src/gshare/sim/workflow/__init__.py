"""The workflow cluster simulator: ESG's evaluation platform (§4) in virtual time.

* ``cluster`` — invokers (16 vCPUs, one GPU of 7 vGPU slices), function containers (cold start,
  warm pool, pre-warming, keep-alive) and the local/remote data-transfer model;
* ``workload`` — ESG's uniform-interval request streams and the Azure Functions 2021 replay;
* ``simulator`` — the controller (AFW queues round-robin, per-stage ``plan_stage`` +
  ``select_invoker`` of any ``WorkflowPolicy``), tasks, containers, pre-warming;
* ``results`` — what a run measured (SLO hits, latency, cost, decision time).
"""

from gshare.sim.workflow.cluster import Container, Invoker, Pool, TransferModel
from gshare.sim.workflow.results import RequestOutcome, WorkflowRunResult
from gshare.sim.workflow.simulator import WorkflowSim, WorkflowSimConfig
from gshare.sim.workflow.workload import (
    azure2021_arrivals,
    load_arrivals,
    mean_rate_rps,
    pick_applications,
    uniform_intervals,
)

__all__ = [
    "Container",
    "Invoker",
    "Pool",
    "RequestOutcome",
    "TransferModel",
    "WorkflowRunResult",
    "WorkflowSim",
    "WorkflowSimConfig",
    "azure2021_arrivals",
    "load_arrivals",
    "mean_rate_rps",
    "pick_applications",
    "uniform_intervals",
]
