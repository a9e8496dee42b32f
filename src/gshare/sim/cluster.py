"""A simulated GPU cluster with a controller that autoscales and places instances.

The controller is the simulator's twin of the live runtime's controller and runs the same
reconcile step (``policy.control.control_step``): every ``period_ms`` of virtual time, for each
function, it

1. counts the function's arrivals in the last period (the rate predictor of ``policy.rate``:
   ``max(EWMA, window max) × headroom``);
2. applies keep-alive and scale to zero when the function has ``keep_alive_s`` (as
   ``gshare serve`` does), and the queued-demand floor;
3. asks the autoscaler (``policy.autoscale``, ``gshare-burst`` by default) which
   configurations to add and which instances to remove;
4. binds new instances to a GPU and a rectangle with the placer (``policy.placement``, Maximal
   Rectangles by default) and starts them (cold start ``cold_start_ms``); removed instances
   drain their queues, then release their rectangle.

A function with ``keep_alive_s`` is also stepped at once when a request arrives and it has no
instance (a cold start, as the runtime's gateway nudges its controller). Without
``keep_alive_s`` (FaST-GShare's experiments) only the periodic step runs.

Who calls it: experiments (``fast-autoscale``) build a ``SimCluster``, register functions,
drive workloads at ``cluster.gateway`` and read ``cluster.metrics()``. GPUs are created lazily
up to ``max_gpus``; "GPUs used" is the number holding at least one instance, integrated over
time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from gshare.policy import autoscale
from gshare.policy.autoscale.measured import (
    at_current_configs,
    config_from_busy,
    next_busy_ms_per_request,
)
from gshare.policy.control import (
    ControlDecision,
    ControlParams,
    ControlState,
    FunctionObservation,
    cold_start_wanted,
    control_step,
)
from gshare.policy.placement import NoCapacity, make_placer
from gshare.policy.tokens import TokenConfig
from gshare.profiles import ProfileTable
from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.gpu import GpuStats, InterferenceModel, SimGpu
from gshare.sim.instance import InstanceConfig, LaunchGating, SimInstance
from gshare.sim.priorities import PRIO_CONTROL
from gshare.sim.profiler import CPU_RUNTIME_WAKEUP_MS, DEFAULT_WAKEUP_MS
from gshare.sim.request import RequestLog


@dataclass(frozen=True)
class SimFunction:
    """A deployed function as the simulated controller sees it."""

    name: str
    model: str
    slo_ms: float
    configs: tuple[autoscale.ScaleConfig, ...]
    """Candidate configurations (``autoscale.candidate_configs``)."""
    min_instances: int = 0
    max_instances: int | None = None
    max_wait_ms: float = 0.0
    quota_limit_pct: float | None = None
    """Quota limit given to instances (default: their request, as FaST-GShare profiles)."""
    keep_alive_s: float | None = None
    """Idle time after which the function is scaled to ``min_instances`` (``gshare serve``'s
    keep-alive; cold starts are then also stepped at once). None: no keep-alive."""
    priority: int = 0
    """Token priority of its instances (the spec's ``priority``: higher is served first by
    ``policy.tokens``, as the live token server does with ``--priority-sharing tokens``)."""
    kernels_per_request: int = 0
    """Module calls per request, its instances' preemption points
    (``sim.instance.InstanceConfig.kernels_per_request``); 0: a token is cut anywhere."""
    throughput_from_busy: bool = False
    """Its configs' throughputs follow the busy time its instances measure, as ``gshare serve``
    estimates them for a function it has not profiled (``policy.autoscale.measured``: every
    period, from the mean over the last answers); until the first answer, ``configs`` as
    given. False: ``configs`` always."""


LIVE_FORK_COLD_START_MS: Final[float] = 360.0
"""Cold start of an instance as the live runtime measures it: ``bench/cold_start.py``, first
request to a resnet50 function scaled to zero with ``--launcher fork`` (gshare serve's default),
median of 7 trials: 0.36 s (README, live runtime benchmarks). That figure runs from the request
to its answer (nudge, placement, fork from the template, model map, token registration, the first
CPU inference), so taking all of it as the simulated instance's start delay is conservative.
Since the agent and the controller look for a starting instance's readiness at once (they
polled every 200 / 250 ms), the same benchmark gives 0.26 s; the experiments keep 0.36 s, with
which their published figures were made (a slower start is the conservative side)."""


@dataclass
class ClusterConfig:
    max_gpus: int = 4
    period_ms: float = 1000.0
    """Controller reconcile period."""
    control_phase_ms: float = 0.0
    """Delay of the controller's first tick after ``start`` (0 <= phase < ``period_ms``); the
    ticks after it follow every ``period_ms``. The live controller ticks on its own clock, so
    where its periods fall against a workload's arrivals is arbitrary; with phase 0 a workload
    that starts with the simulation is always counted on the same boundaries (see
    ``SimCluster.start``)."""
    control_ticks_ms: tuple[float, ...] = ()
    """The controller's tick times, ms after ``start``, ascending (a live controller's, as it
    recorded them: its periods run a little longer than ``period_ms``); empty: every
    ``period_ms`` from ``control_phase_ms``. Given, the ticks before the first one follow every
    ``period_ms`` at its phase, and those after the last every ``period_ms``; each tick's rate
    sample is its arrivals over the time since the previous tick, as the live controller's."""
    cold_start_ms: float = LIVE_FORK_COLD_START_MS
    """Delay from an instance's start to its readiness (default: the live fork launcher's)."""
    control: ControlParams = field(default_factory=ControlParams)
    """Rate prediction, keep-alive and back-off knobs (``policy.control``)."""
    placer: str = "mra"
    autoscaler: str | autoscale.Autoscaler = autoscale.DEFAULT_AUTOSCALER
    """A registered name (``policy.autoscale.AUTOSCALERS``) or an autoscaler itself (an
    experiment sweeping a knob, e.g. ``BurstAutoscaler(headroom=2)``)."""
    token_config: TokenConfig = field(default_factory=TokenConfig)
    token_reuse: bool = False
    """Instances keep their token for a batch ready at once (the live runtime's token reuse;
    with ``policy.tokens.LIVE_TOKEN_CONFIG`` the simulator runs the runtime's token protocol)."""
    interference: InterferenceModel = field(default_factory=InterferenceModel)
    noise_sigma: float = 0.0
    busy_gap_factors: tuple[tuple[float, float], ...] = ()
    """Multipliers of a batch's busy time by the gap between its requests' arrivals and the ones
    before them at the instance (``sim.instance.InstanceConfig.busy_gap_factors``); empty:
    none."""
    first_busy_ms: float | None = None
    """The busy time of each new instance's first batch (``InstanceConfig.first_busy_ms``; a
    live CPU instance's first inference, measured); None: as the others."""
    instance_wakeup_ms: tuple[float, ...] = ()
    """Wake-up samples of an idle instance's batching thread (``sim.instance.InstanceConfig.
    wakeup_ms``: measured, the live ``queue_ms`` of requests that reached an idle instance);
    empty: none."""
    batch_gap_ms: tuple[float, ...] = ()
    """Loop-gap samples of an instance's batching thread between a batch and the next one ready
    (``sim.instance.InstanceConfig.batch_gap_ms``: measured, the live instance's time from a
    batch's end to the next batch's start, its token kept); empty: none."""
    launch: LaunchGating | None = field(default_factory=LaunchGating)
    """Burst model of instances (default: launch-gated, validated by ``token-fidelity``)."""
    token_wakeup_ms: float = DEFAULT_WAKEUP_MS
    """Wake-up charged to a token a burst had to wait for (``token-fidelity``'s constant)."""
    token_grant_ms: float = 0.0
    """Uncharged delay before a token granted the moment it was asked for
    (``SimGpu.token_grant_ms``: the live CPU runtime's acquire round trip)."""
    token_release_ms: float = 0.0
    """Delay before an idle client's token release is processed, the device held idle
    (``SimGpu.token_release_ms``: measured, the live tokens' time held beyond their busy time
    less ``token_grant_ms``); 0: at once."""
    platform_ms: tuple[float, ...] = ()
    """Per-request platform latency samples (``sim.gateway``: the HTTP exchange and the hop to
    the instance, drawn per answer); empty: none."""
    platform_serial_ms: float = 0.0
    """The platform's serial work per request (``sim.gateway``: a FIFO stage before routing, so a
    burst's later requests wait for the earlier ones); 0: none."""
    platform_outstanding_share: float = 0.0
    """The part of each platform sample during which an answered request still counts as
    outstanding at the gateway (``sim.gateway``: the hops to the instance and back, inside the
    live gateway's window); 0: none."""
    rotate_route_ties: bool = False
    """Routing ties spread round-robin, as ``gshare serve``'s gateway does (``sim.gateway``);
    False: to the first instance, as the papers' experiments were run."""
    admission_slo_factor: float | None = None
    """The gateway's SLO-aware admission (``sim.gateway``): shed a request predicted to take
    over this many SLOs, as ``gshare serve`` does (its default:
    ``policy.admission.DEFAULT_MAX_LATENCY_SLO_FACTOR``). None (the papers' experiments): no
    shedding."""
    admission_interval_ms: Mapping[str, float] | None = None
    """The admission's starting service estimate per function (``sim.gateway``: the live
    gateway's, carried over from the runs its server served before); None: none, every function
    starts unmeasured."""


