"""ESG's workflow scheduling policies (§3 and Appendix B).

* ``astar`` — ESG_1Q: A* with dual-blade pruning over the configurations of a group of stages
  (``esg_1q``), and an exhaustive ``brute_force`` with the same objective;
* ``slo_split`` — dominator-based SLO distribution (``split_slo``, ``anl_labels``,
  ``immediate_dominators``);
* ``replan`` — ``plan_remaining``: the split + ESG_1Q for the remaining stages, called before
  every stage dispatch (adaptive scheduling);
* ``dispatch`` — ESG_Dispatch (home / predecessor / warm / cold invoker) and the recheck list;
* ``queues`` — application-function-wise (AFW) queues served round-robin.

All pure: no clock, no I/O, no random numbers (docs/DESIGN.md §1).
"""

from gshare.policy.workflow.astar import (
    DEFAULT_K_BEST,
    Infeasible,
    PathPlan,
    Plans,
    SearchStats,
    brute_force,
    esg_1q,
    fits_target,
    group_target_ms,
    pareto_front,
)
from gshare.policy.workflow.dispatch import (
    Dispatch,
    DispatchRequest,
    InvokerState,
    NoInvoker,
    RecheckList,
    dispatch_with_recheck,
    esg_dispatch,
    home_invoker,
)
from gshare.policy.workflow.queues import AfwJob, AfwKey, AfwQueues, next_queue, round_robin_pass
from gshare.policy.workflow.replan import (
    GroupPlan,
    RemainingPlan,
    WorkflowLike,
    anl_from_options,
    plan_remaining,
)
from gshare.policy.workflow.slo_split import (
    DEFAULT_MAX_GROUP_SIZE,
    SloGroup,
    SloSplit,
    anl_labels,
    immediate_dominators,
    split_slo,
)

__all__ = [
    "DEFAULT_K_BEST",
    "DEFAULT_MAX_GROUP_SIZE",
    "AfwJob",
    "AfwKey",
    "AfwQueues",
    "Dispatch",
    "DispatchRequest",
    "GroupPlan",
    "Infeasible",
    "InvokerState",
    "NoInvoker",
    "PathPlan",
    "Plans",
    "RecheckList",
    "RemainingPlan",
    "SearchStats",
    "SloGroup",
    "SloSplit",
    "WorkflowLike",
    "anl_from_options",
    "anl_labels",
    "brute_force",
    "dispatch_with_recheck",
    "esg_1q",
    "esg_dispatch",
    "fits_target",
    "group_target_ms",
    "home_invoker",
    "immediate_dominators",
    "next_queue",
    "pareto_front",
    "plan_remaining",
    "round_robin_pass",
    "split_slo",
]
