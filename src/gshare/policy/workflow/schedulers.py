"""The interface every workflow scheduler implements (ESG and its baselines, ESG §4.2).

Who calls it: the workflow simulator (``gshare.sim.workflow``) — and later the live runtime —
once per stage dispatch. For each application-function-wise queue it serves, the mechanism

1. builds a ``StageContext`` (the workflow, the stage, how long the oldest request of the queue
   has been in the system and waited, how many jobs wait, the configuration options of every
   function, the plan the request carries if an earlier stage fixed one, the time);
2. calls ``plan_stage`` → a ``StagePlan``: the configurations to try for this stage in order of
   preference (the first is the planned one) and, optionally, a whole-request plan to carry to
   the later stages (Orion plans the whole DAG at the first stage; Aquatope's plan is static);
3. builds a ``DispatchRequest`` from the candidates and calls ``select_invoker`` with a snapshot
   of the invokers → a ``Dispatch`` (invoker, config, batch) or ``NoInvoker`` (the mechanism
   keeps the job queued and retries; ESG's recheck list lives in the policy's own logic).

``prepare`` runs once before the workload starts, with the applications and options; a
scheduler that optimises offline (Aquatope) does it there. Everything here is pure: no I/O, no
clock (the time arrives in ``StageContext.now_ms``), no random numbers except from the ``seed``
given to ``prepare``.

What must hold for every scheduler: ``plan_stage`` returns at least one candidate (falling back
to the minimum configuration when nothing meets the target, as ESG does after its rechecks);
``select_invoker`` never picks an invoker without the free vCPUs / vGPUs the chosen
configuration needs (idle warm containers hold none, see ``dispatch.InvokerState``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gshare.policy.workflow.dispatch import Dispatch, DispatchRequest, InvokerState, NoInvoker
from gshare.policy.workflow.replan import WorkflowLike
from gshare.workflows.config import ConfigOption, FunctionConfig


@dataclass(frozen=True, slots=True)
class StageContext:
    """What a scheduler sees when one stage of one application is about to be dispatched."""

    application: str
    """Application (workflow) name; with ``stage`` it names the AFW queue."""
    workflow: WorkflowLike
    """The workflow spec (DAG, end-to-end SLO)."""
    stage: str
    """The stage to dispatch now."""
    done_stages: frozenset[str]
    """Stages of the (oldest queued) request already finished."""
    elapsed_ms: float
    """Time since the oldest queued request of this queue entered the system."""
    waiting_ms: float
    """How long that request has waited in this stage's queue."""
    queue_len: int
    """Jobs waiting in this AFW queue (the largest batch that can be formed now)."""
    options: Mapping[str, Sequence[ConfigOption]]
    """Configuration options per function (time and cost, from the performance model)."""
    request_plan: Mapping[str, FunctionConfig] | None
    """A whole-request plan fixed earlier (by ``StagePlan.request_plan``), else None."""
    now_ms: float
    """Current time (virtual in the simulator)."""


@dataclass(frozen=True, slots=True)
class StagePlan:
    """A scheduler's answer for one stage."""

    candidates: tuple[FunctionConfig, ...]
    """Configurations to try, most preferred first; never empty."""
    request_plan: Mapping[str, FunctionConfig] | None = None
    """Stage → config for the rest of the request, to be carried (None: plan again later)."""
    note: str = ""
    """Short explanation for logs (e.g. 'infeasible: min config fallback')."""


class WorkflowPolicy(Protocol):
    """A workflow scheduler: ESG, INFless, FaST-GShare, Orion or Aquatope."""

    name: str

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """Offline phase, once before serving: ``workflows`` is [(application, spec), ...]."""
        ...

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """Configurations for ``ctx.stage`` (see the module docstring)."""
        ...

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """Where to run it: an invoker with room for the chosen configuration, or none now."""
        ...
