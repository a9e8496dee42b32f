"""Auto-scaling: how many instances of which (SM %, quota %, batch) config a function needs.

Who calls it: ``policy.control.control_step``, the reconcile step the controllers of both
worlds run — the simulator's ``sim.cluster`` in virtual time and the live runtime's
``runtime.control.loop`` with the wall clock — once every reconcile period (and on a cold-start
nudge), for every function, with the predicted request rate (``policy.rate.RatePredictor``,
after keep-alive and the queued-demand floor), the instances the function runs and the floor
``min_instances``. The policy answers with a ``ScaleDecision`` (configs to start, instance ids
to stop); the controller then places the new instances (``policy.placement``) and drains the
removed ones. The policy reads no clock, does no I/O and keeps no state: everything
it needs is in its arguments.

Policies (registry ``AUTOSCALERS``, shared by the CLI, the simulator and the runtime):

* ``"fast-heuristic"`` — FaST-GShare's Heuristic Scaling Algorithm (paper 000, §3.4.1,
  Algorithm 1): ``heuristic_scale``;
* ``"target-util"`` — a Kubernetes-HPA-style baseline: one fixed config, as many replicas as
  keep each at ``target_util`` of its throughput: ``target_utilisation_scale``;
* ``"gshare-burst"`` — gshare's default (``DEFAULT_AUTOSCALER``): Algorithm 1's configs sized
  for a burst-aware demand (peak hold, backlog) with a homogeneous fleet: ``BurstAutoscaler``.

What must hold after a controller applies a ``heuristic_scale`` decision (tested by properties
in ``tests/policy/test_autoscale.py``), with ``R`` the predicted rate and ``T`` throughputs:

* coverage — Σ T of the function's instances ≥ R (unless ``max_instances`` capped the
  additions, which the decision's ``reason`` says);
* minimal scale-down — when instances were removed (or R ≤ capacity), removing the next
  instance the rule would pick (least efficient first) would break coverage;
* determinism — the decision does not depend on the order of ``running`` or ``configs``.

Units: ``sm_pct`` and ``quota_pct`` are percentages (0, 100]; throughputs and rates are requests
per second (``_rps``); latencies milliseconds (``_ms``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from gshare.resources import GpuShare

if TYPE_CHECKING:  # the table is only queried; importing it at run time is not needed
    from gshare.profiles import ProfileTable

FAST_SM_POINTS_PCT: Final[tuple[float, ...]] = (6.0, 12.0, 24.0, 50.0, 60.0, 80.0, 100.0)
"""FaST-GShare's spatial profiling points (§5.2). The shipped V100 table starts at SM 5 %, so
6, 12 and 24 % are interpolated by ``ProfileTable`` (piecewise-linear between 5/10, 10/15,
20/25)."""
FAST_QUOTA_POINTS_PCT: Final[tuple[float, ...]] = (20.0, 40.0, 60.0, 80.0, 100.0)
"""FaST-GShare's temporal profiling points (§5.2)."""
DEFAULT_MAX_WAIT_MS: Final[float] = 10.0
"""Default batching timeout: an instance frontend flushes a partial batch after this long."""

_EPS_RPS: Final[float] = 1e-9
"""Tolerance on request-rate arithmetic, so float rounding never adds or keeps an instance for
a gap of 1e-12 rps."""


class AutoscaleError(ValueError):
    """A bad autoscaler input (no config meets the SLO, unknown policy, bad bound); the message
    names the function/model and the offending value."""


