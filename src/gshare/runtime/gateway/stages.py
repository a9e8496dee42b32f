"""ESG live: the stage scheduler of deployed workflows (§3; docs/DESIGN.md §15).

Who calls it: ``WorkflowRunner`` (``gateway.workflows``) hands every stage of every workflow
request to ``StageScheduler.run_stage`` when the stage's inputs are ready, and awaits its
output; the control API builds the scheduler with the server's ``--workflow-policy`` and a
``StageHost`` (the controller's view of instances, profiles and token quotas). The decisions
are ``gshare.policy.workflow``'s — the very objects the workflow simulator calls
(``gshare.sim.workflow``): ESG (``esg``) or a baseline (``fast-gshare``, ``infless``, ``orion``,
``aquatope``). This module is the mechanism: queues, instances, quotas, time, measurement.

NOTE (ESG §3.1's controller loop, Figure 2, on gshare's spatio-temporal shares)
* Every (workflow, stage) has an application-function-wise (AFW) queue
  (``policy.workflow.queues``); a job is one request at one stage.
* A *round* runs whenever something changes (a job enqueued, a task ended, instances came or
  went): a round-robin pass over the non-empty, unblocked queues (``next_queue``), repeated
  while a pass started a task. Serving a queue: a ``StageContext`` from its oldest job →
  ``plan_stage`` (ESG_1Q over the stage's options) → a ``DispatchRequest`` (the home invoker
  for a first stage, else the devices that ran the predecessors of the jobs to batch) →
  ``select_invoker`` over a snapshot of the devices. ``NoInvoker`` blocks the queue until the
  next change; so does a function without an idle instance anywhere, before the policy is
  asked (no configuration could run; ESG's recheck list counts rounds where resources were
  short, not where the pool was busy — the simulator's ``fixed_pools`` does the same).
* The configuration space (``gshare.workflows.shares``): ``(batch, time quota)`` at the SM
  partition the function's instances run with; latency from the function's live profile
  (``gshare profile``); without one, only batches at the instance's own quota, each
  ``batch x`` the measured time per item (``measured_table``); cost = share area x time.
  An invoker is a device: ``QUOTA_UNITS`` units of its window and one host unit per idle
  instance of the function on it (a task runs on a running instance, never a new one:
  instances are the autoscaler's business).
* A task: take up to ``batch`` jobs, hold the quota units on the device, set the instance's
  token quota to the config's (``StageHost.set_quota``, in place, only when it changes, without
  waiting for it: the token server applies it at the instance's next token), send
  the jobs to that instance in one write (``Gateway.submit_to``; the instance's own batching
  wait is set to 0 once, so it runs them as one batch), release when all answered.

Metrics: ``gshare_workflow_stage_queue_seconds`` (enqueued → task start),
``gshare_workflow_stage_exec_seconds`` (task start → answers), ``gshare_workflow_cost_usd``
(per request, share area x time at ``shares.DEVICE_USD_PER_HOUR``) and
``gshare_workflow_tasks`` (by stage and quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter, Histogram

from gshare.policy.workflow.dispatch import (
    Dispatch,
    IdleInstance,
    InvokerState,
    pick_instance,
    stage_request,
)
from gshare.policy.workflow.esg import SHARE_POLICY_NAMES
from gshare.policy.workflow.queues import AfwJob, AfwKey, AfwQueues, round_robin_pass
from gshare.policy.workflow.schedulers import StageContext, WorkflowPolicy
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.runtime.gateway.channel import InstanceChannel
from gshare.runtime.gateway.errors import HttpError, status_of
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.metrics import LATENCY_BUCKETS_S
from gshare.workflows.config import ConfigOption, FunctionConfig
from gshare.workflows.shares import QUOTA_UNITS, ShareFunction, SharePerf, quota_pct_of
from gshare.workflows.spec import WorkflowSpec

log = logging.getLogger("gshare.stages")

RETRY_S = 0.1
"""A blocked queue is retried at least this often (instances may have come)."""
PERF_REFRESH_S = 5.0
"""How often the options are rebuilt from new profiles or measurements."""
PRUNE_S = 30.0
"""How often the remembered quotas of instances that are gone are dropped."""
WORKFLOW_POLICY_NAMES: tuple[str, ...] = SHARE_POLICY_NAMES
"""``gshare serve --workflow-policy``: ESG and the baselines (``policy.workflow.esg``'s
registry); ``direct`` (no scheduler: every stage goes through its function's own queue and
batching) is accepted too."""


@dataclass(frozen=True, slots=True)
class StageInstance:
    """A ready instance of a stage's function, as the controller sees it."""

    instance_id: str
    function: str
    device: int
    """Index in ``StageHost.device_count()`` (the invoker id)."""
    sm_pct: float
    quota_pct: float
    """Its token quota now (the scheduler changes it per task)."""


