"""The controller: the live runtime's twin of the simulator's control loop (``sim.cluster``).

Who runs it: the server process, on the same asyncio loop as the gateway. Every ``period_s``
(1 s) ``reconcile`` does, for the whole cluster:

1. **observe** — each node agent's ``status()`` (a typed ``NodeStatus``), read by
   ``control.observe`` into typed observations (instance states, restarts, failed starts,
   token usage, memory and FIKIT reports) that ``apply`` applies to the records
   (``control.records``), the gateway and the metrics;
2. **step** — per function, ``policy.control.control_step`` (the simulator calls the same):
   the arrivals the gateway counted over the period feed the rate predictor; keep-alive, scale
   to zero, the queued-demand floor and the start back-off decide the floor and what may be
   added; the autoscaler (``policy.autoscale``, ``gshare-burst`` by default) chooses among
   the function's candidate configs (``runtime.control.configs``);
3. **apply** — new instances are bound to a device and rectangle by the placer
   (``policy.placement``, Maximal Rectangles by default) and started by that device's node
   agent; removed instances are drained (the gateway stops sending, in-flight requests
   finish, ``policy.control.drain_finished``) and then stopped, and their rectangle released.

A request for a function with no instance nudges the loop at once (cold start): the function
is stepped right away without a rate sample, and the requests wait in the gateway's queue until
the instance is ready.

The controller reads time only through ``clock`` (seconds, ``time.monotonic`` by default; the
gateway must use the same clock) and talks to node agents only through ``AgentHandle``
(``runtime.messages``), so its unit tests run it with a fake clock and in-process agents.
The control API (deploy, delete, status, ...) is ``runtime.control.api``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gshare.policy import autoscale
from gshare.policy.autoscale.measured import at_current_configs
from gshare.policy.control import (
    ControlState,
    FunctionObservation,
    cold_start_wanted,
    control_step,
    drain_finished,
    on_start_failed,
    on_started,
)
from gshare.policy.generation_cost import busy_ms_per_generation
from gshare.policy.placement import NoCapacity, make_placer
from gshare.resources import GpuShare
from gshare.runtime.control.configs import configs_for, share_for
from gshare.runtime.control.fences import Fences
from gshare.runtime.control.gauges import set_gauges
from gshare.runtime.control.kernel_profiles import store_kernel_profile
from gshare.runtime.control.launching import instance_launch
from gshare.runtime.control.observe import (
    FikitReported,
    MemoryReported,
    Observation,
    Reported,
    ReportedFailed,
    ReportedReady,
    ReportedRestarting,
    Restarted,
    TokensUsed,
    Vanished,
    kernel_profile_wanted,
    poll_agents,
    read_node_status,
    record_fikit,
    record_memory,
    record_tokens,
    starting_poll_s,
)
from gshare.runtime.control.readiness import connect_ready, learn_inputs
from gshare.runtime.control.records import (
    AgentRef,
    ControllerConfig,
    Device,
    FunctionState,
    LiveInstance,
)
from gshare.runtime.control.state import StateStore, kernel_code_key
from gshare.runtime.gateway.generation import GenerativeRoute
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.messages import AgentGone, AgentHandle, LiveState, NodeInfo
from gshare.runtime.metrics import Metrics
from gshare.spec import FunctionSpec, SpecError, parse_function_spec

log = logging.getLogger("gshare.controller")

MAX_DEVICES = 256
"""Upper bound of devices the placer tracks (devices of nodes that join later included)."""
SHORTFALL_LOG_S = 30.0
"""At most one "no room" event per function per this long."""
TICKS_KEPT = 1024
"""The controller's most recent period ticks kept for ``/system/info`` (17 minutes at 1 s)."""
REPEAT_SCALE_LOG_S = 30.0
"""The same scaling decision (reason and counts) is logged again only after this long: a start
that cannot be placed is retried every period and would fill the log with one line."""