# -- data --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    """One resource configuration of a function, with its profiled performance.

    Built by ``candidate_configs`` from a ``ProfileTable`` (or by hand in tests). Invariants
    (checked): ``0 < sm_pct <= 100``, ``0 < quota_pct <= 100``, ``batch >= 1``,
    ``throughput_rps > 0``, ``latency_ms > 0``, ``wait_ms >= 0``.
    """

    sm_pct: float
    """Spatial share: % of the GPU's SMs (MPS active thread percentage)."""
    quota_pct: float
    """Temporal share: guaranteed % of each time window (quota request)."""
    batch: int
    """Requests per burst (the instance frontend's maximum batch size)."""
    throughput_rps: float
    """Profiled capacity of one instance, requests/s: ``batch * 1000 / latency_ms``."""
    latency_ms: float
    """Profiled latency of one batch at this (sm, quota), without batching wait."""
    wait_ms: float = 0.0
    """Worst-case batching wait counted against the SLO (0 for batch 1); see
    ``candidate_configs``."""

    def __post_init__(self) -> None:
        if not (0.0 < self.sm_pct <= 100.0):
            raise AutoscaleError(f"sm_pct must be in (0, 100], got {self.sm_pct}")
        if not (0.0 < self.quota_pct <= 100.0):
            raise AutoscaleError(f"quota_pct must be in (0, 100], got {self.quota_pct}")
        if self.batch < 1:
            raise AutoscaleError(f"batch must be >= 1, got {self.batch}")
        if not (self.throughput_rps > 0.0 and math.isfinite(self.throughput_rps)):
            raise AutoscaleError(
                f"throughput_rps must be finite and > 0, got {self.throughput_rps}"
            )
        if not self.latency_ms > 0.0:
            raise AutoscaleError(f"latency_ms must be > 0, got {self.latency_ms}")
        if not self.wait_ms >= 0.0:
            raise AutoscaleError(f"wait_ms must be >= 0, got {self.wait_ms}")

    @property
    def rpr(self) -> float:
        """FaST-GShare's RPS per Resource: ``T / (S · Q)`` with S and Q as fractions.

        Unit: requests/s per whole GPU-equivalent of spatio-temporal area — the rate a GPU
        tiled completely with copies of this config would serve. A full-GPU config (100 %,
        100 %) has ``rpr == throughput_rps``. Example: 40 rps at (12 %, 40 %) → 40 / (0.12 ·
        0.40) ≈ 833.
        """
        return self.throughput_rps / ((self.sm_pct / 100.0) * (self.quota_pct / 100.0))

    @property
    def area(self) -> float:
        """Placement area, quota % x SM % (a full GPU is 10,000), as ``GpuShare.area``."""
        return self.sm_pct * self.quota_pct

    @property
    def worst_latency_ms(self) -> float:
        """Latency counted against the SLO: batch latency plus the batching wait."""
        return self.latency_ms + self.wait_ms

    def share(self, quota_limit_pct: float | None = None, mem_mb: float = 0.0) -> GpuShare:
        """The ``GpuShare`` an instance of this config gets: quota request = ``quota_pct``,
        quota limit = ``quota_limit_pct`` (default: the request, as FaST-GShare profiles).
        Raises ``ShareError`` when the limit is below the request or above 100."""
        limit = self.quota_pct if quota_limit_pct is None else quota_limit_pct
        return GpuShare(
            sm_pct=self.sm_pct,
            quota_request=self.quota_pct / 100.0,
            quota_limit=limit / 100.0,
            mem_mb=mem_mb,
        )

    def label(self) -> str:
        """Short human-readable form used in decision reasons."""
        return (
            f"(sm {self.sm_pct:g}%, q {self.quota_pct:g}%, b {self.batch}, "
            f"T {self.throughput_rps:.1f} rps)"
        )


@dataclass(frozen=True, slots=True)
class Instance:
    """A running (or starting) instance as the autoscaler sees it."""

    instance_id: str
    """Unique id assigned by the controller."""
    function: str
    """The function it serves."""
    config: ScaleConfig
    """Its resource configuration and profiled capacity."""


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """What one function should change now. Applying it: start ``add``, stop ``remove``."""

    function: str
    """The function the decision is for."""
    add: tuple[ScaleConfig, ...]
    """Configs of instances to start, Algorithm 1's "<+>" (p_eff copies first, p_ideal last)."""
    remove: tuple[str, ...]
    """Ids of running instances to stop, Algorithm 1's "<->", in removal order."""
    delta_rps: float
    """ΔRPS = predicted rate − Σ throughput of the running instances (before the decision)."""
    reason: str
    """One line explaining the decision (for logs and experiment tables)."""

    @property
    def is_noop(self) -> bool:
        """True when nothing is started or stopped."""
        return not self.add and not self.remove


class Autoscaler(Protocol):
    """The common signature of every registered autoscaler (see ``AUTOSCALERS``)."""

    def __call__(
        self,
        function: str,
        predicted_rps: float,
        running: Sequence[Instance],
        configs: Sequence[ScaleConfig],
        *,
        min_instances: int = 0,
        max_instances: int | None = None,
    ) -> ScaleDecision: ...


# -- candidate configurations ------------------------------------------------------------------