@dataclass(frozen=True, slots=True)
class StageFunction:
    """A stage function's share model: its SM partition, batches, quotas and profile."""

    share: ShareFunction
    table: ProfileTable
    source: str
    """Where the latencies come from: ``live profile`` or ``measured busy time``."""


class StageHost(Protocol):
    """The controller's side (``control.api``)."""

    def device_count(self) -> int: ...

    def stage_instances(self, function: str) -> Sequence[StageInstance]:
        """The ready instances of ``function``."""
        ...

    def instance_exists(self, instance_id: str) -> bool:
        """Whether the instance is still the controller's (ready or not)."""
        ...

    def stage_function(self, function: str) -> StageFunction | None:
        """None when the function is not deployed."""
        ...

    async def set_quota(self, instance_id: str, quota_pct: float) -> None: ...


PolicyFactory = Callable[[SharePerf], WorkflowPolicy]
"""Builds a fresh scheduler for a performance model (the baselines read its noise; Aquatope
optimises over it)."""


def measured_table(function: str, fn: ShareFunction, ms_per_item: float) -> ProfileTable:
    """A profile from the time per item the function's instances measured, as they ran (at
    their own quota, ``fn.quotas_pct``): ``batch x ms_per_item`` at each offered batch —
    batching is assumed not to help until ``gshare profile`` measures that it does."""
    rows = [
        ProfilePoint(function, fn.sm_pct, q, b, b * ms_per_item)
        for b in fn.batches
        for q in fn.quotas_pct
    ]
    return ProfileTable(rows)


@dataclass(slots=True)
class LiveRequest:
    """One workflow request as the scheduler tracks it."""

    workflow: WorkflowSpec
    arrival_s: float
    request_id: int
    done: set[str] = field(default_factory=set)
    device_of: dict[str, int] = field(default_factory=dict)
    plan: Mapping[str, FunctionConfig] | None = None
    cost_usd: float = 0.0


@dataclass(slots=True)
class _Job:
    req: LiveRequest
    stage: str
    function: str
    enc: int
    payload: bytes
    enqueued_s: float
    future: asyncio.Future[tuple[int, bytes]]


@dataclass
class _Metrics:
    queue: Histogram
    exec: Histogram
    cost: Counter
    tasks: Counter
    no_invoker: Counter
    decision: Histogram