class Controller:
    """See the module doc. The server adds agents (``add_agent``); ``runtime.control.api``
    serves the control API on top of it."""

    def __init__(
        self,
        state: StateStore,
        gateway: Gateway,
        config: ControllerConfig | None = None,
        *,
        metrics: Metrics,
        gateway_node_id: str = "",
        extra_sys_path: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.gateway = gateway
        self.metrics = metrics
        """The server's metrics (the gateway records into the same object)."""
        self.config = config or ControllerConfig()
        self.gateway_node_id = gateway_node_id
        self.extra_sys_path = extra_sys_path
        self.clock = clock
        self.scale = autoscale.get_autoscaler(self.config.autoscaler)
        self.placer = make_placer(self.config.placer, max_gpus=MAX_DEVICES)
        self.agents: dict[str, AgentRef] = {}
        self.devices: list[Device] = []
        self._fences = Fences(self.placer, self._next_number)
        """The placer reservations that keep a lost node's devices unused."""
        self.functions: dict[str, FunctionState] = {}
        self.instances: dict[str, LiveInstance] = {}
        self._counter = 0
        self._nudge = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_observe = clock()
        self.ticks_s: deque[float] = deque(maxlen=TICKS_KEPT)
        """The clock's reading at each of the last period ticks, where the rate samples' periods
        end (``/system/info``'s ``control_ticks_s``: a simulator replaying a run ticks there)."""
        self._started = False
        gateway.on_cold = self._on_cold

    # -- setup -----------------------------------------------------------------------------------

    def add_agent(self, handle: AgentHandle, info: NodeInfo) -> None:
        """Register a node agent and its devices (the server calls it at start, when a node
        joins, and when it replaced a dead agent of a node: the node keeps its devices)."""
        replaced = handle.node_id in self.agents
        self.agents[handle.node_id] = AgentRef(handle.node_id, handle, info)
        self.metrics.node_up.labels(handle.node_id[:12]).set(1)
        if replaced:
            log.warning("node %s has a new agent", handle.node_id[:8])
            self._fences.unfence({d.index for d in self.devices if d.node_id == handle.node_id})
            return
        for i, name in enumerate(info.devices):
            self.devices.append(Device(len(self.devices), handle.node_id, i, name))

    def fence(self, node_id: str) -> None:
        """Keep the placer off a lost node's devices (``control.fences``)."""
        self._fences.fence({d.index for d in self.devices if d.node_id == node_id})

    def _next_number(self) -> int:
        """The next number of an instance id or a fence reservation (one counter for both)."""
        self._counter += 1
        return self._counter

    async def agent_gone(self, node_id: str, err: BaseException) -> None:
        """The server saw ``node_id``'s agent die (its process exited: the embedded backend
        reads EOF at once) — act as a status poll's ``AgentGone`` would, without waiting for
        one: its instances are lost and its devices fenced until ``add_agent`` replaces it."""
        ref = self.agents.get(node_id)
        if ref is not None and ref.alive:
            await self.agent_lost(ref, err)

    def dead_agents(self) -> list[str]:
        """Nodes whose agent died (``AgentGone``): the server starts a new one on each."""
        return [nid for nid, a in self.agents.items() if not a.alive]

    async def start(self) -> None:
        """Restore the deployed functions from the state and start the loop."""
        for sf in self.state.list_functions():
            try:
                spec = parse_function_spec(sf.spec)
            except SpecError as e:
                self.state.add_event(sf.name, f"cannot restore: {e}", level="error")
                continue
            io = sf.io or {}
            g = bool(io.get("generative"))
            self.register(
                spec, sf.version, io.get("inputs", []), io.get("outputs", []), generative=g
            )
            self.state.add_event(sf.name, f"restored (version {sf.version}) after a server start")
        self._started = True
        self._task = asyncio.create_task(self._loop(), name="gshare-controller")

    async def stop(self) -> None:
        """Stop the loop, then every instance (the server calls it at shutdown)."""
        self._stopping = True
        self._nudge.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await asyncio.gather(
            *(self.stop_instance(iid, log_event=False) for iid in list(self.instances)),
            return_exceptions=True,
        )

    def ready(self) -> bool:
        return self._started and any(a.alive for a in self.agents.values())

    def register(
        self,
        spec: FunctionSpec,
        version: int,
        inputs: list[dict[str, Any]],
        outputs: list[dict[str, Any]] | None = None,
        *,
        generative: bool = False,
    ) -> FunctionState:
        """Deploy (or replace) ``spec`` in the loop: its gateway route and candidate configs.
        A replaced function keeps its rate history and invocation count."""
        fs = FunctionState(
            spec=spec,
            version=version,
            control=self.config.control.fresh_state(),
            inputs=inputs,
            outputs=list(outputs or []),
            generative=generative or spec.is_generative_builtin,
        )
        old = self.functions.get(spec.name)
        if old is not None:
            fs.invocations = old.invocations
            fs.control = ControlState(old.control.predictor)
        self.functions[spec.name] = fs
        gen = GenerativeRoute.for_spec(spec) if fs.generative else None
        self.gateway.add_function(spec.name, spec.slo_ms, spec.batching.max_batch, inputs, gen=gen)
        self.refresh_configs(fs)
        return fs

    def unregister(self, name: str) -> None:
        """Forget ``name`` (its instances are stopped by the caller)."""
        self.functions.pop(name, None)
        self.gateway.remove_function(name)

    def nudge(self) -> None:
        """Run the loop now (a deployment, a cold request, the profiler waiting)."""
        self._nudge.set()

    # -- candidate configs -------------------------------------------------------------------------

    def profile_changed(self, name: str) -> None:
        fs = self.functions.get(name)
        if fs is not None:
            fs.table_loaded = False
            self.refresh_configs(fs)

    def refresh_configs(self, fs: FunctionState) -> None:
        """Recompute the function's candidate configs (``runtime.control.configs``)."""
        if not fs.table_loaded:
            fs.table = self.state.profile_table(fs.spec.name)
            fs.table_loaded = True
        r = self.gateway.routes.get(fs.spec.name)
        busy = r.exec_ms_per_item if r is not None else None
        if r is not None and r.gen is not None:  # generations: the engines' busy time each
            engines = [ch.engine_stats for ch in r.channels.values() if ch.engine_stats]
            busy = busy_ms_per_generation(engines) or busy
        fs.configs = configs_for(
            fs.spec,
            fs.table,
            has_cuda=any(d.name.startswith("cuda") for d in self.devices),
            busy_ms_per_request=busy,
        )

    # -- the loop --------------------------------------------------------------------------------

    def _on_cold(self, function: str) -> None:
        self._nudge.set()

    async def _loop(self) -> None:
        next_tick = self.clock()
        while not self._stopping:
            timeout = max(0.0, next_tick - self.clock())
            ages = [
                self.clock() - i.created_s
                for i in self.instances.values()
                if i.state in (LiveState.STARTING, LiveState.RESTARTING)
            ]
            if ages:  # connect new instances promptly
                timeout = min(timeout, starting_poll_s(min(ages)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), timeout)
            if self._stopping:
                return
            try:
                if self.clock() >= next_tick:
                    self._nudge.clear()
                    next_tick = self.clock() + self.config.period_s
                    await self.reconcile()
                elif self._nudge.is_set():
                    self._nudge.clear()
                    await self.cold_starts()
                else:  # an instance is starting: only look at the agents
                    await self.observe()
            except Exception:  # never let the loop die; log and go on
                log.exception("reconcile failed")

    async def reconcile(self) -> None:
        """One control period (see the module doc)."""
        await self.observe()
        now = self.clock()
        interval = max(1e-3, now - self._last_observe)
        self._last_observe = now
        self.ticks_s.append(now)
        for name in sorted(self.functions):
            fs = self.functions.get(name)
            if fs is not None:
                await self._step(fs, interval)
                await self._resize_memory(fs)
        await self._finish_drains()
        set_gauges(
            self.metrics, self.instances, self.functions, self.gateway.queued,
            self.gateway.service_interval_s,
        )  # fmt: skip

    async def cold_starts(self) -> None:
        """Nudged: step the functions that have queued requests and no instance."""
        for name, fs in list(self.functions.items()):
            if cold_start_wanted(self.gateway.queued(name), len(self.live_of(name))):
                await self._step(fs, None)

    def live_of(self, name: str) -> list[LiveInstance]:
        """The function's instances that serve or will serve it (not draining, not profiling)."""
        return [
            i
            for i in self.instances.values()
            if i.function == name and i.state is not LiveState.DRAINING and not i.profiling
        ]

    async def _step(self, fs: FunctionState, interval_s: float | None) -> None:
        """``policy.control.control_step`` for one function, then apply its decision.
        ``interval_s`` None: a nudge (no rate sample)."""
        name = fs.spec.name
        arrivals: int | None = None
        if interval_s is not None:  # a period tick: observe the rate
            arrivals = self.gateway.take_arrivals(name)
            fs.invocations += arrivals
            fs.observed_rps = arrivals / interval_s
            self.refresh_configs(fs)
        configs = fs.configs.configs
        running = at_current_configs(
            [autoscale.Instance(i.instance_id, name, i.config) for i in self.live_of(name)], configs
        )
        obs = FunctionObservation(
            function=name,
            arrivals=arrivals,
            interval_s=interval_s or self.config.period_s,
            idle_since_s=self.gateway.idle_since_s(name),
            outstanding=self.gateway.outstanding(name),
            queued=self.gateway.queued(name),
            running=running,
            configs=configs,
            min_instances=fs.spec.min_instances,
            max_instances=fs.spec.max_instances,
            keep_alive_s=fs.spec.keep_alive_s,
        )
        try:
            decision, fs.control = control_step(
                obs, fs.control, self.clock(), self.scale, self.config.control
            )
        except autoscale.AutoscaleError as e:
            self.event(name, f"autoscaler: {e}", level="error")
            return
        fs.predicted_rps = decision.predicted_rps
        if decision.changes:
            fs.last_reason = decision.scale.reason
            key = (decision.scale.reason, len(decision.add), len(decision.remove))
            now = self.clock()
            if key != fs.last_scale_event or now - fs.last_scale_event_s >= REPEAT_SCALE_LOG_S:
                fs.last_scale_event, fs.last_scale_event_s = key, now
                waiting = self.gateway.waiting_reason(name)
                self.event(
                    name,
                    f"scale: R={decision.predicted_rps:.2f} rps, {decision.scale.reason}; "
                    f"+{len(decision.add)} -{len(decision.remove)}"
                    + (f" (still waiting: {waiting})" if waiting and decision.add else ""),
                )
        for iid in decision.remove:
            inst = self.instances.get(iid)
            if inst is not None:
                self.drain(inst, "scaled down")
        for cfg in decision.add:
            await self.start_instance(fs, cfg)

    # -- instance lifecycle ----------------------------------------------------------------------

    def _shortfall(self, fs: FunctionState, message: str) -> None:
        """No room for an instance of ``fs``: the gateway keeps the reason for requests that
        time out waiting; the event log gets it at most every ``SHORTFALL_LOG_S``."""
        self.gateway.set_waiting_reason(fs.spec.name, message)
        now = self.clock()
        if now - fs.last_shortfall_s > SHORTFALL_LOG_S:
            fs.last_shortfall_s = now
            self.event(fs.spec.name, message, level="warn")

    async def start_instance(
        self,
        fs: FunctionState,
        cfg: autoscale.ScaleConfig,
        *,
        profiling: bool = False,
        share: GpuShare | None = None,
        device: Device | None = None,
    ) -> LiveInstance | None:
        """Place and start one instance of ``fs`` with ``cfg`` (``device`` given: the
        profiler's, unplaced). Returns None when there is no room or the agent refused."""
        name = fs.spec.name
        iid = f"{name}-{'p' if profiling else ''}{self._next_number()}"
        share = share or share_for(fs.spec, cfg, fs.configs.source)
        mem = fs.memory.plan(fs.spec)
        if mem.governed:
            share = replace(share, mem_mb=mem.init_mb)
        if device is None:
            try:
                binding = self.placer.place_share(iid, share)
            except NoCapacity as e:
                self._shortfall(fs, f"no room for another instance: {e}")
                return None
            ok = (
                binding.gpu < len(self.devices)
                and self.agents[self.devices[binding.gpu].node_id].alive
            )
            if not ok:
                self.placer.release(iid)
                self._shortfall(fs, "no room for another instance: every device is full")
                return None
            device = self.devices[binding.gpu]
            sm_offset = binding.rect.y
            self.gateway.set_waiting_reason(name, None)
        else:
            sm_offset = 0.0
        spec_dump = fs.spec.model_dump(mode="json")
        kernel_profile = self.state.kernel_profile(name, kernel_code_key(spec_dump))
        if kernel_profile is not None:
            fs.kernel_runs = int(kernel_profile.get("runs", 0))
        launch = instance_launch(
            iid,
            fs.spec,
            spec_dump,
            cfg,
            share,
            mem,
            device,
            sm_offset,
            request_timeout_s=self.gateway.request_timeout_s,
            remote=device.node_id != self.gateway_node_id,
            tcp_host=self._node_ip(device.node_id),
            extra_sys_path=self.extra_sys_path,
            kernel_profile=kernel_profile,
        )
        inst = LiveInstance(iid, name, cfg, share, device, self.clock(), profiling=profiling)
        inst.channel_secret = launch.channel_secret
        self.instances[iid] = inst
        agent = self.agents[device.node_id]
        try:
            await agent.handle.start_instance(launch)
        except Exception as e:
            del self.instances[iid]
            if not profiling:
                self.placer.release(iid)
            self.event(name, f"cannot start instance {iid}: {e}", level="error")
            return None
        if not profiling:
            self.metrics.cold_starts.labels(name).inc()
        self.event(
            name,
            f"starting on node {device.node_id[:8]} {device.name}: sm {share.sm_pct:g}%, quota "
            f"{share.quota_request:g}/{share.quota_limit:g}, batch {cfg.batch}, "
            f"est. {cfg.throughput_rps:.1f} rps",
            instance=iid,
        )
        return inst

    def drain(self, inst: LiveInstance, why: str) -> None:
        """Stop sending to ``inst``; it stops once its in-flight requests are answered."""
        if inst.state is LiveState.DRAINING:
            return
        inst.state = LiveState.DRAINING
        inst.drain_since = self.clock()
        self.gateway.drain(inst.route, inst.instance_id)
        self.event(inst.function, f"draining ({why})", instance=inst.instance_id)

    async def _finish_drains(self) -> None:
        now = self.clock()
        for inst in list(self.instances.values()):
            if inst.state is not LiveState.DRAINING or inst.drain_since is None:
                continue
            in_flight = self.gateway.inflight(inst.route, inst.instance_id)
            if drain_finished(in_flight, inst.drain_since, now, self.config.drain_timeout_s):
                await self.stop_instance(inst.instance_id)

    async def stop_instance(
        self, iid: str, *, log_event: bool = True, why: str = "stopped"
    ) -> None:
        """Stop ``iid`` now (its agent kills it) and release its rectangle."""
        inst = self.instances.pop(iid, None)
        if inst is None:
            return
        self.gateway.instance_gone(inst.route, iid)
        agent = self.agents.get(inst.device.node_id)
        if agent is not None and agent.alive:
            with contextlib.suppress(Exception):
                await agent.handle.stop_instance(iid)
        if not inst.profiling:
            with contextlib.suppress(KeyError):
                self.placer.release(iid)
            self.placer.take_moves()  # moves within a device change no mechanism on our side
        self.metrics.forget_instance(inst.function, iid)
        fs = self.functions.get(inst.function)
        if fs is not None:
            fs.memory.forget(iid)
        if log_event:
            self.event(inst.function, why, instance=iid)

    # -- observation -----------------------------------------------------------------------------

    async def observe(self) -> None:
        """Ask every live agent for its status and apply what it says (``control.observe``
        reads each report into observations; ``apply`` applies them in order)."""
        for agent, res in await poll_agents([a for a in self.agents.values() if a.alive]):
            if isinstance(res, AgentGone):
                if agent.alive and self.agents.get(agent.node_id) is agent:  # not replaced
                    await self.agent_lost(agent, res)
            elif isinstance(res, BaseException):
                log.warning("agent on node %s did not answer: %s", agent.node_id[:8], res)
            else:
                node = [i for i in self.instances.values() if i.device.node_id == agent.node_id]
                for obs in read_node_status(
                    res,
                    node,
                    now_s=self.clock(),
                    agent_timeout_s=self.config.agent_timeout_s,
                    local=agent.node_id == self.gateway_node_id,
                ):
                    await self.apply(obs)

    async def agent_lost(self, agent: AgentRef, err: BaseException) -> None:
        """``agent`` is gone: its instances are lost and its node's devices fenced."""
        agent.alive = False
        log.error("agent on node %s is gone: %s", agent.node_id[:8], err)
        with contextlib.suppress(KeyError):
            self.metrics.node_up.remove(agent.node_id[:12])
        for inst in list(self.instances.values()):
            if inst.device.node_id == agent.node_id:
                self.event(
                    inst.function,
                    f"lost with node {agent.node_id[:8]}",
                    instance=inst.instance_id,
                    level="error",
                )
                await self.stop_instance(inst.instance_id, log_event=False)
        self.fence(agent.node_id)

    async def apply(self, obs: Observation) -> None:
        """Apply one observation (``control.observe``) to the records, the gateway and the
        metrics. An instance stopped meanwhile is passed over."""
        inst = self.instances.get(obs.instance_id)
        if inst is None:
            return
        iid = inst.instance_id
        fs = self.functions.get(inst.function)
        match obs:
            case Reported():
                inst.pid, inst.rss_mb, inst.cores = obs.pid, obs.rss_mb, obs.cores
                inst.uds_path, inst.tcp_port = obs.uds_path, obs.tcp_port
            case MemoryReported() if fs is not None:
                record_memory(fs, inst, obs.usage, self.metrics)
            case FikitReported() if fs is not None:
                record_fikit(inst, obs.usage, self.metrics)
                if kernel_profile_wanted(fs, inst, obs.usage):
                    fs.kernel_fetching = True
                    kept = await store_kernel_profile(self.gateway, self.state, fs, inst)
                    if kept is not None:
                        self.event(inst.function, kept, instance=iid)
            case Restarted() if obs.restarts > inst.restarts:
                self.metrics.restarts.labels(inst.function).inc(obs.restarts - inst.restarts)
                inst.restarts, inst.last_exit = obs.restarts, obs.last_exit
                self.event(
                    inst.function,
                    f"crashed and restarted ({inst.last_exit})",
                    instance=iid,
                    level="warn",
                )
            case ReportedReady():
                await connect_ready(self.gateway, inst, obs)
                connected = self.gateway.is_connected(inst.route, iid)
                if inst.state in (LiveState.STARTING, LiveState.RESTARTING) and connected:
                    took = self.clock() - inst.created_s
                    inst.state = LiveState.READY
                    self.event(
                        inst.function,
                        f"ready (pid {inst.pid}, cores {inst.cores}, after {took:.1f} s)",
                        instance=iid,
                    )
                    if fs is not None:
                        fs.control = on_started(fs.control)
                        fs.start_error = None
                        if obs.inputs and not fs.inputs:
                            learn_inputs(self.state, self.gateway, fs, obs.inputs)
            case ReportedRestarting() if inst.state is LiveState.READY:
                inst.state = LiveState.RESTARTING
                inst.created_s = self.clock()
                self.gateway.instance_restarting(inst.route, iid)
            case ReportedFailed():
                self.event(inst.function, f"failed: {obs.error}", instance=iid, level="error")
                await self.stop_instance(iid, log_event=False)
                if fs is not None and not inst.profiling:
                    fs.control = on_start_failed(fs.control, self.clock(), self.config.control)
                    why = obs.error.removeprefix("failed to start: ")
                    fs.start_error = f"function {inst.function!r} failed to start: {why}"
                    if not any(i.state is LiveState.READY for i in self.live_of(inst.function)):
                        self.gateway.set_start_error(inst.function, fs.start_error)
            case TokensUsed():
                record_tokens(inst, obs)
            case Vanished():
                self.event(
                    inst.function, "vanished from its node agent", instance=iid, level="error"
                )
                await self.stop_instance(iid, log_event=False)

    def _node_ip(self, node_id: str) -> str:
        """The address a node's instances bind their TCP listener to (its agent's report)."""
        ref = self.agents.get(node_id)
        ip = ref.info.extra.get("node_ip") if ref is not None else None
        return str(ip) if ip else "0.0.0.0"

    async def _resize_memory(self, fs: FunctionState) -> None:
        """Re-solve an ``auto`` function's memory sizing and push it to its instances."""
        try:
            plan = fs.memory.resolve(fs.spec)
        except Exception as e:  # a solver failure keeps the old sizing
            self.event(fs.spec.name, f"memory sizing failed: {e}", level="warn")
            return
        if plan is None:
            return
        self.event(
            fs.spec.name,
            f"memory sizing: init {plan.init_mb:.0f} MiB, step {plan.step_mb:.0f} MiB "
            f"(from {len(fs.memory.history)} measured batches)",
        )
        cmd = {"cmd": "set_memory", "init_mb": plan.init_mb, "step_mb": plan.step_mb}
        for inst in self.live_of(fs.spec.name):
            if inst.state is LiveState.READY:
                try:
                    await self.gateway.control(inst.route, inst.instance_id, cmd)
                except Exception as e:
                    log.warning("cannot resize %s: %s", inst.instance_id, e)

    # -- metrics and events ------------------------------------------------------------------------

    def event(
        self, function: str, message: str, *, instance: str | None = None, level: str = "info"
    ) -> None:
        """Log ``message`` for ``function`` and keep it in the state database's events (what
        ``gshare logs`` and the status page show); a state error never stops the caller."""
        emit = getattr(log, {"warn": "warning"}.get(level, level), log.info)
        emit("%s%s: %s", function, f" [{instance}]" if instance else "", message)
        with contextlib.suppress(Exception):
            self.state.add_event(function, message, instance=instance, level=level)


__all__ = ["Controller"]