def candidate_configs(
    table: ProfileTable,
    model: str,
    slo_ms: float,
    *,
    sm_values: Iterable[float] | None = None,
    quota_values: Iterable[float] | None = None,
    batches: Iterable[int] | None = None,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    count_in_service: bool = False,
) -> list[ScaleConfig]:
    """The configurations the autoscaler may choose from for ``model`` under ``slo_ms``.

    Who calls it: a controller when a function is deployed (or its SLO changes); the result is
    passed to ``heuristic_scale`` every period. Pure: it only queries ``table``.

    By default the grid is FaST-GShare's profiling points (§5.2): quotas 20..100 step 20 %, SMs
    6, 12, 24, 50, 60, 80, 100 % (6/12/24 interpolated on the shipped V100 table), at every batch
    the table measured for the model. Throughput is the table's ``batch * 1000 / latency_ms``.

    SLO filter — batching wait: a batch-b instance (b > 1) holds the first request of a batch
    until the batch is full or ``max_wait_ms`` passed. The fill time depends on the load the
    instance sees, which the autoscaler does not bound from below (the residual instance may see
    a trickle), so the worst case counted is the full timeout: a config is kept when
    ``latency_ms + (max_wait_ms if batch > 1 else 0) <= slo_ms``. For batch 1 it is just the
    latency. The wait is stored in ``ScaleConfig.wait_ms``. Queueing behind a running batch is
    not counted by default: Algorithm 1 sizes the fleet so that no instance is loaded above its
    profiled throughput. With ``count_in_service=True`` it is: a request that arrives just after
    a batch started waits for that batch before its own runs, so the worst case counted is
    ``2 * latency_ms + batching wait`` (the extra latency is added to ``wait_ms``). Controllers
    that must keep tail latency under the SLO (the simulator's ``fast-autoscale``) use it.

    Returns the kept configs sorted by (batch, quota, sm). Raises ``AutoscaleError`` naming the
    model, the SLO and the fastest (latency + wait) available when none meets the SLO, and
    ``ProfileError`` for an unknown model or an SM value below the table's measured range.
    """
    if not slo_ms > 0.0:
        raise AutoscaleError(f"slo_ms must be > 0, got {slo_ms} (model {model!r})")
    if not max_wait_ms >= 0.0:
        raise AutoscaleError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
    sms = sorted(set(FAST_SM_POINTS_PCT if sm_values is None else sm_values))
    quotas = sorted(set(FAST_QUOTA_POINTS_PCT if quota_values is None else quota_values))
    bs = sorted(set(table.batches(model) if batches is None else batches))
    if not (sms and quotas and bs):
        raise AutoscaleError(f"empty sm_values, quota_values or batches for model {model!r}")

    kept: list[ScaleConfig] = []
    fastest: ScaleConfig | None = None
    for b in bs:
        batching_wait_ms = max_wait_ms if b > 1 else 0.0
        for q in quotas:
            for sm in sms:
                lat = table.latency_ms(model, sm, q, b)
                wait_ms = batching_wait_ms + (lat if count_in_service else 0.0)
                cfg = ScaleConfig(
                    sm_pct=sm,
                    quota_pct=q,
                    batch=b,
                    throughput_rps=b * 1000.0 / lat,
                    latency_ms=lat,
                    wait_ms=wait_ms,
                )
                if fastest is None or cfg.worst_latency_ms < fastest.worst_latency_ms:
                    fastest = cfg
                if cfg.worst_latency_ms <= slo_ms:
                    kept.append(cfg)
    if not kept:
        assert fastest is not None
        raise AutoscaleError(
            f"no configuration of model {model!r} meets the SLO of {slo_ms:g} ms: the fastest "
            f"is {fastest.worst_latency_ms:.1f} ms (latency {fastest.latency_ms:.1f} ms + "
            f"batching wait {fastest.wait_ms:g} ms at sm {fastest.sm_pct:g}%, quota "
            f"{fastest.quota_pct:g}%, batch {fastest.batch})"
        )
    return kept


# -- FaST-GShare Algorithm 1 -------------------------------------------------------------------


def _eff_key(c: ScaleConfig) -> tuple[float, float, float, int, float, float, float, float]:
    # p_eff: highest RPR; ties → smaller area, higher T, smaller batch, then the fields.
    return (
        -c.rpr,
        c.area,
        -c.throughput_rps,
        c.batch,
        c.sm_pct,
        c.quota_pct,
        c.latency_ms,
        c.wait_ms,
    )


def _ideal_key(
    c: ScaleConfig, r: float
) -> tuple[float, float, float, int, float, float, float, float]:
    # p_ideal: smallest T − r; ties → higher RPR, smaller area, smaller batch, then the fields.
    return (
        c.throughput_rps - r,
        -c.rpr,
        c.area,
        c.batch,
        c.sm_pct,
        c.quota_pct,
        c.latency_ms,
        c.wait_ms,
    )


def _down_key(i: Instance) -> tuple[float, float, str]:
    # L_j order: ascending RPR (least efficient first); ties → lower T, then id.
    return (i.config.rpr, i.config.throughput_rps, i.instance_id)


def most_efficient(configs: Sequence[ScaleConfig]) -> ScaleConfig:
    """p_eff = argmax RPR (ties: smaller area, higher throughput, smaller batch)."""
    if not configs:
        raise AutoscaleError("no candidate configs")
    return min(configs, key=_eff_key)


