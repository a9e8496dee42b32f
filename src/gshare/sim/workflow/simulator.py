"""The workflow cluster simulator: ESG's OpenWhisk-like controller in virtual time (ESG §3, §4).

Who calls it: the ``esg-*`` experiments (and the tests). ``WorkflowSim(workflows, policy,
config, seed).run(arrivals, horizon_ms)`` replays a request stream against a cluster of
invokers, with any ``WorkflowPolicy`` (ESG or a baseline) making every scheduling decision, and
returns a ``WorkflowRunResult``. The policy is called, never reimplemented, here: this module
is mechanism (queues, resources, containers, time, randomness, measurement).

NOTE (the controller loop; ESG §3.1 and Figure 2)
* A request of application ``a`` puts one job into the AFW queue of each source stage of ``a``;
  when every predecessor of a stage has finished for that request, a job enters the stage's
  queue (``policy.workflow.queues.AfwQueues``).
* Whenever something happens (an arrival, a task end) the controller runs a *round* at that
  instant: first the queues blocked on resources (when resources were released since they
  failed), then a round-robin pass over the other non-empty queues (``next_queue``), repeated
  while a pass dispatched something — so a queue with more jobs than one batch is served again
  in the same instant, and a round ends only when every non-empty queue is blocked.
* Serving a queue: build a ``StageContext`` from its oldest job, call ``plan_stage``, build a
  ``DispatchRequest`` (home invoker for a first stage, else the invokers that ran the
  predecessors of the jobs about to be batched), call ``select_invoker`` with a snapshot of the
  invokers. ``Dispatch`` → take up to ``config.batch`` jobs (fewer if the queue is shorter: a
  *configuration miss*, cf. ESG Table 4), hold the resources, start the task. ``NoInvoker`` →
  the queue is blocked until a task releases resources, then retried (the policy keeps its own
  recheck list). A ``Dispatch`` to an invoker without the free resources is a policy bug:
  ``SimulationError``.
* A task: container (warm / adopt a pre-warming one / cold start), then its inputs' transfer
  (local or remote, ``TransferModel``), then execution for
  ``PerfModel.sample_exec_ms(function, (n_jobs, vcpus, vgpus), rng)`` — the planned time is the
  mean; the sample carries ESG's Gaussian noise (§4).
* Pre-warming (``policy.prewarm``) runs every ``prewarm.period_ms`` until the horizon; idle
  containers are evicted after the keep-alive (10 min).

Time spent deciding: ``plan_stage`` and ``select_invoker`` are timed with
``time.perf_counter`` (wall clock, reported as the decision time). By default decisions take no
virtual time, so runs are deterministic for a seed; ``charge_decision_time=True`` adds the
measured time to virtual time (one sequential controller, as ESG's Fig. 9 counts Orion's search
time) at the price of machine-dependent results.

Metrics (``WorkflowRunResult``): per request the end-to-end latency (arrival → last stage done)
and SLO hit (latency <= SLO); a request unfinished when the run ends is a miss. Requests are
*measured* when they arrive in ``[warmup_ms, horizon_ms)``. Arrivals stop at the horizon; the
run continues until every request has finished or ``drain_ms`` more has passed.

Cost (ESG §4.1 prices): a task costs ``(vcpus x $0.034 + vgpus x $0.67) / h`` times its billed
time = transfer + execution (a function is billed while it runs, ESG's "running times"); cold
starts, idle warm containers (keep-alive) and pre-warming are not charged — ESG's cost is the
resource usage of the executions (Appendix A's objective), and pay-per-use serverless billing
does not charge idle instances. A task's cost is split evenly over its jobs; a request's cost is
the sum over its stages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from gshare.policy.prewarm import (
    PoolView,
    PrewarmParams,
    ewma,
    keep_alive_deadline_ms,
    observe_call,
    plan_prewarm,
)
from gshare.policy.workflow.dispatch import (
    Dispatch,
    InvokerState,
    NoInvoker,
    stage_request,
)
from gshare.policy.workflow.queues import AfwJob, AfwKey, AfwQueues, round_robin_pass
from gshare.policy.workflow.schedulers import StageContext, WorkflowPolicy
from gshare.sim.engine import EventLoop, SimulationError
from gshare.sim.priorities import (
    PRIO_ARRIVAL,
    PRIO_CONTAINER,
    PRIO_EVICT,
    PRIO_FINISH,
    PRIO_PREWARM,
    PRIO_ROUND,
)
from gshare.sim.workflow.cluster import Container, Invoker, Pool, TransferModel
from gshare.sim.workflow.results import RequestOutcome, WorkflowRunResult
from gshare.workflows.config import (
    CLUSTER_NODES,
    NODE_VCPUS,
    NODE_VGPUS,
    ConfigGrid,
    ConfigOption,
    FunctionConfig,
)
from gshare.workflows.perf import PerfModel, WorkflowPerf
from gshare.workflows.spec import WorkflowSpec


@dataclass(frozen=True, slots=True)
class WorkflowSimConfig:
    """The simulated platform. Defaults: ESG §4's cluster (16 invokers x 16 vCPUs x 7 vGPUs),
    the default 448-configuration grid, EWMA pre-warming, 10-minute keep-alive."""

    nodes: int = CLUSTER_NODES
    node_vcpus: int = NODE_VCPUS
    node_vgpus: int = NODE_VGPUS
    grid: ConfigGrid = field(default_factory=ConfigGrid)
    """Configurations offered to the schedulers (``PerfModel.options``)."""
    transfer: TransferModel = field(default_factory=TransferModel)
    prewarm: PrewarmParams | None = field(default_factory=PrewarmParams)
    """``None`` disables pre-warming (keep-alive still applies, with ``keep_alive_ms``)."""
    keep_alive_ms: float = 600_000.0
    """Used when ``prewarm`` is None (else ``prewarm.keep_alive_ms``)."""
    initial_warm_per_pool: int = 0
    """Idle warm containers of every function on every invoker at time 0 (the steady state of
    a platform that has served the workload for longer than a keep-alive; 0 = cold cluster)."""
    dispatch_ms: float = 0.0
    """A live mechanism's cost per task beyond the profiled execution (gshare: the scheduler's
    hop to the instance, the input's decoding, a quota change), added to every task's billed
    time; 0 for ESG's platform (its cost is in the transfer model)."""
    frontend_ms: float = 0.0
    """A request's cost outside the stages (gshare: the client's HTTP exchange with the
    gateway): its source stages are queued this long after its arrival."""
    frontend_jitter_ms: tuple[float, ...] = ()
    """Offsets of the front-end delay (ms, either sign), one drawn per request (uniformly,
    seeded) and added to ``frontend_ms``, the sum taken at 0 or more: a live platform's latency
    spread that the model's per-task noise does not produce (``bench/twin.py`` takes them from
    a calibration run: each request's latency less the run's median). Empty: none."""
    fixed_pools: bool = False
    """gshare's live model (``gshare.runtime.gateway.esg``): the containers are the
    ``initial_warm_per_pool`` running instances, never started nor evicted; a task needs an
    idle one (an invoker offers a function ``min(free slots, idle instances)`` host units), so
    a queue waits instead of cold-starting — without asking the policy while no instance of
    its function is idle anywhere. Use with ``prewarm=None``."""
    warmup_ms: float = 0.0
    """Requests arriving before this are served but not measured."""
    drain_ms: float = 300_000.0
    """After the horizon, run at most this long for the remaining requests to finish."""
    noise_sigma_frac: float | None = None
    """Relative std of execution-time noise (None: ``PerfModel``'s default, 5 %)."""
    charge_decision_time: bool = False
    """Count the measured wall-clock time of every policy call into virtual time (the
    controller is one sequential thread: a task starts when its decision is done, and a round
    waits for the controller to be free). Off by default because it makes runs depend on the
    machine; ESG's Fig. 9 counts Orion's search time this way."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.initial_warm_per_pool < 0:
            raise ValueError("initial_warm_per_pool must be >= 0")
        if self.warmup_ms < 0 or self.drain_ms < 0:
            raise ValueError("warmup_ms and drain_ms must be >= 0")
        if self.dispatch_ms < 0 or self.frontend_ms < 0:
            raise ValueError("dispatch_ms and frontend_ms must be >= 0")
        if any(not math.isfinite(x) for x in self.frontend_jitter_ms):
            raise ValueError("frontend_jitter_ms must hold finite numbers")
        if self.fixed_pools and (self.prewarm is not None or self.initial_warm_per_pool < 1):
            raise ValueError("fixed_pools needs prewarm=None and initial_warm_per_pool >= 1")


@dataclass(slots=True)
class _Request:
    request_id: int
    application: str
    arrival_ms: float
    slo_ms: float
    measured: bool
    pending: dict[str, int]
    """Stage -> predecessors not finished yet."""
    done: set[str] = field(default_factory=set)
    node_of: dict[str, int] = field(default_factory=dict)
    plan: Mapping[str, FunctionConfig] | None = None
    finish_ms: float | None = None
    cost_usd: float = 0.0
    cold_starts: int = 0
    remote_inputs: int = 0


@dataclass(slots=True, eq=False)
class _Task:
    key: AfwKey
    function: str
    invoker_id: int
    config: FunctionConfig
    """Executed configuration: the dispatched one with ``batch`` = jobs actually taken."""
    jobs: tuple[AfwJob, ...]
    container: Container
    billed_ms: float


class WorkflowSim:
    """One simulation run of a set of workflows under one scheduler (module NOTE)."""

    def __init__(
        self,
        workflows: Mapping[str, WorkflowSpec],
        policy: WorkflowPolicy,
        config: WorkflowSimConfig | None = None,
        *,
        perf: WorkflowPerf | None = None,
        seed: int = 0,
    ) -> None:
        if not workflows:
            raise ValueError("no workflows to simulate")
        self.workflows = dict(workflows)
        self.policy = policy
        self.config = config if config is not None else WorkflowSimConfig()
        self.perf: WorkflowPerf = perf if perf is not None else PerfModel.default()
        self.seed = seed
        self.loop = EventLoop()
        cfg = self.config
        self.nodes = [Invoker(i, cfg.node_vcpus, cfg.node_vgpus) for i in range(cfg.nodes)]
        functions = sorted({s.function for wf in self.workflows.values() for s in wf.stages})
        self.functions = functions
        self.options: Mapping[str, Sequence[ConfigOption]] = {
            fn: self.perf.options(fn, cfg.grid) for fn in functions
        }
        self._succ = {a: wf.successors() for a, wf in self.workflows.items()}
        self._pred = {a: wf.predecessors() for a, wf in self.workflows.items()}
        self._fn = {a: {s.name: s.function for s in wf.stages} for a, wf in self.workflows.items()}
        self._rng_exec = np.random.default_rng([seed, 201])
        self._rng_front = np.random.default_rng([seed, 307])
        self.queues = AfwQueues()
        for a, wf in self.workflows.items():
            for st in wf.topological_order():
                self.queues = self.queues.register(AfwKey(a, st))
        self._requests: dict[int, _Request] = {}
        self._blocked: dict[AfwKey, int] = {}
        self._epoch = 0
        self._round_pending = False
        self._ctrl_free_ms = 0.0
        self._unfinished = 0
        self._draining = False
        self._horizon_ms = 0.0
        self._next_container = 0
        self._plan_ms: list[float] = []
        self._select_ms: list[float] = []
        self._c: dict[str, float] = dict.fromkeys(
            (
                "tasks",
                "jobs",
                "warm_starts",
                "cold_starts",
                "adopted_prewarm",
                "prewarm_started",
                "evictions",
                "local_inputs",
                "remote_inputs",
                "config_misses",
                "no_invoker",
                "rounds",
                "cost_usd",
                "vcpu_ms",
                "vgpu_ms",
            ),
            0.0,
        )
        self._alloc_vcpus = 0
        self._alloc_vgpus = 0
        self._alloc_since = 0.0
        self._vcpu_area = 0.0
        self._vgpu_area = 0.0
        self._keep_alive_ms = cfg.prewarm.keep_alive_ms if cfg.prewarm else cfg.keep_alive_ms
        self._ran = False

    # -- public -----------------------------------------------------------------------------------

    def run(self, arrivals: Sequence[tuple[float, str]], horizon_ms: float) -> WorkflowRunResult:
        """Serve ``arrivals`` (``(time_ms, application)``, sorted, all before ``horizon_ms``)
        and return the result. A ``WorkflowSim`` runs once."""
        if self._ran:
            raise SimulationError("a WorkflowSim runs once; build a new one")
        self._ran = True
        self._horizon_ms = horizon_ms
        last = -1.0
        for t, app in arrivals:
            if app not in self.workflows:
                raise ValueError(f"arrival of unknown application {app!r}")
            if t < last or t < 0 or t >= horizon_ms:
                raise ValueError(f"arrivals must be sorted and in [0, {horizon_ms}), got {t}")
            last = t
        self.policy.prepare(list(self.workflows.items()), self.options, self.seed)
        for node in self.nodes:
            for fn in self.functions:
                for _ in range(self.config.initial_warm_per_pool):
                    c = self._new_container(fn, node.invoker_id, "idle", 0.0)
                    node.pool(fn).idle.append(c)
                    self._schedule_eviction(c)
        it = iter(arrivals)
        self._schedule_next_arrival(it)
        if self.config.prewarm is not None:
            self.loop.at(0.0, self._prewarm_tick, PRIO_PREWARM)
        self.loop.run(until_ms=horizon_ms)
        if self._unfinished > 0:
            self._draining = True
            self.loop.run(until_ms=horizon_ms + self.config.drain_ms)
        end = self.loop.now_ms
        self._settle_alloc(end)
        return WorkflowRunResult(
            scheduler=getattr(self.policy, "name", type(self.policy).__name__),
            requests=[
                RequestOutcome(
                    r.request_id,
                    r.application,
                    r.arrival_ms,
                    r.slo_ms,
                    None if r.finish_ms is None else r.finish_ms - r.arrival_ms,
                    r.cost_usd,
                    r.measured,
                    r.cold_starts,
                    r.remote_inputs,
                )
                for r in self._requests.values()
            ],
            plan_ms=np.array(self._plan_ms, dtype=np.float64),
            select_ms=np.array(self._select_ms, dtype=np.float64),
            counters=self._counters(end),
            peak_vcpus=[n.peak_vcpus for n in self.nodes],
            peak_vgpus=[n.peak_vgpus for n in self.nodes],
            horizon_ms=horizon_ms,
            end_ms=end,
        )

    # -- arrivals ---------------------------------------------------------------------------------

    def _schedule_next_arrival(self, it: Any) -> None:
        for t, app in it:
            self.loop.at(t, partial(self._arrive, app, it), PRIO_ARRIVAL)
            return

    def _arrive(self, app: str, it: Any) -> None:
        now = self.loop.now_ms
        wf = self.workflows[app]
        rid = len(self._requests)
        req = _Request(
            rid,
            app,
            now,
            wf.slo_ms,
            measured=now >= self.config.warmup_ms,
            pending={s: len(p) for s, p in self._pred[app].items()},
        )
        self._requests[rid] = req
        self._unfinished += 1
        front = self.config.frontend_ms
        jitter = self.config.frontend_jitter_ms
        if jitter:
            front = max(0.0, front + jitter[int(self._rng_front.integers(len(jitter)))])
        if front > 0:
            self.loop.at(now + front, lambda: self._enter(req), PRIO_ARRIVAL)
        else:
            self._enter(req)
        self._schedule_next_arrival(it)

    def _enter(self, req: _Request) -> None:
        """Queue the request's source stages (after the front end, ``frontend_ms``)."""
        now = self.loop.now_ms
        for st, n in req.pending.items():
            if n == 0:
                job = AfwJob(req.request_id, req.arrival_ms, now)
                self.queues = self.queues.push(AfwKey(req.application, st), job)
        self._request_round()

    # -- the controller ---------------------------------------------------------------------------

    def _request_round(self) -> None:
        if not self._round_pending:
            self._round_pending = True
            self.loop.at(self.loop.now_ms, self._round, PRIO_ROUND)

    def _round(self) -> None:
        self._round_pending = False
        if self.config.charge_decision_time and self._ctrl_free_ms > self.loop.now_ms:
            self._round_pending = True  # the controller is still busy deciding
            self.loop.at(self._ctrl_free_ms, self._round, PRIO_ROUND)
            return
        self._c["rounds"] += 1
        while True:
            progress = False
            for stale in [k for k, e in self._blocked.items() if e != self._epoch]:
                del self._blocked[stale]
                if self.queues.length(stale):
                    progress |= self._serve(stale)
            progress |= round_robin_pass(
                lambda: self.queues, self._set_queues, self._blocked, self._serve
            )
            if not progress:
                return

    def _set_queues(self, q: AfwQueues) -> None:
        self.queues = q

    def _serve(self, key: AfwKey) -> bool:
        """One plan + dispatch attempt for queue ``key`` (non-empty). True if a task started."""
        now = self.loop.now_ms
        jobs = self.queues.jobs_of(key)
        head = jobs[0]
        req = self._requests[head.request_id]
        app, stage = key.application, key.stage
        fn = self._fn[app][stage]
        if self.config.fixed_pools and not any(n.pool(fn).idle for n in self.nodes):
            self._blocked[key] = self._epoch  # no idle instance: nothing can run (as live)
            return False
        ctx = StageContext(
            application=app,
            workflow=self.workflows[app],
            stage=stage,
            done_stages=frozenset(req.done),
            elapsed_ms=now - head.arrival_ms,
            waiting_ms=now - head.enqueued_ms,
            queue_len=len(jobs),
            options=self.options,
            request_plan=req.plan,
            now_ms=now,
        )
        t0 = time.perf_counter()
        plan = self.policy.plan_stage(ctx)
        plan_ms = (time.perf_counter() - t0) * 1000.0
        self._plan_ms.append(plan_ms)
        preds = self._pred[app][stage]
        request = stage_request(
            app, fn, plan.candidates, preds,
            (self._requests[j.request_id].node_of for j in jobs), len(self.nodes),
        )  # fmt: skip
        snapshot = [
            InvokerState(
                n.invoker_id,
                min(n.free_vcpus, len(n.pool(fn).idle))
                if self.config.fixed_pools
                else n.free_vcpus,
                n.free_vgpus,
                n.warm_counts(),
                n.vcpus,
                n.vgpus,
            )
            for n in self.nodes
        ]
        t0 = time.perf_counter()
        decision = self.policy.select_invoker(request, snapshot, ctx)
        select_ms = (time.perf_counter() - t0) * 1000.0
        self._select_ms.append(select_ms)
        delay_ms = 0.0
        if self.config.charge_decision_time:
            self._ctrl_free_ms = max(self._ctrl_free_ms, now) + plan_ms + select_ms
            delay_ms = self._ctrl_free_ms - now
        if isinstance(decision, NoInvoker):
            self._c["no_invoker"] += 1
            self._blocked[key] = self._epoch
            return False
        if not isinstance(decision, Dispatch):
            raise SimulationError(f"{self.policy!r}: select_invoker returned {decision!r}")
        node = self._node(decision.invoker_id)
        cfg = decision.config
        if not node.fits(cfg.vcpus, cfg.vgpus):
            raise SimulationError(
                f"{getattr(self.policy, 'name', self.policy)}: dispatched {cfg} to invoker "
                f"{node.invoker_id} with only {node.free_vcpus} vCPUs / {node.free_vgpus} vGPUs "
                "free"
            )
        if cfg.batch > len(jobs):
            self._c["config_misses"] += 1
        taken, self.queues = self.queues.take(key, cfg.batch)
        if plan.request_plan is not None:
            for j in taken:
                r = self._requests[j.request_id]
                if r.plan is None:
                    r.plan = dict(plan.request_plan)
        self._start_task(
            key, fn, node, FunctionConfig(len(taken), cfg.vcpus, cfg.vgpus), taken, delay_ms
        )
        return True

    def _node(self, invoker_id: int) -> Invoker:
        if not 0 <= invoker_id < len(self.nodes):
            raise SimulationError(f"dispatch to unknown invoker {invoker_id}")
        return self.nodes[invoker_id]

    # -- tasks ------------------------------------------------------------------------------------

    def _start_task(
        self,
        key: AfwKey,
        fn: str,
        node: Invoker,
        cfg: FunctionConfig,
        jobs: tuple[AfwJob, ...],
        delay_ms: float = 0.0,
    ) -> None:
        """Hold the resources now; the container, transfer and execution start ``delay_ms``
        later (the controller's decision time, when it is charged)."""
        now = self.loop.now_ms
        self._settle_alloc(now)
        node.reserve(cfg.vcpus, cfg.vgpus)
        self._alloc_vcpus += cfg.vcpus
        self._alloc_vgpus += cfg.vgpus
        pool = node.pool(fn)
        info = self.perf.functions[fn]
        cold = False
        if pool.idle:
            container = pool.idle.pop()
            wait = 0.0
            self._c["warm_starts"] += 1
        elif pool.starting:
            container = pool.starting.pop(0)
            wait = max(0.0, container.ready_ms - now - delay_ms)
            self._c["adopted_prewarm"] += 1
        else:
            container = self._new_container(fn, node.invoker_id, "busy", now + info.cold_start_ms)
            wait = info.cold_start_ms
            cold = True
            self._c["cold_starts"] += 1
        container.state = "busy"
        pool.busy += 1
        alpha = self.config.prewarm.alpha if self.config.prewarm else 0.2
        pool.calls = observe_call(pool.calls, now, alpha)
        # inputs: local or remote per predecessor
        preds = self._pred[key.application][key.stage]
        local_n = remote_n = 0
        for j in jobs:
            r = self._requests[j.request_id]
            if cold:
                r.cold_starts += 1
            for p in preds:
                if r.node_of[p] == node.invoker_id:
                    local_n += 1
                else:
                    remote_n += 1
                    r.remote_inputs += 1
        self._c["local_inputs"] += local_n
        self._c["remote_inputs"] += remote_n
        transfer_ms = self.config.transfer.batch_ms(
            local_n * info.input_mb, local_n, remote_n * info.input_mb, remote_n
        )
        exec_ms = self.perf.sample_exec_ms(fn, cfg, self._rng_exec, self.config.noise_sigma_frac)
        billed = self.config.dispatch_ms + transfer_ms + exec_ms
        cost = self.perf.task_cost_usd(fn, cfg, billed)
        for j in jobs:
            self._requests[j.request_id].cost_usd += cost / len(jobs)
        self._c["tasks"] += 1
        self._c["jobs"] += len(jobs)
        self._c["cost_usd"] += cost
        self._c["vcpu_ms"] += cfg.vcpus * billed
        self._c["vgpu_ms"] += cfg.vgpus * billed
        task = _Task(key, fn, node.invoker_id, cfg, jobs, container, billed)
        self.loop.at(now + delay_ms + wait + billed, lambda: self._finish(task), PRIO_FINISH)

    def _finish(self, task: _Task) -> None:
        now = self.loop.now_ms
        node = self.nodes[task.invoker_id]
        self._settle_alloc(now)
        node.release(task.config.vcpus, task.config.vgpus)
        self._alloc_vcpus -= task.config.vcpus
        self._alloc_vgpus -= task.config.vgpus
        self._epoch += 1
        pool = node.pool(task.function)
        pool.busy -= 1
        alpha = self.config.prewarm.alpha if self.config.prewarm else 0.2
        pool.hold_ms = ewma(pool.hold_ms, task.billed_ms, alpha)
        c = task.container
        c.state = "idle"
        c.idle_since_ms = now
        pool.idle.append(c)
        self._schedule_eviction(c)
        app, stage = task.key.application, task.key.stage
        succ = self._succ[app][stage]
        n_stages = len(self._pred[app])
        for j in task.jobs:
            r = self._requests[j.request_id]
            r.done.add(stage)
            r.node_of[stage] = task.invoker_id
            for s in succ:
                r.pending[s] -= 1
                if r.pending[s] == 0:
                    self.queues = self.queues.push(
                        AfwKey(app, s), AfwJob(r.request_id, r.arrival_ms, now)
                    )
            if len(r.done) == n_stages:
                r.finish_ms = now
                self._unfinished -= 1
        if self._draining and self._unfinished == 0:
            self.loop.stop()
            return
        self._request_round()

    # -- containers -------------------------------------------------------------------------------

    def _new_container(self, fn: str, invoker_id: int, state: Any, ready_ms: float) -> Container:
        self._next_container += 1
        return Container(self._next_container, fn, invoker_id, state, ready_ms, ready_ms)

    def _schedule_eviction(self, c: Container) -> None:
        if self.config.fixed_pools:
            return  # live instances stay (``WorkflowSimConfig.fixed_pools``)
        since = c.idle_since_ms
        self.loop.at(
            keep_alive_deadline_ms(since, self._keep_alive_ms),
            lambda: self._evict(c, since),
            PRIO_EVICT,
        )

    def _evict(self, c: Container, since: float) -> None:
        if c.state == "idle" and c.idle_since_ms == since:
            self.nodes[c.invoker_id].pool(c.function).idle.remove(c)
            c.state = "evicted"
            self._c["evictions"] += 1

    def _prewarm_tick(self) -> None:
        params = self.config.prewarm
        now = self.loop.now_ms
        if params is None or now >= self._horizon_ms:
            return
        views: list[PoolView] = []
        pools: dict[tuple[str, int], Pool] = {}
        for node in self.nodes:
            for fn, pool in node.pools.items():
                pools[(fn, node.invoker_id)] = pool
                views.append(
                    PoolView(
                        fn,
                        node.invoker_id,
                        len(pool.idle),
                        pool.busy,
                        len(pool.starting),
                        self.perf.functions[fn].cold_start_ms,
                        pool.calls,
                        pool.hold_ms,
                    )
                )
        for action in plan_prewarm(views, now, params):
            pool = pools[(action.function, action.invoker_id)]
            ready = now + self.perf.functions[action.function].cold_start_ms
            for _ in range(action.count):
                c = self._new_container(action.function, action.invoker_id, "starting", ready)
                pool.starting.append(c)
                self.loop.at(ready, partial(self._container_ready, c), PRIO_CONTAINER)
                self._c["prewarm_started"] += 1
        self.loop.after(params.period_ms, self._prewarm_tick, PRIO_PREWARM)

    def _container_ready(self, c: Container) -> None:
        if c.state != "starting":  # adopted by a task meanwhile
            return
        pool = self.nodes[c.invoker_id].pool(c.function)
        pool.starting.remove(c)
        c.state = "idle"
        c.idle_since_ms = self.loop.now_ms
        pool.idle.append(c)
        self._schedule_eviction(c)

    # -- metrics ----------------------------------------------------------------------------------

    def _settle_alloc(self, now: float) -> None:
        dt = now - self._alloc_since
        if dt > 0:
            self._vcpu_area += self._alloc_vcpus * dt
            self._vgpu_area += self._alloc_vgpus * dt
        self._alloc_since = now

    def _counters(self, end: float) -> dict[str, float]:
        c = dict(self._c)
        total_vcpus = sum(n.vcpus for n in self.nodes)
        total_vgpus = sum(n.vgpus for n in self.nodes)
        c["vcpu_alloc_util"] = self._vcpu_area / (total_vcpus * end) if end > 0 else 0.0
        c["vgpu_alloc_util"] = self._vgpu_area / (total_vgpus * end) if end > 0 else 0.0
        c["mean_batch"] = c["jobs"] / c["tasks"] if c["tasks"] else 0.0
        c["config_miss_rate"] = c["config_misses"] / c["tasks"] if c["tasks"] else 0.0
        inputs = c["local_inputs"] + c["remote_inputs"]
        c["local_input_share"] = c["local_inputs"] / inputs if inputs else float("nan")
        c["events"] = float(self.loop.events_processed)
        c["unfinished"] = float(self._unfinished)
        c["containers"] = float(
            sum(
                len(p.idle) + p.busy + len(p.starting) for n in self.nodes for p in n.pools.values()
            )
        )
        return c
