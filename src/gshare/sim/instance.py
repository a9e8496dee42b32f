"""A simulated function instance: a batch queue in front of bursts on a ``SimGpu``.

Who calls it: the gateway (``enqueue``) and the cluster controller (``start`` / ``drain``). The
instance forms a batch of up to ``max_batch`` requests, waiting at most ``max_wait_ms`` for the
batch to fill (``policy.batching``, the rule the live instances use), runs it as one burst on its
GPU (which asks the token scheduler first) and completes every request of the batch when the burst
finishes. A cold start delays readiness by ``cold_start_ms``; requests routed to a starting instance
wait in its queue.

Burst work is the profile table's latency of the batch at the instance's SM share and quota
100 % (the time limit is the token scheduler's job), times Gaussian noise ``1 + sigma * N(0,1)``.

Two burst models (``InstanceConfig.launch``):

* ``None`` (default) — the whole burst is token-gated GPU time: the textbook time-slicing model
  in which a share's quota bounds its GPU time exactly;
* ``LaunchGating`` — the model the ``token-fidelity`` experiment validated against the measured
  V100 table: the token gates the host's kernel launches (``LaunchGating.launch_ms`` of the
  model's launch floor, ``ProfileTable.launch_floor_ms``), the device drains what was launched,
  and the burst completes at max(launches done, start + device time). Device time is the solo
  latency slowed by the interference of the other instances with work in flight on the GPU when
  the burst starts. Use it wherever the simulator must agree with the measured profiles at
  quota < 100 % (the autoscaler chooses configurations from those profiles).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gshare.policy.batching import keep_token_for_next_batch, next_batch
from gshare.policy.tokens import ClientSpec
from gshare.profiles import ProfileTable, kernels_per_inference
from gshare.resources import GpuShare
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import SimGpu
from gshare.sim.request import SimRequest

LAUNCH_REF_FLOOR_MS = 10.0
"""Reference launch floor of ``LaunchGating`` (a unit, not fitted: ``launch_scale`` is the gated
work's multiple of the floor for a model whose floor is 10 ms)."""


@dataclass(frozen=True, slots=True)
class LaunchGating:
    """Launch-gated bursts. The defaults are ``token-fidelity``'s earlier two-constant
    calibration (exponent 1), which the cluster experiments were run with; the experiment's
    three-constant calibration is in docs/journal/token-fidelity.md."""

    launch_scale: float = 1.3
    """Token-gated launch work at the reference floor, as a multiple of it (see ``launch_ms``)."""
    launch_exponent: float = 1.0
    """How the gated work grows with the floor: ``launch_scale x REF x (floor / REF) **
    launch_exponent`` (1.0: proportional to the floor)."""
    floor_quantile_pct: float = 0.0
    """Which launch floor: this percentile of the model's quota-100 latencies
    (``ProfileTable.launch_floor_ms``); 0 = their minimum."""
    launch_ms_per_kernel: float = 0.0
    """> 0: the gated work is this much per kernel the inference launches, for a model whose
    kernel count is known (``profiles.kernels_per_inference``), instead of the floor rule."""
    kernels_capped_by_floor: bool = False
    """With ``launch_ms_per_kernel``: the gated work is the smaller of the two rules (each an
    upper bound: a kernel's launch costs at most so much, and the launches happen within the
    model's host floor)."""

    def launch_ms(self, floor_ms: float, device_ms: float, kernels: int | None = None) -> float:
        """Token-gated launch work of one inference of a model whose launch floor is
        ``floor_ms`` (and which launches ``kernels`` kernels, when known), capped at its device
        time (launches cannot outlast the inference).

        NOTE — gated work per kernel (FaST-GShare §3.3.2: the hook asks for a token per
        ``cuLaunchKernel``). With ``launch_ms_per_kernel`` and a kernel count the rule is
        ``G = launch_ms_per_kernel x kernels``: the work the token throttles is the host's
        launch path, one pass per kernel. On the V100 table the gated work inferred from the
        10-20 % rows is 70-90 us per counted kernel for most models, where its ratio to the
        floor ranges 0.4-1.7 (docs/journal/token-fidelity.md).

        NOTE — gated share of the floor (FaST-GShare §3.3.2: the hook gates kernel launches,
        not the rest of the host's work). Rule: ``G = launch_scale x R x (C / R) **
        launch_exponent`` with R = ``LAUNCH_REF_FLOOR_MS``; an exponent above 1 says that the
        token-gated part of a model's host floor C grows faster than C (small models' floors are
        mostly per-inference work the token does not gate). Why and the fit:
        ``experiments/token_fidelity.py`` and docs/journal/token-fidelity.md."""
        by_floor = self._by_floor(floor_ms)
        if self.launch_ms_per_kernel > 0.0 and kernels:
            by_kernels = self.launch_ms_per_kernel * kernels
            if self.kernels_capped_by_floor:
                by_kernels = min(by_kernels, by_floor)
            return min(by_kernels, device_ms)
        return min(by_floor, device_ms)

    def _by_floor(self, floor_ms: float) -> float:
        """The floor rule (``launch_ms``'s first NOTE), uncapped."""
        if floor_ms <= 0:
            return 0.0
        if self.launch_exponent == 1.0:  # exactly the proportional rule (bit-for-bit)
            return self.launch_scale * floor_ms
        ref = LAUNCH_REF_FLOOR_MS
        return self.launch_scale * ref * float((floor_ms / ref) ** self.launch_exponent)


def gap_class(bounds_ms: Sequence[float], gap_ms: float) -> int:
    """The gap class of ``gap_ms`` among ascending upper ``bounds_ms``: the first bound at
    least ``gap_ms``, else the last (``InstanceConfig.busy_gap_factors``; its fit,
    ``experiments.fidelity.busy_factors_by_gap``, classes alike)."""
    return min(bisect_left(bounds_ms, gap_ms), len(bounds_ms) - 1)


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    function: str
    model: str
    """Model name in the profile table."""
    share: GpuShare
    max_batch: int = 1
    max_wait_ms: float = 0.0
    priority: int = 0
    cold_start_ms: float = 0.0
    noise_sigma: float = 0.0
    """Relative standard deviation of a burst's duration."""
    busy_gap_factors: tuple[tuple[float, float], ...] = ()
    """(arrival gap upper bound ms, factor) rows, bounds ascending: a batch's busy time is
    multiplied by the factor of the first row whose bound is at least the time between its
    request's arrival and the arrival of the request routed here before it (the first request:
    the last row; a batch: the mean over its requests). A live CPU instance computes faster when
    its requests come close together (``experiments.fidelity.busy_factors_by_gap``, which
    classes the live answers by the same gap); empty: no such factor."""
    first_busy_ms: float | None = None
    """The busy time of the instance's first batch, in place of the model's (and of its gap
    factor): a live CPU instance's first inference is several times slower than the ones after
    it; None: as the others."""
    launch: LaunchGating | None = None
    """Burst model (see the module docstring); None = whole burst token-gated."""
    kernels_per_request: int = 0
    """The preemption points of its bursts: each request's work is this many equal module
    calls, and a token's end is noticed only when a call returns (``SimGpu.run_burst``'s
    ``point_work_ms``, the live CPU instance's module hook); 0: anywhere. Whole-burst model
    only (``launch`` None)."""
    wakeup_ms: tuple[float, ...] = ()
    """Wake-up samples (ms) of the instance's batching thread: a request that reaches an idle
    instance (nothing queued or running) starts one drawn sample later, the hand-over from the
    live instance's IO thread to its batching thread (part of the live ``queue_ms``); empty:
    at once."""
    batch_gap_ms: tuple[float, ...] = ()
    """Loop-gap samples (ms) of the instance's batching thread: a batch that is ready when the
    one before it ends starts one drawn sample later, its token kept meanwhile
    (``SimGpu.hold_token``): the live loop encodes and sends the answers and takes the next
    batch between the two (part of the live ``queue_ms``); empty: at once."""


class SimInstance:
    """One instance of a function on one simulated GPU."""

    def __init__(
        self,
        loop: EventLoop,
        gpu: SimGpu,
        instance_id: str,
        config: InstanceConfig,
        profiles: ProfileTable,
        rng: np.random.Generator,
        on_complete: Callable[[SimRequest], None],
    ) -> None:
        self.loop = loop
        self.gpu = gpu
        self.instance_id = instance_id
        self.config = config
        self.profiles = profiles
        self.rng = rng
        self.on_complete = on_complete
        self.queue: deque[SimRequest] = deque()
        self.in_flight: list[SimRequest] = []
        self.ready = False
        self.stopped = False
        self.draining = False
        self.started_ms = loop.now_ms
        self.on_ready: Callable[[SimInstance], None] | None = None
        self.on_stopped: Callable[[SimInstance], None] | None = None
        self.on_batch_busy: Callable[[SimInstance, float, int], None] | None = None
        """Called when a batch is answered: (this instance, the batch's busy ms, its size)."""
        self._in_flight_busy_ms = 0.0
        self._last_arrival_ms: float | None = None
        """Arrival time of the last request taken into a batch here (None: none yet); with the
        queue's order it gives each request's gap (``busy_gap_factors``)."""
        self._served = False
        """Whether a batch has started here (the first takes ``first_busy_ms``)."""
        self._gap_bounds_ms = tuple(bound for bound, _ in config.busy_gap_factors)
        self._timer_at: float | None = None
        self._waking = False
        """The batching thread is waking up (``InstanceConfig.wakeup_ms``) or in its loop gap
        after a batch (``InstanceConfig.batch_gap_ms``): no batch starts before ``_on_woken``."""
        self._work_cache: dict[int, float] = {}
        self._launch_floor_ms: float | None = None
        self._launch_kernels: int | None = None
        """The model's kernel count (``profiles.kernels_per_inference``), read with the floor."""
        s = config.share
        gpu.add_client(
            ClientSpec(instance_id, s.sm_pct, s.quota_request, s.quota_limit, config.priority)
        )
        if config.cold_start_ms > 0:
            loop.after(config.cold_start_ms, self._become_ready)
        else:
            self._become_ready()

    # -- API ----------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self.queue) + len(self.in_flight)

    def enqueue(self, req: SimRequest) -> None:
        if self.stopped:
            raise RuntimeError(f"request routed to stopped instance {self.instance_id}")
        idle = self.ready and not self.queue and not self.in_flight and not self._waking
        req.queued_ms = self.loop.now_ms
        self.queue.append(req)
        if idle and self.config.wakeup_ms:
            w = self.config.wakeup_ms
            self._waking = True
            self.loop.after(w[int(self.rng.integers(len(w)))], self._on_woken)
            return
        self._maybe_dispatch()

    def _on_woken(self) -> None:
        self._waking = False
        self._maybe_dispatch()

    def drain(self) -> None:
        """Stop accepting work; stop once the queue and the running batch are done."""
        self.draining = True
        self._maybe_stop()

    # -- internals ----------------------------------------------------------------------------

    def _become_ready(self) -> None:
        if self.stopped:
            return
        self.ready = True
        if self.on_ready:
            self.on_ready(self)
        self._maybe_dispatch()

    def _work_ms(self, n: int) -> float:
        base = self._work_cache.get(n)
        if base is None:
            c = self.config
            base = self.profiles.latency_ms(c.model, c.share.sm_pct, 100.0, n)
            self._work_cache[n] = base
        if self.config.noise_sigma > 0:
            base *= max(0.1, 1.0 + self.config.noise_sigma * float(self.rng.standard_normal()))
        return base

    def _gap_factor(self, arrivals_ms: Sequence[float]) -> float:
        """The busy time's factor of a batch whose requests arrived at ``arrivals_ms`` (queue
        order), each classed by the time since the arrival of the request before it here
        (``InstanceConfig.busy_gap_factors``): the mean of their rows'."""
        rows, total = self.config.busy_gap_factors, 0.0
        for at in arrivals_ms:
            last = self._last_arrival_ms
            gap_ms = math.inf if last is None else at - last
            total += rows[gap_class(self._gap_bounds_ms, gap_ms)][1]
            self._last_arrival_ms = at
        return total / len(arrivals_ms)

    def _maybe_dispatch(self) -> None:
        if not self.ready or self.in_flight or not self.queue or self.stopped or self._waking:
            return
        c = self.config
        now = self.loop.now_ms
        d = next_batch(len(self.queue), self.queue[0].arrival_ms, now, c.max_batch, c.max_wait_ms)
        if d.take == 0:
            t = d.deadline_ms
            assert t is not None  # the queue is not empty
            if self._timer_at is None or self._timer_at > t:
                self._timer_at = t
                self.loop.at(t, self._on_timer)
            return
        n = d.take
        self.in_flight = [self.queue.popleft() for _ in range(n)]
        for r in self.in_flight:
            r.start_ms = now
            r.instance_id = self.instance_id
        work = self._work_ms(n)
        if c.busy_gap_factors:
            work *= self._gap_factor([r.arrival_ms for r in self.in_flight])
        if not self._served and c.first_busy_ms is not None:
            work = c.first_busy_ms
        self._served = True
        self._in_flight_busy_ms = work
        if c.launch is None:
            k = c.kernels_per_request * n
            self.gpu.run_burst(
                self.instance_id, work, self._on_batch_done, point_work_ms=work / k if k else 0.0
            )
            return
        if self._launch_floor_ms is None:
            self._launch_floor_ms = self.profiles.launch_floor_ms(
                c.model, c.launch.floor_quantile_pct
            )
            self._launch_kernels = kernels_per_inference().get(c.model)
        device = work * self.gpu.interference.slowdown(self.gpu.active_sm_pct(self.instance_id))
        launch = c.launch.launch_ms(self._launch_floor_ms, device, self._launch_kernels)
        self.gpu.run_burst(self.instance_id, launch, self._on_batch_done, device_ms=device)

    def _on_timer(self) -> None:
        self._timer_at = None
        self._maybe_dispatch()

    def _on_batch_done(self) -> None:
        now = self.loop.now_ms
        done, self.in_flight = self.in_flight, []
        if self.on_batch_busy is not None and done:
            self.on_batch_busy(self, self._in_flight_busy_ms, len(done))
        token_wait_ms = self.gpu.last_token_wait_ms.get(self.instance_id, 0.0)
        for r in done:
            r.finish_ms = r.instance_finish_ms = now
            r.token_wait_ms = token_wait_ms
            self.on_complete(r)
        gaps = self.config.batch_gap_ms
        if gaps and self._next_ready(now):
            self.gpu.hold_token(self.instance_id)
            self._waking = True  # no batch starts before the gap ends
            self.loop.after(gaps[int(self.rng.integers(len(gaps)))], self._on_woken)
            return
        self._maybe_dispatch()
        self._maybe_stop()

    def _next_ready(self, now_ms: float) -> bool:
        """A batch can start now (``policy.batching.keep_token_for_next_batch``)."""
        if not self.queue or self.stopped or not self.ready:
            return False
        c = self.config
        return keep_token_for_next_batch(
            len(self.queue), self.queue[0].arrival_ms, now_ms, c.max_batch, c.max_wait_ms
        )

    def _maybe_stop(self) -> None:
        if self.draining and not self.in_flight and not self.queue and not self.stopped:
            self.stopped = True
            self.ready = False
            self.gpu.remove_client(self.instance_id)
            if self.on_stopped:
                self.on_stopped(self)
