"""The autoscalers' shared data: configurations (``ScaleConfig``), instances, decisions, the
``Autoscaler`` protocol, and the candidate configurations of a function (``candidate_configs``).
The package doc (``gshare.policy.autoscale``) says who calls what and what must hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """Burst signals of one function at a reconcile step, beyond the predicted rate.

    Built by ``policy.control.control_step`` from the function's ``RatePredictor`` and the
    controller's observation (both worlds fill it the same way) and handed to every autoscaler
    (``gshare-burst`` reads it; the others need only the predicted rate). Invariants
    (checked): rates finite and ``>= 0``, counts ``>= 0``, ``period_s > 0``.
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


@dataclass(frozen=True, slots=True)
class ScaleContext:
    """Everything an autoscaler may read about one function at one reconcile step: the time,
    the rates, the load signals, the current fleet and the operator's bounds (as Ray Serve's
    policies take their ``AutoscalingContext``).

    Built by ``policy.control.control_step`` (both worlds' controllers) and by ``scale_all``.
    ``running`` holds only instances of ``function``, with distinct ids (each autoscaler
    checks). An autoscaler reads what it needs and ignores the rest: ``signals`` is read by
    ``gshare-burst`` only; none reads ``now_s`` today (a policy with a memory of its own
    decisions, such as a cool-down, would)."""

    function: str
    predicted_rps: float
    """The rate to provision for (``policy.rate``, after keep-alive and the queued-demand
    floor), requests/s."""
    running: Sequence[Instance]
    """The function's instances that serve or will serve it (starting ones included), oldest
    first."""
    configs: Sequence[ScaleConfig]
    """Its candidate configurations (``candidate_configs``); may be empty."""
    min_instances: int = 0
    max_instances: int | None = None
    signals: LoadSignals | None = None
    """Burst signals beyond the predicted rate (None: a caller that has none)."""
    now_s: float = 0.0
    """The controller's clock at this step, seconds."""


class Autoscaler(Protocol):
    """The one signature of every registered autoscaler (see ``AUTOSCALERS``): a
    ``ScaleContext`` in, a ``ScaleDecision`` out. Pure: no clock, no I/O, no state kept
    between calls (knobs are fields of the autoscaler object)."""

    def __call__(self, ctx: ScaleContext) -> ScaleDecision: ...


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