def _make_metrics(gw: Gateway) -> _Metrics:
    r = gw.metrics.registry
    return _Metrics(
        Histogram(
            "gshare_workflow_stage_queue_seconds",
            "A stage's job in its AFW queue: inputs ready to task start",
            ["workflow", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        Histogram(
            "gshare_workflow_stage_exec_seconds",
            "A stage's task: start (quota set, batch sent) to every answer",
            ["workflow", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        Counter(
            "gshare_workflow_cost_usd",
            "Cost of the workflow's tasks: share area x time at the device price",
            ["workflow"],
            registry=r,
        ),
        Counter(
            "gshare_workflow_tasks",
            "Stage tasks started, by the time quota (%) the scheduler chose",
            ["workflow", "stage", "quota_pct"],
            registry=r,
        ),
        Counter(
            "gshare_workflow_no_invoker",
            "Serving attempts that found no device with an idle instance and free quota",
            ["workflow", "stage"],
            registry=r,
        ),
        Histogram(
            "gshare_workflow_decision_seconds",
            "The scheduler's plan_stage + select_invoker for one serving attempt (event loop)",
            ["workflow"],
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1),
            registry=r,
        ),
    )


class StageScheduler:
    """The live ESG controller loop of one gateway (module NOTE)."""

    def __init__(
        self,
        gw: Gateway,
        host: StageHost,
        policy_name: str,
        make_policy: PolicyFactory,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.gw = gw
        self.host = host
        self.policy_name = policy_name
        self._make_policy = make_policy
        self.clock = clock
        self.workflows: dict[str, WorkflowSpec] = {}
        self.queues = AfwQueues()
        self._jobs: dict[tuple[AfwKey, int], _Job] = {}
        self._ids = 0
        self._blocked: set[AfwKey] = set()
        self._busy: set[str] = set()
        self._held_units: dict[int, int] = {}
        self._quota: dict[str, float] = {}
        self._quota_tasks: dict[str, asyncio.Task[None]] = {}
        self._pruned_at = 0.0
        self._zero_wait: weakref.WeakSet[InstanceChannel] = weakref.WeakSet()
        """Channels whose instance's batching wait was set to 0 (weak: a new connection, even at
        a reused address, is set again)."""
        self._perf: SharePerf | None = None
        self._options: dict[str, tuple[ConfigOption, ...]] = {}
        self._sources: dict[str, str] = {}
        self._perf_key: tuple[tuple[str, ShareFunction, str, int], ...] | None = None
        self._perf_at = -1e18
        self._policy: WorkflowPolicy | None = None
        self._preparing: asyncio.Task[None] | None = None
        self._round_pending = False
        self._retry: asyncio.TimerHandle | None = None
        self._m: _Metrics | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def metrics(self) -> _Metrics:
        if self._m is None:
            self._m = _make_metrics(self.gw)
        return self._m

    # -- workflows ---------------------------------------------------------------------------

    def put(self, spec: WorkflowSpec) -> None:
        """(Re)register a workflow: its queues exist from now on; the policy is prepared anew."""
        self.workflows[spec.name] = spec
        self._rebuild_queues()
        self._perf_key = None

    def remove(self, name: str) -> None:
        self.workflows.pop(name, None)
        self._rebuild_queues()
        self._perf_key = None

    def _rebuild_queues(self) -> None:
        q = AfwQueues()
        for name, wf in self.workflows.items():
            for st in wf.topological_order():
                key = AfwKey(name, st)
                q = q.register(key)
                for queued in self.queues.jobs_of(key):
                    q = q.push(key, queued)
        for (key, rid), job in list(self._jobs.items()):
            if key not in q.order:
                del self._jobs[(key, rid)]
                self._staged(job.function, -1)
                self._settle(job, HttpError(410, f"workflow {key.application!r} was deleted"))
        self.queues = q

    def new_request(self, spec: WorkflowSpec) -> LiveRequest:
        self._ids += 1
        return LiveRequest(spec, self.clock(), self._ids)

    async def run_stage(
        self, req: LiveRequest, stage: str, function: str, enc: int, payload: bytes
    ) -> tuple[int, bytes]:
        """Queue one job and await its output ``(encoding, data)``; ``HttpError`` as the
        function answered."""
        key = AfwKey(req.workflow.name, stage)
        if req.workflow.name not in self.workflows:
            raise HttpError(410, f"workflow {req.workflow.name!r} was deleted")
        now = self.clock()
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._jobs[(key, req.request_id)] = _Job(req, stage, function, enc, payload, now, fut)
        self.queues = self.queues.push(
            key, AfwJob(req.request_id, req.arrival_s * 1000.0, now * 1000.0)
        )
        self._staged(function, +1)
        route = self.gw.routes.get(function)
        if route is not None:  # demand for the autoscaler, as at the function's own queue
            route.arrivals += 1
            route.last_arrival_s = self.gw.clock()
        self._blocked.discard(key)
        self._request_round()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.gw.request_timeout_s)
        except TimeoutError:
            why = route.waiting_reason if route is not None and not route.channels else None
            raise HttpError(
                504,
                f"stage {stage!r} ({function}) got no answer within "
                f"{self.gw.request_timeout_s:g} s" + (f"; {why}" if why else ""),
            ) from None
        finally:
            if not fut.done():  # the request was cancelled: drop the job if still queued
                self._drop(key, req.request_id)

    def _staged(self, function: str, n: int) -> None:
        """Keep ``FunctionRoute.staged`` (the controller's view of queued demand); a function
        with jobs and no instance nudges the controller to start one."""
        route = self.gw.routes.get(function)
        if route is not None:
            route.staged = max(0, route.staged + n)
            if n > 0 and not route.channels and self.gw.on_cold is not None:
                self.gw.on_cold(function)

    def _drop(self, key: AfwKey, request_id: int) -> None:
        job = self._jobs.pop((key, request_id), None)
        if job is None:
            return
        self._staged(job.function, -1)
        jobs = [j for j in self.queues.jobs_of(key) if j.request_id != request_id]
        _, q = self.queues.take(key, self.queues.length(key))
        for j in jobs:
            q = q.push(key, j)
        self.queues = q

    # -- the controller loop -------------------------------------------------------------------

    def _request_round(self) -> None:
        if not self._round_pending:
            self._round_pending = True
            asyncio.get_running_loop().call_soon(self._round)

    def _schedule_retry(self) -> None:
        if self._retry is None and self.queues.total():
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._on_retry)

    def _on_retry(self) -> None:
        self._retry = None
        self._blocked.clear()
        self._request_round()

    def _round(self) -> None:
        self._round_pending = False
        if not self.queues.total():
            return
        self._prune_quotas()
        policy = self._ready_policy()
        if policy is None:
            self._schedule_retry()
            return

        def serve(key: AfwKey) -> bool:
            try:
                return self._serve(policy, key)
            except Exception as e:  # a policy bug must not stop serving: fail the head job
                log.exception("workflow scheduler: serving %s failed", key)
                self._fail_head(key, HttpError(500, f"workflow scheduler error: {e}"))
                return False

        while round_robin_pass(lambda: self.queues, self._set_queues, self._blocked, serve):
            pass
        if self._blocked:
            self._schedule_retry()

    def _set_queues(self, q: AfwQueues) -> None:
        self.queues = q

    def _fail_head(self, key: AfwKey, err: HttpError) -> None:
        taken, self.queues = self.queues.take(key, 1)
        for j in taken:
            job = self._jobs.pop((key, j.request_id), None)
            if job is not None:
                self._staged(job.function, -1)
                self._settle(job, err)

    def _serve(self, policy: WorkflowPolicy, key: AfwKey) -> bool:
        """One plan + dispatch attempt for the non-empty queue ``key``; True if a task started."""
        now = self.clock()
        jobs = self.queues.jobs_of(key)
        head = self._jobs[(key, jobs[0].request_id)]
        wf = self.workflows[key.application]
        fn = head.function
        route = self.gw.routes.get(fn)
        if route is not None and route.start_error and not route.channels:
            self._fail_head(
                key, HttpError(503, f"function {fn!r} cannot start: {route.start_error}")
            )
            return True
        if any(s.function not in self._options for s in wf.stages):  # a function not deployed
            self._fail_head(
                key, HttpError(424, f"a function of workflow {wf.name!r} is not deployed")
            )
            return True
        idle = self._idle_instances(fn)
        if not idle:  # nothing can run, whatever the configuration: do not ask the policy
            self._blocked.add(key)
            return False
        req = head.req
        ctx = StageContext(
            application=key.application,
            workflow=wf,
            stage=key.stage,
            done_stages=frozenset(req.done),
            elapsed_ms=(now - req.arrival_s) * 1000.0,
            waiting_ms=(now - head.enqueued_s) * 1000.0,
            queue_len=len(jobs),
            options=self._options,
            request_plan=req.plan,
            now_ms=now * 1000.0,
        )
        t_decide = time.perf_counter()
        plan = policy.plan_stage(ctx)
        preds = next(s.after for s in wf.stages if s.name == key.stage)
        n_dev = max(1, self.host.device_count())
        request = stage_request(
            key.application, fn, plan.candidates, preds,
            (self._jobs[(key, j.request_id)].req.device_of for j in jobs), n_dev,
        )  # fmt: skip
        snapshot = self._snapshot(fn, idle, n_dev)
        decision = policy.select_invoker(request, snapshot, ctx)
        self.metrics.decision.labels(key.application).observe(time.perf_counter() - t_decide)
        if not isinstance(decision, Dispatch):
            self.metrics.no_invoker.labels(key.application, key.stage).inc()
            self._blocked.add(key)
            return False
        cfg = decision.config
        here = [i for i in idle if i.device == decision.invoker_id]
        if not here:
            raise RuntimeError(
                f"{policy.name} chose device {decision.invoker_id} without an idle instance of {fn}"
            )
        chosen = pick_instance(
            [
                IdleInstance(i.instance_id, self._quota.get(i.instance_id, i.quota_pct))
                for i in here
            ],
            quota_pct_of(cfg),
        )
        inst = next(i for i in here if i.instance_id == chosen.instance_id)
        taken, self.queues = self.queues.take(key, cfg.batch)
        batch = [self._jobs.pop((key, j.request_id)) for j in taken]
        self._staged(fn, -len(batch))
        if plan.request_plan is not None:
            for job in batch:
                if job.req.plan is None:
                    job.req.plan = dict(plan.request_plan)
        executed = FunctionConfig(len(batch), cfg.vcpus, cfg.vgpus)
        self._busy.add(inst.instance_id)
        self._held_units[inst.device] = self._held_units.get(inst.device, 0) + cfg.vgpus
        t = asyncio.get_running_loop().create_task(self._task(key, inst, executed, batch))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return True

    def _idle_instances(self, fn: str) -> list[StageInstance]:
        return [i for i in self.host.stage_instances(fn) if i.instance_id not in self._busy]

    def _prune_quotas(self) -> None:
        """Forget the quotas set on instances that are gone (every ``PRUNE_S``); an instance
        that is restarting or draining keeps its entry (its quota is still the one set)."""
        now = self.clock()
        if now - self._pruned_at < PRUNE_S:
            return
        self._pruned_at = now
        for iid in [i for i in self._quota if not self.host.instance_exists(i)]:
            del self._quota[iid]

    def _snapshot(self, fn: str, idle: list[StageInstance], n_dev: int) -> list[InvokerState]:
        """Every device as an invoker: quota units free, one host unit per idle instance of
        ``fn`` there (module NOTE)."""
        per_dev: dict[int, int] = {}
        for i in idle:
            per_dev[i.device] = per_dev.get(i.device, 0) + 1
        out = []
        for d in range(n_dev):
            n = per_dev.get(d, 0)
            free_units = max(0, QUOTA_UNITS - self._held_units.get(d, 0))
            out.append(InvokerState(d, n, free_units, {fn: n} if n else {}, max(1, n), QUOTA_UNITS))
        return out

    async def _task(
        self, key: AfwKey, inst: StageInstance, cfg: FunctionConfig, batch: list[_Job]
    ) -> None:
        t0 = self.clock()
        m = self.metrics
        for job in batch:
            m.queue.labels(key.application, key.stage).observe(t0 - job.enqueued_s)
        q = quota_pct_of(cfg)
        m.tasks.labels(key.application, key.stage, f"{q:g}").inc()
        fn, iid = inst.function, inst.instance_id
        try:
            if abs(self._quota.get(iid, inst.quota_pct) - q) > 1e-6:
                self._quota[iid] = q
                self._set_quota_later(iid, q)
            await self._zero_batching_wait(fn, iid, cfg.batch)
            ps = self.gw.submit_to(fn, iid, [(j.enc, j.payload) for j in batch])
            results = await asyncio.gather(*(self.gw.wait(p) for p in ps), return_exceptions=True)
            exec_s = self.clock() - t0
            m.exec.labels(key.application, key.stage).observe(exec_s)
            perf = self._perf
            cost = (
                perf.task_cost_usd(fn, cfg, exec_s * 1000.0)
                if perf is not None and fn in perf.shares
                else 0.0
            )
            m.cost.labels(key.application).inc(cost)
            for job, p, res in zip(batch, ps, results, strict=True):
                job.req.cost_usd += cost / len(batch)
                if isinstance(res, BaseException):
                    err = res if isinstance(res, HttpError) else HttpError(502, str(res))
                    self.gw.record(fn, err.status, p, None)
                    self._settle(job, err)
                    continue
                status, renc, data, meas = res
                code = status_of(status)
                self.gw.record(fn, code, p, meas)
                if code != 200:
                    self._settle(job, HttpError(code, data.decode("utf-8", errors="replace")))
                else:
                    job.req.done.add(job.stage)
                    job.req.device_of[job.stage] = inst.device
                    if not job.future.done():
                        job.future.set_result((renc, data))
        except HttpError as e:
            for job in batch:
                self._settle(job, e)
        except Exception as e:  # the quota change or the channel failed
            log.warning("workflow task on %s failed: %s", iid, e)
            for job in batch:
                self._settle(job, HttpError(502, f"instance {iid} of {fn!r} failed: {e}"))
        finally:
            self._busy.discard(iid)
            self._held_units[inst.device] = self._held_units.get(inst.device, 0) - cfg.vgpus
            self._blocked.clear()
            self._request_round()

    def _set_quota_later(self, iid: str, quota_pct: float) -> None:
        """Change an instance's quota without holding up the task: the change is a round trip
        to its node agent (~1-2 ms, longer than a small model's batch), and the token server
        applies it at the instance's next token, so the batch sent now runs under it unless its
        first token was granted first. Changes to one instance are applied in order."""
        prev = self._quota_tasks.get(iid)

        async def apply() -> None:
            if prev is not None:
                with contextlib.suppress(Exception):
                    await prev
            try:
                await self.host.set_quota(iid, quota_pct)
            except Exception as e:  # the instance went away; its tasks fail on their own
                log.warning("workflow scheduler: quota of %s not set: %s", iid, e)
                self._quota.pop(iid, None)

        t = asyncio.get_running_loop().create_task(apply())
        self._quota_tasks[iid] = t
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        t.add_done_callback(lambda t: self._quota_done(iid, t))

    def _quota_done(self, iid: str, t: asyncio.Task[None]) -> None:
        if self._quota_tasks.get(iid) is t:  # the last change queued for ``iid``
            del self._quota_tasks[iid]

    @staticmethod
    def _settle(job: _Job, err: HttpError) -> None:
        if not job.future.done():
            job.future.set_exception(err)

    async def _zero_batching_wait(self, fn: str, iid: str, batch: int) -> None:
        """Once per connection: the instance runs what it is sent at once (the scheduler
        batches), up to the larger of its own ``max_batch`` and this batch."""
        r = self.gw.routes.get(fn)
        ch = r.channels.get(iid) if r is not None else None
        if ch is None or ch in self._zero_wait:
            return
        await self.gw.control(
            fn,
            iid,
            {
                "cmd": "set_batching",
                "max_batch": max(batch, r.max_batch if r else 1),
                "max_wait_ms": 0,
            },
        )
        self._zero_wait.add(ch)

    # -- options and the policy ----------------------------------------------------------------

    def _ready_policy(self) -> WorkflowPolicy | None:
        """The policy for the current options, rebuilt when the stage functions' models
        changed (at most every ``PERF_REFRESH_S``); None while Aquatope's offline phase runs."""
        now = self.clock()
        if self._preparing is not None and not self._preparing.done():
            return None
        functions = sorted({s.function for wf in self.workflows.values() for s in wf.stages})
        complete = all(fn in self._options for fn in functions)
        if (
            self._policy is not None
            and complete
            and now - self._perf_at < PERF_REFRESH_S
            and self._perf_key is not None
        ):
            return self._policy
        self._perf_at = now
        models = {fn: self.host.stage_function(fn) for fn in functions}
        known = {fn: sf for fn, sf in models.items() if sf is not None}
        key = tuple(sorted((fn, sf.share, sf.source, len(sf.table)) for fn, sf in known.items()))
        if key == self._perf_key and self._policy is not None:
            return self._policy
        if not known:
            self._options = {}
            return None
        perf = SharePerf(
            [sf.share for sf in known.values()], {fn: sf.table for fn, sf in known.items()}
        )
        self._perf = perf
        self._options = {fn: perf.options(fn) for fn in known}
        self._sources = {fn: sf.source for fn, sf in known.items()}
        self._perf_key = key
        policy = self._make_policy(perf)
        ready_wfs = [
            (n, wf)
            for n, wf in self.workflows.items()
            if all(s.function in known for s in wf.stages)
        ]

        def prepare() -> None:
            policy.prepare(ready_wfs, self._options, 0)

        if self.policy_name == "aquatope":  # a Bayesian optimisation: off the event loop
            self._policy = None

            async def run() -> None:
                await asyncio.to_thread(prepare)
                self._policy = policy
                self._request_round()

            self._preparing = asyncio.get_running_loop().create_task(run())
            return None
        prepare()
        self._policy = policy
        return policy

    def view(self) -> dict[str, object]:
        """What ``gshare list`` and the status show of the scheduler."""
        return {
            "policy": self.policy_name,
            "queued": self.queues.total(),
            "running_tasks": len(self._busy),
            "options": {
                fn: {"configs": len(o), "source": self._sources.get(fn, "")}
                for fn, o in self._options.items()
            },
        }

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._preparing is not None:
            self._preparing.cancel()
        for t in list(self._tasks):
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
