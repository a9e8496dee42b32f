"""Priority-based sharing of one device: FIKIT (§3.2) as pure policy.

* ``kernel_id`` — ``KernelId``: a GPU kernel (name + grid + block) or a CPU op (name + input
  shapes);
* ``profile`` — ``KernelProfile``: the measurement phase's per-kernel SK / SG over T runs;
* ``queues`` — priority queues in gshare's order (9 highest = the paper's Q0);
* ``fikit`` — the FIKIT procedure and BestPrioFit (Algorithms 1 and 2);
* ``scheduler`` — ``FikitScheduler``: the state machine a device's mechanism drives with
  launch / completion / task events and the clock (task switching, gap filling, feedback);
* ``classes`` — ``plan_classes``: how a device's token server combines priorities with tokens.
"""

from gshare.policy.priority.classes import ClassPlan, ClientClass, plan_classes
from gshare.policy.priority.fikit import MIN_GAP_MS, Fit, best_prio_fit, fikit_fill
from gshare.policy.priority.kernel_id import DeviceKind, KernelId, KernelIdError
from gshare.policy.priority.profile import KernelProfile, KernelSpan, KernelStats, ProfileError
from gshare.policy.priority.queues import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    PendingLaunch,
    PriorityError,
    PriorityQueues,
    paper_queue,
)
from gshare.policy.priority.scheduler import (
    Dispatch,
    DispatchReason,
    FikitConfig,
    FikitScheduler,
    SchedulerError,
    SchedulerView,
    ServiceCounters,
    ServiceView,
    TaskPhase,
)

__all__ = [
    "MAX_PRIORITY",
    "MIN_GAP_MS",
    "MIN_PRIORITY",
    "ClassPlan",
    "ClientClass",
    "DeviceKind",
    "Dispatch",
    "DispatchReason",
    "FikitConfig",
    "FikitScheduler",
    "Fit",
    "KernelId",
    "KernelIdError",
    "KernelProfile",
    "KernelSpan",
    "KernelStats",
    "PendingLaunch",
    "PriorityError",
    "PriorityQueues",
    "ProfileError",
    "SchedulerError",
    "SchedulerView",
    "ServiceCounters",
    "ServiceView",
    "TaskPhase",
    "best_prio_fit",
    "fikit_fill",
    "paper_queue",
    "plan_classes",
]