def cpu_runtime_fields() -> dict[str, Any]:
    """``ClusterConfig`` fields that simulate the live runtime's instances on the CPU device
    (``gshare serve`` on a machine without a GPU): the runtime's token protocol
    (``LIVE_TOKEN_CONFIG``, token reuse), the whole burst token-gated (``launch=None``: a CPU
    ``predict`` has no device queue that drains without a token), no GPU interference, the
    CPU grant latency ``CPU_RUNTIME_WAKEUP_MS``, and the live gateway's round-robin of routing
    ties. Who calls it: ``gshare simulate`` for a
    scenario whose functions all say ``device: cpu``, and ``bench/_autoscale.py``.

    NOTE — the CPU runtime's burst model. The defaults (launch-gated bursts, ``launch_scale``
    1.3, interference beta 1.07, 1-ms wake-up) were fitted on the V100 table and FaST-GShare
    Fig. 10. Applied to two saturated CPU functions at quotas 0.3 / 0.6 (``share-pair``, with
    its 8-ms requests of then) they gave 20 / 40 % achieved shares against 28.6 / 58.5 % live
    (``bench/fidelity.py --quick``, load 3.4): a waiting neighbour counted as interference
    (×2.07 device time) and 1.3 × the burst was charged to the token. Checked on
    ``llm-autoscale`` and ``priority-pair`` (docs/simulator.md, fidelity table)."""
    from gshare.policy.tokens import LIVE_TOKEN_CONFIG

    return {
        "launch": None,
        "token_wakeup_ms": CPU_RUNTIME_WAKEUP_MS,
        "token_grant_ms": CPU_RUNTIME_WAKEUP_MS,
        "token_config": LIVE_TOKEN_CONFIG,
        "token_reuse": True,
        "interference": InterferenceModel(enabled=False),
        "rotate_route_ties": True,
    }