def ideal_for(configs: Sequence[ScaleConfig], residual_rps: float) -> ScaleConfig | None:
    """p_ideal = argmin (T − r) over configs with T > r, or None when no config has T > r."""
    fitting = [c for c in configs if c.throughput_rps > residual_rps]
    return min(fitting, key=lambda c: _ideal_key(c, residual_rps)) if fitting else None


def _check_inputs(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    min_instances: int,
    max_instances: int | None,
) -> None:
    if not (predicted_rps >= 0.0 and math.isfinite(predicted_rps)):
        raise AutoscaleError(
            f"predicted_rps of {function!r} must be finite and >= 0, got {predicted_rps}"
        )
    if min_instances < 0:
        raise AutoscaleError(f"min_instances of {function!r} must be >= 0, got {min_instances}")
    if max_instances is not None and max_instances < max(min_instances, 0):
        raise AutoscaleError(
            f"max_instances of {function!r} must be >= min_instances={min_instances}, "
            f"got {max_instances}"
        )
    ids: set[str] = set()
    for inst in running:
        if inst.function != function:
            raise AutoscaleError(
                f"instance {inst.instance_id!r} serves {inst.function!r}, not {function!r}"
            )
        if inst.instance_id in ids:
            raise AutoscaleError(f"duplicate instance id {inst.instance_id!r} of {function!r}")
        ids.add(inst.instance_id)


# NOTE — FaST-GShare's Heuristic Scaling Algorithm (paper 000, §3.4.1, Algorithm 1).
# For a function F with predicted rate R and running instances J_i of throughput T_i, the gap is
# ΔRPS = R − Σ T_i. Every config p has an efficiency RPR_p = T_p / (S_p · Q_p), requests/s per
# unit of spatio-temporal GPU area.
# * Scale up (ΔRPS > 0): the bulk of the gap goes to the most efficient config p_eff = argmax RPR:
#   n = ⌊ΔRPS / T_eff⌋ instances; the residual r = ΔRPS − n·T_eff (0 ≤ r < T_eff) goes to one
#   instance of the smallest sufficient config p_ideal = argmin (T_p − r) over T_p > r. When r = 0
#   (ΔRPS an exact multiple) no p_ideal is added — line 6 assumes r > 0. Because r < T_eff, p_eff
#   itself always has T > r, so p_ideal always exists (a float-rounding r ≥ T_eff falls back to
#   p_eff). ΔRPS = 0 changes nothing (line 3 tests ≥ 0, but n = 0 and r = 0 add nothing).
# * Scale down (ΔRPS < 0): the running instances form the priority queue L_F sorted ascending by
#   RPR (least efficient first; ties: lower T, then id), and the front is popped while
#   ΔR + T_front ≤ 0, i.e. while removing it keeps Σ T ≥ R, adding T_front to ΔR each time.
#   As printed, the while-loop (line 15: while ΔR < 0) never terminates when the front does not
#   fit (nothing changes); we implement the intent and stop at the first instance whose removal
#   would leave capacity < R. We do not skip it to look for a smaller instance further back:
#   those are more efficient and the paper keeps efficient pods the longest.
# After Algorithm 1, the operator's bounds apply: max_instances caps the additions (dropping
# p_ideal first, then p_eff copies — coverage may then fail and the reason says so; an already
# over-cap set is not trimmed), and min_instances first undoes the last removals and then adds
# p_eff instances (the config Algorithm 1 keeps longest) until the count reaches the minimum.
# Note the algorithm is not a fixed point in one step: new instances may let the next period
# remove old, less efficient ones.


def _raise_to_min(
    function: str,
    min_instances: int,
    running: Sequence[Instance],
    add: list[ScaleConfig],
    remove: list[str],
    configs: Sequence[ScaleConfig],
    pick: Callable[[], ScaleConfig],
) -> tuple[list[ScaleConfig], list[str], bool]:
    """The operator's lower bound after a scaling rule (Algorithm 1's and ``gshare-burst``'s):
    undo removals (instance ids) first, then add ``pick()`` configs; ``(add, remove,
    raised)``."""
    count = len(running) + len(add) - len(remove)
    if count >= min_instances:
        return add, remove, False
    deficit = min_instances - count
    undo = min(deficit, len(remove))
    if undo:
        remove = remove[: len(remove) - undo]
        deficit -= undo
    if deficit:
        if not configs:
            raise AutoscaleError(
                f"function {function!r} needs min_instances={min_instances} but has no "
                "candidate configs"
            )
        add = add + [pick()] * deficit
    return add, remove, True


