"""ESG_Dispatch: map a configured task to an invoker (ESG §3.1, §3.4), and the recheck list.

Who calls it: the controller, right after ``plan_remaining`` has produced the configuration
priority queue of the stage it serves. It passes a snapshot of the invokers (free vCPUs, free
vGPUs, idle warm containers per function) and gets a ``Dispatch`` (invoker + config) or
``NoInvoker``. With ``dispatch_with_recheck`` it also passes and gets back the ``RecheckList``.
Pure: nothing is reserved here; the caller applies the decision.

NOTE (ESG §3.1 "Two-step design", §3.4). ESG_1Q ignores resource availability, so it returns
the K best paths (configPQ). ESG_Dispatch dequeues the candidate configurations of the current
stage best first; for each it looks for an invoker that can hold it, in this order:
  1. the preferred invoker(s): the *home invoker* for the first stage of a workflow (OpenWhisk's
     hash of namespace/action; ``home_invoker``), the invoker(s) that ran the predecessor(s) for
     the other stages — locality: the input is on the local file system and the instance is
     likely warm;
  2. other invokers with an idle warm container of the function;
  3. the cold invoker with the most free resources.
If no candidate fits anywhere, the AFW queue goes to the recheck list and the controller moves
on; after every queue it serves it retries the queues in the recheck list. A queue that failed
``max_rounds`` (3) retries is then dispatched with the minimum configuration, to ensure
progress.
Interpretations: "most free resources" is the sum of the free vCPU and free vGPU fractions of
the invoker's capacity (ties: lower id); warm invokers are tried in the same order; a warm
container holds no vCPU/vGPU while idle, so every task needs its config's free resources; an
empty candidate list (ESG_1Q found the group infeasible) fails like a config that fits
nowhere, so such a queue is retried and then dispatched with the minimum configuration.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Final, Literal

from gshare.policy.workflow.queues import AfwKey
from gshare.workflows.config import MIN_CONFIG, NODE_VCPUS, NODE_VGPUS, FunctionConfig

DEFAULT_MAX_RECHECK_ROUNDS: Final[int] = 3
"""ESG's "stays in the recheck list too long (e.g., 3 rounds)" (§3.1)."""

Via = Literal["home", "predecessor", "warm", "cold"]


@dataclass(frozen=True, slots=True)
class InvokerState:
    """Snapshot of one invoker (worker node). Invariants: ``0 <= free <= capacity``."""

    invoker_id: int
    free_vcpus: int
    free_vgpus: int
    warm: Mapping[str, int] = field(default_factory=dict)
    """Function -> number of idle warm containers on this invoker."""
    vcpus: int = NODE_VCPUS
    """Capacity, vCPUs."""
    vgpus: int = NODE_VGPUS
    """Capacity, vGPUs."""

    def __post_init__(self) -> None:
        if not (0 <= self.free_vcpus <= self.vcpus and 0 <= self.free_vgpus <= self.vgpus):
            raise ValueError(
                f"invoker {self.invoker_id}: free resources must be within capacity, got "
                f"{self.free_vcpus}/{self.vcpus} vCPUs, {self.free_vgpus}/{self.vgpus} vGPUs"
            )

    def fits(self, config: FunctionConfig) -> bool:
        return config.vcpus <= self.free_vcpus and config.vgpus <= self.free_vgpus

    def is_warm(self, function: str) -> bool:
        return self.warm.get(function, 0) > 0

    @property
    def free_share(self) -> float:
        """Free vCPU fraction + free vGPU fraction (0..2): "available resources"."""
        return self.free_vcpus / self.vcpus + self.free_vgpus / self.vgpus


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What to place: a task of ``function`` in one of ``candidates`` (best first)."""

    function: str
    candidates: tuple[FunctionConfig, ...]
    """The current stage's configurations from ESG_1Q's configPQ, best first (may be empty)."""
    preferred: tuple[int, ...] = ()
    """Home invoker (first stage) or the predecessors' invokers (later stages), in order."""
    first_stage: bool = True
    """Whether ``preferred`` is the home invoker (``via="home"``) or predecessors'."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run the task on ``invoker_id`` with ``config``."""

    invoker_id: int
    config: FunctionConfig
    via: Via
    """Which rule chose the invoker."""
    warm: bool
    """Whether the invoker has an idle warm container of the function (else: cold start)."""
    candidate_rank: int
    """Index of ``config`` in the request's candidates (0 = ESG_1Q's best)."""


@dataclass(frozen=True, slots=True)
class NoInvoker:
    """No candidate configuration fits on any invoker."""

    reason: str


def home_invoker(application: str, function: str, n_invokers: int) -> int:
    """OpenWhisk's home invoker: a stable hash of ``application/function`` modulo the number of
    invokers (CRC-32, so it is the same in every process; Python's ``hash`` is salted)."""
    if n_invokers < 1:
        raise ValueError(f"n_invokers must be >= 1, got {n_invokers}")
    return zlib.crc32(f"{application}/{function}".encode()) % n_invokers