@dataclass
class _Live:
    inst: SimInstance
    policy_view: autoscale.Instance
    gpu: int


class SimCluster:
    def __init__(
        self,
        loop: EventLoop,
        profiles: ProfileTable,
        config: ClusterConfig,
        rng: np.random.Generator,
    ) -> None:
        self.loop = loop
        self.profiles = profiles
        self.config = config
        self.rng = rng
        self.log = RequestLog()
        self.gateway = Gateway(
            loop,
            self.log,
            config.admission_slo_factor,
            config.platform_ms,
            rng.spawn(1)[0] if config.platform_ms else None,  # leaves rng's own draws as they were
            config.platform_serial_ms,
            config.rotate_route_ties,
            config.platform_outstanding_share,
            config.admission_interval_ms,
        )
        self.placer = make_placer(config.placer, max_gpus=config.max_gpus)
        self.scale = (
            autoscale.get_autoscaler(config.autoscaler)
            if isinstance(config.autoscaler, str)
            else config.autoscaler
        )
        self.gpus: dict[int, SimGpu] = {}
        self.functions: dict[str, SimFunction] = {}
        self._live: dict[str, _Live] = {}
        self._control: dict[str, ControlState] = {}
        self._last_arrivals: dict[str, int] = {}
        self._busy_ms: dict[str, float] = {}
        """Per function with ``throughput_from_busy``: the busy-time estimate (ms/request)."""
        self._configs_now: dict[str, tuple[autoscale.ScaleConfig, ...]] = {}
        """Per such function: its configs at the last period (``_configs``)."""
        self._next_id = 0
        self._migrated_out: set[int] = set()
        self.migrations = 0
        """Cross-GPU moves applied (placers with defragmentation)."""
        self.capacity_shortfalls = 0
        """Instances the autoscaler asked for that no GPU had room for."""
        self.instances_started = 0
        """Instances launched (each one a cold start), migrations' replacements included."""
        self.gateway.on_cold = self._on_cold
        self._gpus_used_ms = 0.0
        self._last_t = loop.now_ms
        self.timeline: list[dict[str, Any]] = []
        """One row per control period: time, predicted RPS, instances, GPUs used."""
        self.on_decision: Callable[[autoscale.ScaleDecision], None] | None = None

    # -- setup --------------------------------------------------------------------------------

    def add_function(self, fn: SimFunction) -> None:
        self.functions[fn.name] = fn
        self.gateway.register(fn.name, fn.slo_ms)
        self._control[fn.name] = self.config.control.fresh_state()
        self._last_arrivals[fn.name] = 0

    def start(self, until_ms: float) -> None:
        """Run the controller every period until ``until_ms``; the first decision at now +
        ``control_phase_ms`` takes no rate sample (nothing was counted over a whole period).

        NOTE — the controller's phase (gshare's own; found on ``bench/fidelity.py``'s LLM
        segment). ``gshare-burst`` holds capacity for the largest per-period arrival count of
        the last minute, and for a bursty trace that count depends on where the period
        boundaries fall: the segment's burst at 60 s counts 79 requests in one period with the
        boundaries on its whole seconds and 88-105 with them 0.2-0.6 s later, which decides
        whether a second instance starts at 61-69 s. The live controller's boundaries fall
        wherever its clock puts them; a simulator that always counts on the workload's whole
        seconds sees one phase, here nearly the least bursty. A caller that compares with a live
        run gives the simulator that run's recorded ticks (``control_ticks_ms``: each live
        period is a little longer than ``period_ms``, as the live loop sets the next tick from
        the end of its wait, and drifts by about 1 ms a period); without them it varies
        ``control_phase_ms`` over seeds."""
        phase = self.config.control_phase_ms
        if not 0.0 <= phase < self.config.period_ms:
            raise ValueError(
                f"control_phase_ms must be in [0, period_ms={self.config.period_ms}), got {phase}"
            )
        period = self.config.period_ms
        given = self.config.control_ticks_ms
        if any(b <= a for a, b in itertools.pairwise(given)) or (given and given[0] < 0.0):
            raise ValueError(f"control_ticks_ms must be ascending and not negative, got {given}")
        now = self.loop.now_ms
        ticks = [now + t for t in given]
        if ticks:  # the periodic ticks before the first given one, at its phase
            at = now + given[0] % period
            lead = []
            while at < ticks[0] - period / 2.0:  # (not a tick a rounding error before it)
                lead.append(at)
                at += period
            ticks = [*lead, *ticks]
        else:
            ticks = [now + phase]

        def step(i: int, previous_ms: float | None) -> None:
            t = self.loop.now_ms
            # given ticks: each rate sample over the time since the previous tick
            interval = t - previous_ms if given and previous_ms is not None else None
            self.reconcile(first=i == 0, interval_ms=interval)
            nxt = ticks[i + 1] if i + 1 < len(ticks) else t + period
            if nxt <= until_ms:
                self.loop.at(nxt, lambda: step(i + 1, t), PRIO_CONTROL)

        if ticks[0] == now or ticks[0] <= until_ms:
            self.loop.at(ticks[0], lambda: step(0, None), PRIO_CONTROL)

    # -- control loop -------------------------------------------------------------------------

    def reconcile(self, first: bool = False, interval_ms: float | None = None) -> None:
        """One control period: measure, predict, decide, apply. ``first``: the first tick
        (``start``), whose count covers no whole period and is not a rate sample;
        ``interval_ms``: the time since the previous tick (None: ``period_ms``)."""
        self._integrate()
        period_s = (interval_ms if interval_ms is not None else self.config.period_ms) / 1000.0
        for name, fn in self.functions.items():
            n = self.gateway.arrivals[name] - self._last_arrivals[name]
            self._last_arrivals[name] = self.gateway.arrivals[name]
            decision = self._step(fn, None if first else n, period_s)
            self.timeline.append(
                {
                    "t_s": self.loop.now_ms / 1000.0,
                    "function": name,
                    "observed_rps": n / period_s,
                    "predicted_rps": decision.predicted_rps,
                    "instances": len(self._running(name)),
                    "gpus_used": self.placer.gpus_used(),
                }
            )

    def _running(self, function: str) -> list[autoscale.Instance]:
        return [lv.policy_view for lv in self._live.values() if lv.policy_view.function == function]

    def _step(self, fn: SimFunction, arrivals: int | None, period_s: float) -> ControlDecision:
        """``policy.control.control_step`` for ``fn``, then apply its decision."""
        gw = self.gateway
        last_ms = gw.last_activity_ms.get(fn.name)
        configs = self._configs(fn, period_tick=arrivals is not None)
        running = self._running(fn.name)
        if fn.throughput_from_busy:  # the running instances at their config's new throughput
            running = at_current_configs(running, configs)
        obs = FunctionObservation(
            function=fn.name,
            arrivals=arrivals,
            interval_s=period_s,
            idle_since_s=None if last_ms is None else last_ms / 1000.0,
            outstanding=gw.outstanding.get(fn.name, 0),
            queued=gw.pending(fn.name),
            running=running,
            configs=configs,
            min_instances=fn.min_instances,
            max_instances=fn.max_instances,
            keep_alive_s=fn.keep_alive_s,
        )
        decision, self._control[fn.name] = control_step(
            obs, self._control[fn.name], self.loop.now_ms / 1000.0, self.scale, self.config.control
        )
        if self.on_decision:
            self.on_decision(decision.scale)
        for iid in decision.remove:
            self._stop(iid)
        for cfg in decision.add:
            self._start(fn, cfg)
        return decision

    def _configs(self, fn: SimFunction, *, period_tick: bool) -> tuple[autoscale.ScaleConfig, ...]:
        """``fn``'s configs as the controller sees them: with ``throughput_from_busy``,
        re-estimated at every period tick (``runtime.control.loop`` refreshes them there too)."""
        if not fn.throughput_from_busy:
            return fn.configs
        busy = self._busy_ms.get(fn.name)
        if period_tick and busy is not None:
            self._configs_now[fn.name] = tuple(
                config_from_busy(c.sm_pct, c.quota_pct, c.batch, busy) for c in fn.configs
            )
        return self._configs_now.get(fn.name, fn.configs)

    def _on_batch_busy(self, inst: SimInstance, busy_ms: float, size: int) -> None:
        """A batch was answered: every answer folds into the estimate, as the live gateway's."""
        name = inst.config.function
        for _ in range(size):
            self._busy_ms[name] = next_busy_ms_per_request(self._busy_ms.get(name), busy_ms, size)

    def _on_cold(self, function: str) -> None:
        """The gateway queued a request for a function with no instance (a cold start)."""
        fn = self.functions.get(function)
        if fn is None or fn.keep_alive_s is None:
            return  # without keep-alive only the periodic step runs (module doc)

        def nudge() -> None:
            if cold_start_wanted(self.gateway.pending(function), len(self._running(function))):
                self._integrate()
                self._step(fn, None, self.config.period_ms / 1000.0)

        self.loop.at(self.loop.now_ms, nudge, PRIO_CONTROL)

    def _gpu(self, index: int) -> SimGpu:
        gpu = self.gpus.get(index)
        if gpu is None:
            gpu = SimGpu(
                self.loop,
                index,
                token_config=self.config.token_config,
                interference=self.config.interference,
                token_wakeup_ms=self.config.token_wakeup_ms,
                token_grant_ms=self.config.token_grant_ms,
                token_reuse=self.config.token_reuse,
                token_release_ms=self.config.token_release_ms,
            )
            self.gpus[index] = gpu
        return gpu

    def _start(self, fn: SimFunction, cfg: autoscale.ScaleConfig) -> None:
        self._next_id += 1
        iid = f"{fn.name}-{self._next_id}"
        try:
            binding = self.placer.place_share(iid, cfg.share(quota_limit_pct=fn.quota_limit_pct))
        except NoCapacity:
            self.capacity_shortfalls += 1  # the cluster is full: serve with what runs
            return
        self._launch(fn, cfg, iid, binding.gpu)
        self._apply_moves()

    def _launch(
        self, fn: SimFunction, cfg: autoscale.ScaleConfig, iid: str, gpu_index: int
    ) -> None:
        share = cfg.share(quota_limit_pct=fn.quota_limit_pct)
        gpu = self._gpu(gpu_index)
        inst = SimInstance(
            self.loop,
            gpu,
            iid,
            InstanceConfig(
                function=fn.name,
                model=fn.model,
                share=share,
                max_batch=cfg.batch,
                max_wait_ms=fn.max_wait_ms,
                priority=fn.priority,
                cold_start_ms=self.config.cold_start_ms,
                noise_sigma=self.config.noise_sigma,
                busy_gap_factors=self.config.busy_gap_factors,
                first_busy_ms=self.config.first_busy_ms,
                launch=self.config.launch,
                kernels_per_request=fn.kernels_per_request,
                wakeup_ms=self.config.instance_wakeup_ms,
                batch_gap_ms=self.config.batch_gap_ms,
            ),
            self.profiles,
            self.rng,
            self.gateway.completed,
        )
        inst.on_stopped = self._on_stopped
        if fn.throughput_from_busy:
            inst.on_batch_busy = self._on_batch_busy
        self.instances_started += 1
        self._live[iid] = _Live(inst, autoscale.Instance(iid, fn.name, cfg), gpu_index)
        self.gateway.add_instance(inst)

    def _stop(self, iid: str) -> None:
        lv = self._live.pop(iid)
        self.gateway.remove_instance(lv.inst)

    def _on_stopped(self, inst: SimInstance) -> None:
        self._integrate()
        if id(inst) in self._migrated_out:
            self._migrated_out.discard(id(inst))
            return  # its placement already moved to the replacement
        self.placer.release(inst.instance_id)
        self._apply_moves()

    def _apply_moves(self) -> None:
        """Apply the placer's cross-GPU moves (defragmentation): serverless instances are
        stateless, so a move starts a replacement on the new GPU (cold start) and drains the old
        one; the placement binding keeps the instance id. Moves inside one GPU change only the
        rectangle, which the token scheduler does not need."""
        for mv in self.placer.take_moves():
            if not mv.is_cross_gpu:
                continue
            lv = self._live.get(mv.instance_id)
            if lv is None:
                continue
            fn = self.functions[lv.policy_view.function]
            self._migrated_out.add(id(lv.inst))
            self.gateway.remove_instance(lv.inst)
            del self._live[mv.instance_id]
            self.migrations += 1
            self._launch(fn, lv.policy_view.config, mv.instance_id, mv.new_gpu)

    # -- metrics ------------------------------------------------------------------------------

    def _integrate(self) -> None:
        now = self.loop.now_ms
        self._gpus_used_ms += self.placer.gpus_used() * (now - self._last_t)
        self._last_t = now

    def mean_gpus(self, since_ms: float = 0.0) -> float:
        """Time-weighted mean number of GPUs holding an instance (from t = 0)."""
        self._integrate()
        return self._gpus_used_ms / max(1e-9, self.loop.now_ms - since_ms)

    def gpu_stats(self) -> dict[int, GpuStats]:
        return {i: g.stats() for i, g in sorted(self.gpus.items())}