def heuristic_scale(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    configs: Sequence[ScaleConfig],
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> ScaleDecision:
    """FaST-GShare Algorithm 1 for one function (see the NOTE above).

    Who calls it: ``policy.control.control_step`` (the reconcile step of both worlds' controllers),
    every reconcile period, with ``predicted_rps`` from ``policy.rate``, the function's running
    (and starting) instances, and its ``candidate_configs``. ``running`` must only hold instances of
    ``function`` with distinct ids.

    What must hold after the controller applies the decision: Σ T ≥ R (coverage, unless
    ``max_instances`` capped the additions) and, on scale-down, removing the next instance the
    rule would pick would break coverage. The decision does not depend on the order of
    ``running`` or ``configs``. Raises ``AutoscaleError`` when instances must be added but
    ``configs`` is empty.
    """
    _check_inputs(function, predicted_rps, running, min_instances, max_instances)
    capacity_rps = math.fsum(i.config.throughput_rps for i in running)
    delta_rps = predicted_rps - capacity_rps
    add: list[ScaleConfig] = []
    remove: list[str] = []
    notes: list[str] = []

    if delta_rps > _EPS_RPS:
        if not configs:
            raise AutoscaleError(
                f"function {function!r} needs {delta_rps:.3f} more rps but has no candidate configs"
            )
        p_eff = most_efficient(configs)
        t_eff = p_eff.throughput_rps
        n = math.floor(delta_rps / t_eff)
        r = delta_rps - n * t_eff
        add.extend([p_eff] * n)
        notes.append(f"scale up dRPS={delta_rps:.2f}: {n} x p_eff {p_eff.label()}")
        if r > _EPS_RPS:
            p_ideal = ideal_for(configs, r) or p_eff
            add.append(p_ideal)
            notes.append(f"+ p_ideal {p_ideal.label()} for r={r:.2f}")
    elif delta_rps < -_EPS_RPS:
        d_r = delta_rps
        for inst in sorted(running, key=_down_key):
            if d_r >= -_EPS_RPS or d_r + inst.config.throughput_rps > _EPS_RPS:
                break
            remove.append(inst.instance_id)
            d_r += inst.config.throughput_rps
        notes.append(f"scale down dRPS={delta_rps:.2f}: remove {len(remove)} least-RPR instance(s)")
    else:
        notes.append(f"steady: dRPS={delta_rps:.2f}")

    # -- operator bounds, applied after Algorithm 1 --
    if max_instances is not None:
        room = max(0, max_instances - len(running))
        if len(add) > room:
            add = add[:room]
            after = capacity_rps + math.fsum(c.throughput_rps for c in add)
            notes.append(
                f"capped by max_instances={max_instances}: capacity {after:.2f} rps "
                f"< R {predicted_rps:.2f} rps"
            )
    add, remove, raised = _raise_to_min(
        function, min_instances, running, add, remove, configs, lambda: most_efficient(configs)
    )
    if raised:
        notes.append(f"raised to min_instances={min_instances}")

    return ScaleDecision(
        function=function,
        add=tuple(add),
        remove=tuple(remove),
        delta_rps=delta_rps,
        reason="; ".join(notes),
    )


# -- baseline: Kubernetes-HPA-style target utilisation ------------------------------------------

# NOTE — target-utilisation baseline (Kubernetes Horizontal Pod Autoscaler style).
# Every instance has the same fixed config of throughput T; the desired replica count is
# n = ⌈R / (target_util · T)⌉ so each instance runs at ≤ target_util of its capacity (HPA's
# desiredReplicas = ⌈currentMetric / target⌉ with the metric being rps per replica). Scaling up
# starts n − current instances; scaling down stops the newest first (``running`` is ordered
# oldest first, the order the controller started them). HPA's ±10 % tolerance band is not
# applied: the controller's reconcile period and rate smoothing play that role here.


def target_utilisation_scale(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    config: ScaleConfig,
    target_util: float = 0.7,
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> ScaleDecision:
    """The target-utilisation baseline for one function (see the NOTE above).

    Who calls it: the same controllers as ``heuristic_scale``, through ``AUTOSCALERS``
    ("target-util"). ``running`` is ordered oldest first. After applying the decision the
    function runs ``clamp(⌈R / (target_util · T)⌉, min_instances, max_instances)`` instances
    (counting replicas, whatever their config).
    """
    _check_inputs(function, predicted_rps, running, min_instances, max_instances)
    if not (0.0 < target_util <= 1.0):
        raise AutoscaleError(f"target_util must be in (0, 1], got {target_util}")
    capacity_rps = math.fsum(i.config.throughput_rps for i in running)
    delta_rps = predicted_rps - capacity_rps
    per_instance_rps = target_util * config.throughput_rps
    # The relative tolerance keeps 70 / (0.7 · 100) = 1.0000000000000002 at one replica.
    desired = max(0, math.ceil(predicted_rps / per_instance_rps - 1e-9))
    notes = [f"target {target_util:g} x {config.label()}: desired {desired}"]
    if max_instances is not None and desired > max_instances:
        desired = max_instances
        notes.append(f"capped by max_instances={max_instances}")
    if desired < min_instances:
        desired = min_instances
        notes.append(f"raised to min_instances={min_instances}")
    current = len(running)
    add: tuple[ScaleConfig, ...] = ()
    remove: tuple[str, ...] = ()
    if desired > current:
        add = (config,) * (desired - current)
    elif desired < current:
        remove = tuple(i.instance_id for i in reversed(running[desired:]))
    return ScaleDecision(
        function=function, add=add, remove=remove, delta_rps=delta_rps, reason="; ".join(notes)
    )


def fixed_config(configs: Sequence[ScaleConfig]) -> ScaleConfig:
    """The config the target-util baseline uses: the whole GPU (sm 100 %, quota 100 %) with the
    highest throughput (i.e. the best batch), or the highest-throughput config when no full-GPU
    config meets the SLO. This is the classic one-GPU-per-replica deployment, at its best
    batch, so the baseline is not weakened."""
    if not configs:
        raise AutoscaleError("no candidate configs")
    full = [c for c in configs if c.sm_pct >= 100.0 and c.quota_pct >= 100.0]
    pool = full or list(configs)
    return min(
        pool,
        key=lambda c: (-c.throughput_rps, c.area, c.batch, c.sm_pct, c.quota_pct, c.latency_ms),
    )


def target_util_autoscaler(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    configs: Sequence[ScaleConfig],
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> ScaleDecision:
    """``target_utilisation_scale`` at ``target_util=0.7`` on ``fixed_config(configs)``, with the
    common ``Autoscaler`` signature."""
    return target_utilisation_scale(
        function,
        predicted_rps,
        running,
        fixed_config(configs),
        min_instances=min_instances,
        max_instances=max_instances,
    )


# -- gshare's default: burst-aware scaling on the peak-hold and backlog signals ------------------


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """Burst signals of one function at a reconcile step, beyond the predicted rate.

    Built by ``policy.control.control_step`` from the function's ``RatePredictor`` and the
    controller's observation (both worlds fill it the same way) and handed to autoscalers that
    read it (``reads_load_signals``). Invariants (checked): rates finite and ``>= 0``, counts
    ``>= 0``, ``period_s > 0``.
    """

    period_s: float
    """Reconcile period the rates were counted over (seconds)."""
    last_rps: float
    """Arrival rate of the newest period (requests/s)."""
    peak_rps: float
    """Largest per-period arrival rate over the hold window (``RatePredictor.hold``)."""
    outstanding: int
    """Requests queued or in flight anywhere (gateway and instances)."""

    def __post_init__(self) -> None:
        if not (self.period_s > 0.0 and math.isfinite(self.period_s)):
            raise AutoscaleError(f"period_s must be finite and > 0, got {self.period_s}")
        for name, v in (("last_rps", self.last_rps), ("peak_rps", self.peak_rps)):
            if not (v >= 0.0 and math.isfinite(v)):
                raise AutoscaleError(f"{name} must be finite and >= 0, got {v}")
        if self.outstanding < 0:
            raise AutoscaleError(f"outstanding must be >= 0, got {self.outstanding}")


class DemandSource(enum.Enum):
    """Which signal set the demand a ``gshare-burst`` decision sized the fleet for."""

    RATE = "rate"
    """The controller's predicted rate (EWMA / short window max × its headroom)."""
    PEAK = "peak"
    """Headroom × the peak per-period rate of the hold window (a recent burst)."""
    BACKLOG = "backlog"
    """Headroom × the last rate plus the queued backlog drained within one period."""


@dataclass(frozen=True, slots=True)
class BurstDemand:
    """The demand ``burst_demand`` computed, and why (typed, for tests and reasons)."""

    demand_rps: float
    """Capacity the fleet is sized to (requests/s)."""
    source: DemandSource
    """The signal that set it (the largest of the three)."""
    backlog: int
    """Requests beyond what the running instances hold in service (Σ batch)."""


def burst_demand(
    predicted_rps: float,
    running: Sequence[Instance],
    signals: LoadSignals | None,
    headroom: float,
) -> BurstDemand:
    """The demand of ``BurstAutoscaler`` (see the NOTE above it): the largest of the predicted
    rate, ``headroom × peak_rps`` and ``headroom × last_rps + backlog / period_s``. Without
    signals, the predicted rate."""
    if signals is None:
        return BurstDemand(predicted_rps, DemandSource.RATE, 0)
    in_service = sum(i.config.batch for i in running)
    backlog = max(0, signals.outstanding - in_service)
    candidates = (
        (predicted_rps, DemandSource.RATE),
        (headroom * signals.peak_rps, DemandSource.PEAK),
        (headroom * signals.last_rps + backlog / signals.period_s, DemandSource.BACKLOG),
    )
    demand, source = max(candidates, key=lambda c: c[0])
    return BurstDemand(demand, source, backlog)


# NOTE — gshare-burst, gshare's default autoscaler (gshare's own design; it follows Algorithm 1
# of FaST-GShare §3.4.1 for the configs — p_eff, p_ideal, least-RPR-first removal — Knative's
# KPA for the idea of holding capacity over a long stable window, and queue-length signals as
# in Knative's panic mode). Why Algorithm 1 fails on real bursts: its rate is an EWMA / 3-period
# maximum, so a fleet is scaled down within seconds of a burst and the next burst of the same
# trace meets a cold start; ⌊ΔRPS/T_eff⌋ + one p_ideal mixes a thin, slow residual partition
# into the fleet, and join-shortest-queue routing (by queue length, not capacity) overloads it.
# The rule, for predicted rate R, the function's signals (``LoadSignals``) and knob h:
# * demand D = max(R, h · peak_rps, h · last_rps + backlog / period_s), where peak_rps is the
#   largest per-period rate of the last ``RatePredictor.hold`` periods (60 s by default) —
#   capacity is held for the recent peak, so scale-down is slow and scale-up instant
#   (asymmetric) — and backlog the requests beyond Σ batch of the running instances;
# * scale up (D > capacity C): a function whose fleet is empty and whose D fits one config gets
#   one p_ideal (the smallest sufficient config: thin partitions pack with other functions);
#   otherwise ⌈(D − C) / T_eff⌉ copies of p_eff (a homogeneous fleet of the most efficient
#   config, no thin residual);
# * scale down (D < C): least-RPR instances first, while the rest still cover D (Algorithm 1's
#   order and stop rule, on the held demand);
# * then the operator's bounds, as ``heuristic_scale`` applies them.
# Without signals (a caller that has none) D = R and the rule above still applies.


@dataclass(frozen=True, slots=True)
class BurstAutoscaler:
    """gshare-burst (see the NOTE above); the common ``Autoscaler`` signature plus
    ``signals``. Pure: its knobs are fields, everything else arrives per call."""

    headroom: float = 2.0
    """h: multiplier on the peak and the last rate (the knob ``autoscale-traces`` sweeps)."""

    reads_load_signals: bool = True
    """``policy.control.control_step`` passes ``signals=`` to autoscalers with this set."""

    def __post_init__(self) -> None:
        if not (self.headroom >= 1.0 and math.isfinite(self.headroom)):
            raise AutoscaleError(f"headroom must be finite and >= 1, got {self.headroom}")

    def __call__(
        self,
        function: str,
        predicted_rps: float,
        running: Sequence[Instance],
        configs: Sequence[ScaleConfig],
        *,
        min_instances: int = 0,
        max_instances: int | None = None,
        signals: LoadSignals | None = None,
    ) -> ScaleDecision:
        _check_inputs(function, predicted_rps, running, min_instances, max_instances)
        want = burst_demand(predicted_rps, running, signals, self.headroom)
        demand = want.demand_rps
        capacity_rps = math.fsum(i.config.throughput_rps for i in running)
        delta_rps = demand - capacity_rps
        add: list[ScaleConfig] = []
        remove: list[str] = []
        notes = [f"demand {demand:.2f} rps ({want.source.value}, backlog {want.backlog})"]
        if delta_rps > _EPS_RPS:
            if not configs:
                raise AutoscaleError(
                    f"function {function!r} needs {delta_rps:.3f} more rps but has no "
                    "candidate configs"
                )
            p_eff = most_efficient(configs)
            single = ideal_for(configs, demand) if not running else None
            if single is not None:
                add.append(single)
                notes.append(f"scale up: 1 x p_ideal {single.label()}")
            else:
                n = max(1, math.ceil(delta_rps / p_eff.throughput_rps - 1e-9))
                add.extend([p_eff] * n)
                notes.append(f"scale up dRPS={delta_rps:.2f}: {n} x p_eff {p_eff.label()}")
        elif delta_rps < -_EPS_RPS:
            d_r = delta_rps
            for inst in sorted(running, key=_down_key):
                if d_r + inst.config.throughput_rps > _EPS_RPS:
                    break
                remove.append(inst.instance_id)
                d_r += inst.config.throughput_rps
            notes.append(f"scale down dRPS={delta_rps:.2f}: remove {len(remove)}")
        else:
            notes.append("steady")

        if max_instances is not None:
            room = max(0, max_instances - len(running))
            if len(add) > room:
                add = add[:room]
                notes.append(f"capped by max_instances={max_instances}")
        fresh = not running and not add
        add, remove, raised = _raise_to_min(
            function,
            min_instances,
            running,
            add,
            remove,
            configs,
            lambda: (ideal_for(configs, demand) if fresh else None) or most_efficient(configs),
        )
        if raised:
            notes.append(f"raised to min_instances={min_instances}")
        return ScaleDecision(
            function=function,
            add=tuple(add),
            remove=tuple(remove),
            delta_rps=delta_rps,
            reason="; ".join(notes),
        )


def reads_load_signals(autoscaler: object) -> bool:
    """True when ``autoscaler`` takes the ``signals=`` keyword (``BurstAutoscaler``)."""
    return bool(getattr(autoscaler, "reads_load_signals", False))


DEFAULT_AUTOSCALER: Final[str] = "gshare-burst"
"""The autoscaler both worlds run unless told otherwise (``sim.cluster.ClusterConfig``,
``runtime.control.loop.ControllerConfig``, ``gshare serve --autoscaler``)."""


# -- registry and the multi-function wrapper ---------------------------------------------------

AUTOSCALERS: Final[Mapping[str, Autoscaler]] = {
    "fast-heuristic": heuristic_scale,
    "target-util": target_util_autoscaler,
    "gshare-burst": BurstAutoscaler(),
}
"""Named autoscalers shared by the CLI, the simulator and the runtime."""


def get_autoscaler(name: str) -> Autoscaler:
    """The registered autoscaler ``name``; ``AutoscaleError`` listing the known names otherwise."""
    try:
        return AUTOSCALERS[name]
    except KeyError:
        known = ", ".join(sorted(AUTOSCALERS))
        raise AutoscaleError(f"unknown autoscaler {name!r} (known: {known})") from None


def scale_all(
    predicted: Mapping[str, float],
    running: Sequence[Instance],
    configs_by_function: Mapping[str, Sequence[ScaleConfig]],
    *,
    autoscaler: str | Autoscaler = "fast-heuristic",
    min_instances: int = 0,
    max_instances: int | None = None,
) -> list[ScaleDecision]:
    """Run one autoscaler for every function in ``predicted``, in sorted function order.

    Who calls it: the controllers, every reconcile period. ``running`` may hold instances of any
    function (they are grouped by ``Instance.function``, keeping their order); instances of
    functions without a prediction are left untouched. A function missing from
    ``configs_by_function`` has no candidates (fine unless it must grow). The bounds apply to
    every function alike.
    """
    policy: Callable[..., ScaleDecision] = (
        get_autoscaler(autoscaler) if isinstance(autoscaler, str) else autoscaler
    )
    by_function: dict[str, list[Instance]] = {}
    for inst in running:
        by_function.setdefault(inst.function, []).append(inst)
    return [
        policy(
            fn,
            predicted[fn],
            by_function.get(fn, []),
            configs_by_function.get(fn, ()),
            min_instances=min_instances,
            max_instances=max_instances,
        )
        for fn in sorted(predicted)
    ]


def heuristic_scale_all(
    predicted: Mapping[str, float],
    running: Sequence[Instance],
    configs_by_function: Mapping[str, Sequence[ScaleConfig]],
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> list[ScaleDecision]:
    """Algorithm 1 over every function (its outer ``for F_j`` loop): ``scale_all`` with
    ``heuristic_scale``. One decision per function in ``predicted``, sorted by name."""
    return scale_all(
        predicted,
        running,
        configs_by_function,
        autoscaler=heuristic_scale,
        min_instances=min_instances,
        max_instances=max_instances,
    )


__all__ = [
    "AUTOSCALERS",
    "DEFAULT_AUTOSCALER",
    "BurstAutoscaler",
    "BurstDemand",
    "DemandSource",
    "LoadSignals",
    "burst_demand",
    "reads_load_signals",
    "DEFAULT_MAX_WAIT_MS",
    "FAST_QUOTA_POINTS_PCT",
    "FAST_SM_POINTS_PCT",
    "AutoscaleError",
    "Autoscaler",
    "Instance",
    "ScaleConfig",
    "ScaleDecision",
    "candidate_configs",
    "fixed_config",
    "get_autoscaler",
    "heuristic_scale",
    "heuristic_scale_all",
    "ideal_for",
    "most_efficient",
    "scale_all",
    "target_util_autoscaler",
    "target_utilisation_scale",
]