def stage_request(
    application: str,
    function: str,
    candidates: Sequence[FunctionConfig],
    predecessors: Sequence[str],
    queued_locations: Iterable[Mapping[str, int]],
    n_invokers: int,
) -> DispatchRequest:
    """The ``DispatchRequest`` of a stage's next task (module NOTE, rule 1: the preferred
    invokers). Who calls it: the simulator's and the live runtime's workflow controllers, so
    that locality means the same in both worlds.

    ``queued_locations``: for each request queued at the stage, in queue order, the invoker
    that ran each of its finished stages (only the first ``horizon`` are read). A later stage
    prefers the invokers that hold its predecessors' outputs for the requests the task may
    batch — the first ``horizon`` of the queue, ``horizon`` the largest candidate batch — in
    that order, without repeats (a predecessor with no known invoker is passed over); a first
    stage prefers its home invoker."""
    if predecessors:
        horizon = max((c.batch for c in candidates), default=1)
        preferred = tuple(
            dict.fromkeys(
                loc[p]
                for loc in islice(queued_locations, horizon)
                for p in predecessors
                if p in loc
            )
        )
    else:
        preferred = (home_invoker(application, function, n_invokers),)
    return DispatchRequest(function, tuple(candidates), preferred, first_stage=not predecessors)


@dataclass(frozen=True, slots=True)
class IdleInstance:
    """An idle running instance of the task's function on the chosen invoker (device)."""

    instance_id: str
    quota_pct: float
    """The quota it runs with now (the last one a task set on it, else its own)."""


def pick_instance(idle: Sequence[IdleInstance], quota_pct: float) -> IdleInstance:
    """Which of the chosen invoker's idle instances runs the task: the one whose quota is
    closest to the dispatched configuration's ``quota_pct`` (the fewest quota changes for the
    token server to apply), ties by instance id. Who calls it: the live stage scheduler, after
    ``esg_dispatch`` (or a baseline's ``select_invoker``) chose the invoker; the simulator's
    containers in one pool are alike, so it takes any. ``idle`` must not be empty."""
    if not idle:
        raise ValueError("pick_instance needs at least one idle instance")
    return min(idle, key=lambda i: (abs(i.quota_pct - quota_pct), i.instance_id))


def esg_dispatch(
    request: DispatchRequest, invokers: Sequence[InvokerState]
) -> Dispatch | NoInvoker:
    """ESG_Dispatch for one task (module NOTE). Deterministic for a given snapshot."""
    by_id = {inv.invoker_id: inv for inv in invokers}
    preferred = [by_id[i] for i in dict.fromkeys(request.preferred) if i in by_id]
    pref_ids = {inv.invoker_id for inv in preferred}
    others = sorted(
        (inv for inv in invokers if inv.invoker_id not in pref_ids),
        key=lambda inv: (-inv.free_share, inv.invoker_id),
    )
    warm = [inv for inv in others if inv.is_warm(request.function)]
    cold = [inv for inv in others if not inv.is_warm(request.function)]
    pref_via: Via = "home" if request.first_stage else "predecessor"
    for rank, cfg in enumerate(request.candidates):
        for group, via in ((preferred, pref_via), (warm, "warm"), (cold, "cold")):
            for inv in group:
                if inv.fits(cfg):
                    return Dispatch(inv.invoker_id, cfg, via, inv.is_warm(request.function), rank)
    if not request.candidates:
        return NoInvoker("no candidate configuration (ESG_1Q found the group infeasible)")
    return NoInvoker(
        f"none of {len(request.candidates)} candidate configuration(s) of "
        f"{request.function!r} fits on any of {len(invokers)} invoker(s)"
    )


# -- recheck list ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecheckList:
    """AFW queues waiting for resources, oldest first, with their failed retries (``rounds``).

    A queue enters with ``rounds = 0`` when its first dispatch fails; every failed retry adds 1;
    a successful dispatch removes it. When ``rounds >= max_rounds`` the next attempt uses the
    minimum configuration (``force_min_config``)."""

    entries: tuple[tuple[AfwKey, int], ...] = ()
    max_rounds: int = DEFAULT_MAX_RECHECK_ROUNDS

    def keys(self) -> tuple[AfwKey, ...]:
        """The queues to retry, in the order they entered."""
        return tuple(k for k, _ in self.entries)

    def rounds(self, key: AfwKey) -> int | None:
        return next((r for k, r in self.entries if k == key), None)

    def fail(self, key: AfwKey) -> RecheckList:
        """Record a failed dispatch of ``key``: add it, or count one more failed retry."""
        if self.rounds(key) is None:
            return replace(self, entries=(*self.entries, (key, 0)))
        return replace(self, entries=tuple((k, r + 1 if k == key else r) for k, r in self.entries))

    def clear(self, key: AfwKey) -> RecheckList:
        """``key`` was dispatched: drop it."""
        return replace(self, entries=tuple((k, r) for k, r in self.entries if k != key))

    def force_min_config(self, key: AfwKey) -> bool:
        r = self.rounds(key)
        return r is not None and r >= self.max_rounds


def dispatch_with_recheck(
    key: AfwKey,
    request: DispatchRequest,
    invokers: Sequence[InvokerState],
    recheck: RecheckList,
    *,
    min_config: FunctionConfig = MIN_CONFIG,
) -> tuple[Dispatch | NoInvoker, RecheckList]:
    """One dispatch attempt of AFW queue ``key`` with the recheck rule: a queue that has failed
    ``max_rounds`` retries is tried with ``min_config`` only. Returns the decision and the new
    recheck list (``key`` cleared on success, failure recorded otherwise)."""
    if recheck.force_min_config(key):
        request = replace(request, candidates=(min_config,))
    decision = esg_dispatch(request, invokers)
    if isinstance(decision, Dispatch):
        return decision, recheck.clear(key)
    return decision, recheck.fail(key)
