"""The controller: the live runtime's twin of the simulator's control loop (``sim.cluster``).

Who runs it: the server process, on the same asyncio loop as the gateway. Every ``period_s``
(1 s) ``reconcile`` does, for the whole cluster:

1. **observe** — each node agent's ``status()`` (a typed ``NodeStatus``): instance states
   (ready instances are connected to the gateway; crashes and restarts are logged; a failed
   start releases the instance, backs the function off and, when the function has no other
   instance, fails its queued requests with the start error), and the token servers'
   per-client ``total_used_ms``, whose growth over the period is each instance's achieved share;
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
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gshare.policy import autoscale
from gshare.policy.control import (
    ControlParams,
    ControlState,
    FunctionObservation,
    cold_start_wanted,
    control_step,
    drain_finished,
    on_start_failed,
    on_started,
)
from gshare.policy.placement import NoCapacity, make_placer
from gshare.profiles import ProfileTable
from gshare.resources import GpuShare
from gshare.runtime.control.configs import FunctionConfigs, configs_for, share_for
from gshare.runtime.control.memory import FunctionMemory
from gshare.runtime.control.state import StateStore, kernel_code_key
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.instance.server import InstanceLaunch, launch_to_dict
from gshare.runtime.messages import (
    AgentGone,
    AgentHandle,
    ConfigSource,
    FikitUsage,
    InstanceState,
    LiveState,
    MemoryUsage,
    NodeInfo,
    NodeStatus,
)
from gshare.spec import FunctionSpec, SpecError, parse_function_spec

log = logging.getLogger("gshare.controller")

STARTING_POLL_S = 0.25
"""Agent poll interval while an instance is starting (between reconcile periods)."""
FENCE = "~fence-"
"""Prefix of the placer reservations that fence a lost node's devices (not an instance id:
``~`` is not allowed in function names)."""
MAX_DEVICES = 256
"""Upper bound of devices the placer tracks (devices of nodes that join later included)."""
SHORTFALL_LOG_S = 30.0
"""At most one "no room" event per function per this long."""


@dataclass
class ControllerConfig:
    """Knobs of the control loop (defaults as the simulator's ``ClusterConfig``)."""

    period_s: float = 1.0
    control: ControlParams = field(default_factory=ControlParams)
    """Rate prediction, keep-alive and back-off knobs (``policy.control``; the simulator's
    defaults)."""
    autoscaler: str = autoscale.DEFAULT_AUTOSCALER
    placer: str = "mra"
    drain_timeout_s: float = 120.0
    """Longest a removed instance drains its in-flight requests before it is stopped."""
    agent_timeout_s: float = 10.0
    workflow_policy: str = "esg"
    """The live workflow scheduler (``gateway.stages.WORKFLOW_POLICY_NAMES`` or ``direct``)."""
    workflow_policy_factory: Any = None
    """``gateway.stages.PolicyFactory`` building it (None: ``policy.workflow.make_policy`` by
    name; the CLI passes Aquatope's, whose optimiser lives in ``gshare.experiments``)."""


@dataclass
class AgentRef:
    node_id: str
    handle: AgentHandle
    info: NodeInfo
    alive: bool = True


@dataclass(frozen=True)
class Device:
    index: int
    """The placer's GPU index."""
    node_id: str
    local_index: int
    name: str


@dataclass
class LiveInstance:
    instance_id: str
    function: str
    config: autoscale.ScaleConfig
    share: GpuShare
    device: Device
    created_s: float
    """``clock`` when it was asked to start (or began restarting)."""
    state: LiveState = LiveState.STARTING
    incarnation: int = -1
    """Incarnation the gateway is connected to (-1: none yet)."""
    pid: int | None = None
    restarts: int = 0
    uds_path: str | None = None
    tcp_port: int | None = None
    used_ms: float | None = None
    used_t: float | None = None
    achieved_share: float | None = None
    drain_since: float | None = None
    profiling: bool = False
    cores: list[int] | None = None
    rss_mb: float = 0.0
    last_exit: str | None = None
    channel_secret: str = ""
    """What the gateway presents on a TCP connection to it (``protocol.OP_AUTH``)."""
    route: str = ""
    """The gateway route it serves (the function's; a private one for profiling)."""
    memory: MemoryUsage | None = None
    """Its memory limit and measured peaks, from its node's last status."""
    fikit: FikitUsage | None = None
    """Its FIKIT phase and counters, from its node's last status (None: tokens alone)."""

    def __post_init__(self) -> None:
        self.route = self.route or self.function


@dataclass
class FunctionState:
    spec: FunctionSpec
    version: int
    control: ControlState
    """The reconcile step's state (``policy.control``)."""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """The handler's OIP outputs (``output_spec``), for model metadata; [] when undeclared."""
    predicted_rps: float = 0.0
    observed_rps: float = 0.0
    invocations: int = 0
    start_error: str | None = None
    configs: FunctionConfigs = field(
        default_factory=lambda: FunctionConfigs([], ConfigSource.DEFAULT_SHARE)
    )
    table: ProfileTable | None = None
    table_loaded: bool = False
    last_reason: str = ""
    last_shortfall_s: float = -1e18
    memory: FunctionMemory = field(default_factory=FunctionMemory)
    """Resource-centric memory sizing (``runtime.control.memory``)."""
    kernel_runs: int = 0
    """Runs of the FIKIT kernel profile kept for it in the state database (0: none yet)."""
    kernel_fetching: bool = False


class Controller:
    """See the module doc. The server adds agents (``add_agent``); ``runtime.control.api``
    serves the control API on top of it."""

    def __init__(
        self,
        state: StateStore,
        gateway: Gateway,
        config: ControllerConfig | None = None,
        *,
        gateway_node_id: str = "",
        extra_sys_path: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.gateway = gateway
        self.config = config or ControllerConfig()
        self.gateway_node_id = gateway_node_id
        self.extra_sys_path = extra_sys_path
        self.clock = clock
        self.scale = autoscale.get_autoscaler(self.config.autoscaler)
        self.placer = make_placer(self.config.placer, max_gpus=MAX_DEVICES)
        self.agents: dict[str, AgentRef] = {}
        self.devices: list[Device] = []
        self._fences: dict[int, str] = {}
        """Device index -> the placer reservation that keeps it unused (its node is lost)."""
        self.functions: dict[str, FunctionState] = {}
        self.instances: dict[str, LiveInstance] = {}
        self._counter = 0
        self._nudge = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_observe = clock()
        self._started = False
        self.profiler: Any = None
        gateway.on_cold = self._on_cold

    # -- setup -----------------------------------------------------------------------------------

    def add_agent(self, handle: AgentHandle, info: NodeInfo) -> None:
        """Register a node agent and its devices (the server calls it at start, when a node
        joins, and when it replaced a dead agent of a node: the node keeps its devices)."""
        replaced = handle.node_id in self.agents
        self.agents[handle.node_id] = AgentRef(handle.node_id, handle, info)
        self.gateway.metrics.node_up.labels(handle.node_id[:12]).set(1)
        if replaced:
            log.warning("node %s has a new agent", handle.node_id[:8])
            self._unfence(handle.node_id)
            return
        for i, name in enumerate(info.devices):
            self.devices.append(Device(len(self.devices), handle.node_id, i, name))

    def _fence(self, node_id: str) -> None:
        """Keep the placer off a lost node's devices: each gets a reservation of the whole
        device (``FENCE`` ids). The placer API places anywhere, and a whole-device rectangle
        fits only an empty device, so reservations are placed until every device of the node
        holds one; those that landed on another empty device are given back."""
        targets = {d.index for d in self.devices if d.node_id == node_id}
        elsewhere: list[str] = []
        while targets - set(self._fences):
            self._counter += 1
            fid = f"{FENCE}{self._counter}"
            try:
                b = self.placer.place(fid, 100.0, 100.0)
            except NoCapacity:  # an instance still holds one of them: not fenced
                break
            if b.gpu in targets and b.gpu not in self._fences:
                self._fences[b.gpu] = fid
            else:
                elsewhere.append(fid)
        for fid in elsewhere:
            self.placer.release(fid)

    def _unfence(self, node_id: str) -> None:
        for d in self.devices:
            fid = self._fences.pop(d.index, None) if d.node_id == node_id else None
            if fid is not None:
                self.placer.release(fid)

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
            self.register(spec, sf.version, io.get("inputs", []), io.get("outputs", []))
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
    ) -> FunctionState:
        """Deploy (or replace) ``spec`` in the loop: its gateway route and candidate configs.
        A replaced function keeps its rate history and invocation count."""
        fs = FunctionState(
            spec=spec,
            version=version,
            control=self.config.control.fresh_state(),
            inputs=inputs,
            outputs=list(outputs or []),
        )
        old = self.functions.get(spec.name)
        if old is not None:
            fs.invocations = old.invocations
            fs.control = ControlState(old.control.predictor)
        self.functions[spec.name] = fs
        self.gateway.add_function(spec.name, spec.slo_ms, spec.batching.max_batch, inputs)
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
        fs.configs = configs_for(
            fs.spec,
            fs.table,
            has_cuda=any(d.name.startswith("cuda") for d in self.devices),
            busy_ms_per_request=r.exec_ms_per_item if r is not None else None,
        )

    # -- the loop --------------------------------------------------------------------------------

    def _on_cold(self, function: str) -> None:
        self._nudge.set()

    async def _loop(self) -> None:
        next_tick = self.clock()
        while not self._stopping:
            timeout = max(0.0, next_tick - self.clock())
            if any(
                i.state in (LiveState.STARTING, LiveState.RESTARTING)
                for i in self.instances.values()
            ):
                timeout = min(timeout, STARTING_POLL_S)  # connect new instances promptly
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
        for name in sorted(self.functions):
            fs = self.functions.get(name)
            if fs is not None:
                await self._step(fs, interval)
                await self._resize_memory(fs)
        await self._finish_drains()
        self._update_gauges()

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
        by_key = {(c.sm_pct, c.quota_pct, c.batch): c for c in configs}
        running = [
            autoscale.Instance(
                i.instance_id,
                name,
                by_key.get((i.config.sm_pct, i.config.quota_pct, i.config.batch), i.config),
            )
            for i in self.live_of(name)
        ]
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
            self._event(name, f"autoscaler: {e}", level="error")
            return
        fs.predicted_rps = decision.predicted_rps
        if decision.changes:
            fs.last_reason = decision.scale.reason
            self._event(
                name,
                f"scale: R={decision.predicted_rps:.2f} rps, {decision.scale.reason}; "
                f"+{len(decision.add)} -{len(decision.remove)}",
            )
        for iid in decision.remove:
            inst = self.instances.get(iid)
            if inst is not None:
                self.drain(inst, "scaled down")
        for cfg in decision.add:
            await self.start_instance(fs, cfg)

    # -- instance lifecycle ----------------------------------------------------------------------

    def _shortfall(self, fs: FunctionState, message: str) -> None:
        now = self.clock()
        if now - fs.last_shortfall_s > SHORTFALL_LOG_S:
            fs.last_shortfall_s = now
            self._event(fs.spec.name, message, level="warn")

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
        self._counter += 1
        iid = f"{name}-{'p' if profiling else ''}{self._counter}"
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
        else:
            sm_offset = 0.0
        spec = fs.spec
        spec_dump = spec.model_dump(mode="json")
        kernel_profile = self.state.kernel_profile(name, kernel_code_key(spec_dump))
        if kernel_profile is not None:
            fs.kernel_runs = int(kernel_profile.get("runs", 0))
        launch = InstanceLaunch(
            instance_id=iid,
            function=name,
            spec=spec_dump,
            sm_pct=share.sm_pct,
            quota_request=share.quota_request,
            quota_limit=share.quota_limit,
            mem_mb=share.mem_mb,
            mem_step_mb=mem.step_mb,
            mem_max_mb=mem.max_mb,
            priority=spec.priority,
            max_batch=cfg.batch,
            max_wait_ms=spec.batching.max_wait_ms,
            device=device.name,
            device_index=device.local_index,
            sm_offset_pct=min(100.0, max(0.0, sm_offset)),
            listen_tcp=device.node_id != self.gateway_node_id,
            tcp_host=self._node_ip(device.node_id),
            channel_secret=secrets.token_hex(16) if device.node_id != self.gateway_node_id else "",
            extra_sys_path=self.extra_sys_path,
            kernel_profile=kernel_profile,
        )
        inst = LiveInstance(iid, name, cfg, share, device, self.clock(), profiling=profiling)
        inst.channel_secret = launch.channel_secret
        self.instances[iid] = inst
        agent = self.agents[device.node_id]
        try:
            await agent.handle.start_instance(launch_to_dict(launch))
        except Exception as e:
            del self.instances[iid]
            if not profiling:
                self.placer.release(iid)
            self._event(name, f"cannot start instance {iid}: {e}", level="error")
            return None
        if not profiling:
            self.gateway.metrics.cold_starts.labels(name).inc()
        self._event(
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
        self._event(inst.function, f"draining ({why})", instance=inst.instance_id)

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
        self.gateway.metrics.forget_instance(inst.function, iid)
        fs = self.functions.get(inst.function)
        if fs is not None:
            fs.memory.forget(iid)
        if log_event:
            self._event(inst.function, why, instance=iid)

    # -- observation -----------------------------------------------------------------------------

    async def observe(self) -> None:
        """Ask every live agent for its status and apply it."""
        refs = [a for a in self.agents.values() if a.alive]
        results = await asyncio.gather(*(a.handle.status() for a in refs), return_exceptions=True)
        for agent, res in zip(refs, results, strict=True):
            if isinstance(res, AgentGone):
                await self._agent_lost(agent, res)
            elif isinstance(res, BaseException):
                log.warning("agent on node %s did not answer: %s", agent.node_id[:8], res)
            else:
                await self._apply_status(agent.node_id, res)

    async def _agent_lost(self, agent: AgentRef, err: BaseException) -> None:
        agent.alive = False
        log.error("agent on node %s is gone: %s", agent.node_id[:8], err)
        with contextlib.suppress(KeyError):
            self.gateway.metrics.node_up.remove(agent.node_id[:12])
        for inst in list(self.instances.values()):
            if inst.device.node_id == agent.node_id:
                self._event(
                    inst.function,
                    f"lost with node {agent.node_id[:8]}",
                    instance=inst.instance_id,
                    level="error",
                )
                await self.stop_instance(inst.instance_id, log_event=False)
        self._fence(agent.node_id)

    async def _apply_status(self, node_id: str, status: NodeStatus) -> None:
        by_id = {s.instance_id: s for s in status.instances}
        local = node_id == self.gateway_node_id
        for inst in [i for i in self.instances.values() if i.device.node_id == node_id]:
            st = by_id.get(inst.instance_id)
            iid = inst.instance_id
            if st is None:
                if self.clock() - inst.created_s > self.config.agent_timeout_s:
                    self._event(
                        inst.function, "vanished from its node agent", instance=iid, level="error"
                    )
                    await self.stop_instance(iid, log_event=False)
                continue
            fs = self.functions.get(inst.function)
            inst.pid, inst.rss_mb, inst.cores = st.pid, st.rss_mb, st.cores
            if st.memory is not None and fs is not None and not inst.profiling:
                self._observe_memory(fs, inst, st.memory)
            if st.fikit is not None and fs is not None and not inst.profiling:
                await self._observe_fikit(fs, inst, st.fikit)
            inst.uds_path, inst.tcp_port = st.uds_path, st.tcp_port
            if st.restarts > inst.restarts:
                self.gateway.metrics.restarts.labels(inst.function).inc(st.restarts - inst.restarts)
                inst.restarts = st.restarts
                inst.last_exit = st.last_exit
                self._event(
                    inst.function,
                    f"crashed and restarted ({inst.last_exit})",
                    instance=iid,
                    level="warn",
                )
            if st.state is InstanceState.READY:
                await self._connect(inst, st.incarnation, status.node_ip, local)
                connected = self.gateway.is_connected(inst.route, iid)
                if inst.state in (LiveState.STARTING, LiveState.RESTARTING) and connected:
                    took = self.clock() - inst.created_s
                    inst.state = LiveState.READY
                    self._event(
                        inst.function,
                        f"ready (pid {inst.pid}, cores {inst.cores}, after {took:.1f} s)",
                        instance=iid,
                    )
                    if fs is not None:
                        fs.control = on_started(fs.control)
                        fs.start_error = None
                        if st.inputs and not fs.inputs:
                            self._learn_inputs(fs, st.inputs)
            elif st.state is InstanceState.STARTING and inst.state is LiveState.READY:
                inst.state = LiveState.RESTARTING
                inst.created_s = self.clock()
                self.gateway.instance_restarting(inst.route, iid)
            elif st.state is InstanceState.FAILED:
                err = st.error or "unknown error"
                self._event(inst.function, f"failed: {err}", instance=iid, level="error")
                await self.stop_instance(iid, log_event=False)
                if fs is not None and not inst.profiling:
                    fs.control = on_start_failed(fs.control, self.clock(), self.config.control)
                    fs.start_error = f"function {inst.function!r} failed to start: {err}"
                    if not any(i.state is LiveState.READY for i in self.live_of(inst.function)):
                        self.gateway.set_start_error(inst.function, fs.start_error)
                continue
            tok = status.tokens.get(iid)
            if tok is not None:
                used, now_s = tok.total_used_ms, status.now_s
                if inst.used_ms is not None and inst.used_t is not None and now_s > inst.used_t:
                    elapsed_ms = (now_s - inst.used_t) * 1000.0
                    inst.achieved_share = max(0.0, (used - inst.used_ms) / elapsed_ms)
                inst.used_ms, inst.used_t = used, now_s

    def _node_ip(self, node_id: str) -> str:
        """The address a node's instances bind their TCP listener to (its agent's report)."""
        ref = self.agents.get(node_id)
        ip = ref.info.extra.get("node_ip") if ref is not None else None
        return str(ip) if ip else "0.0.0.0"

    async def _connect(
        self, inst: LiveInstance, incarnation: int, node_ip: str, local: bool
    ) -> None:
        """Connect the gateway to a ready instance (again, after a restart in place)."""
        iid = inst.instance_id
        if inst.incarnation == incarnation and self.gateway.is_connected(inst.route, iid):
            return
        tcp = (node_ip, inst.tcp_port) if inst.tcp_port and not local else None
        uds = inst.uds_path if local else None
        await self.gateway.instance_ready(
            inst.route,
            iid,
            uds_path=uds,
            tcp=tcp,
            max_batch=inst.config.batch,
            secret=inst.channel_secret,
        )
        if self.gateway.is_connected(inst.route, iid):
            inst.incarnation = incarnation
            if inst.state is LiveState.DRAINING:
                self.gateway.drain(inst.route, iid)

    def _learn_inputs(self, fs: FunctionState, inputs: list[dict[str, Any]]) -> None:
        fs.inputs = inputs
        self.state.set_function_io(fs.spec.name, {"inputs": inputs, "outputs": fs.outputs})
        r = self.gateway.routes.get(fs.spec.name)
        if r is not None:
            r.inputs = inputs

    def _observe_memory(self, fs: FunctionState, inst: LiveInstance, usage: MemoryUsage) -> None:
        """An instance's memory report: its reservation as it changes, and the counters."""
        grows, steps, refusals = fs.memory.observe(inst.instance_id, usage)
        inst.share = replace(inst.share, mem_mb=usage.limit_mb)
        inst.memory = usage
        mt = self.gateway.metrics
        if grows:
            mt.memory_kills_avoided.labels(inst.function).inc(grows)
        if steps:
            mt.memory_steps.labels(inst.function).inc(steps)
        if refusals:
            mt.memory_refusals.labels(inst.function).inc(refusals)

    async def _observe_fikit(
        self, fs: FunctionState, inst: LiveInstance, usage: FikitUsage
    ) -> None:
        """An instance's FIKIT report: the counters' growth into the metrics, and once the
        function's first instance is in the sharing phase, its kernel profile into the state
        database (the instance's ``kernel_profile`` command)."""
        prev = inst.fikit
        inst.fikit = usage
        mt = self.gateway.metrics
        for counter, new, old in (
            (mt.fikit_preemptions, usage.preemptions, prev.preemptions if prev else 0),
            (mt.fikit_fills, usage.fills, prev.fills if prev else 0),
            (mt.fikit_measure, usage.measure_s, prev.measure_s if prev else 0.0),
        ):
            delta = new - old if new >= old else new  # below: the slot was re-registered
            if delta > 0:
                counter.labels(inst.function).inc(delta)
        if (
            usage.phase == "sharing"
            and fs.kernel_runs == 0
            and not fs.kernel_fetching
            and inst.state is LiveState.READY
        ):
            fs.kernel_fetching = True
            await self._store_kernel_profile(fs, inst)

    async def _store_kernel_profile(self, fs: FunctionState, inst: LiveInstance) -> None:
        name = fs.spec.name
        try:
            raw = await self.gateway.control(
                inst.route, inst.instance_id, {"cmd": "kernel_profile", "profile": True}
            )
            doc = json.loads(raw)
            profile = doc.get("profile")
            if isinstance(profile, dict) and int(profile.get("runs", 0)) > 0:
                code = kernel_code_key(fs.spec.model_dump(mode="json"))
                self.state.put_kernel_profile(name, code, profile, int(profile["runs"]))
                fs.kernel_runs = int(profile["runs"])
                self._event(
                    name,
                    f"FIKIT: kernel profile measured ({fs.kernel_runs} runs, "
                    f"{doc.get('kernels', 0)} op ids, {doc.get('fillable', 0)} followed by a "
                    f"gap >= 0.1 ms); sharing phase",
                    instance=inst.instance_id,
                )
        except Exception as e:
            log.warning("%s: cannot fetch the kernel profile of %s: %s", name, inst.instance_id, e)
        finally:
            fs.kernel_fetching = False

    async def _resize_memory(self, fs: FunctionState) -> None:
        """Re-solve an ``auto`` function's memory sizing and push it to its instances."""
        try:
            plan = fs.memory.resolve(fs.spec)
        except Exception as e:  # a solver failure keeps the old sizing
            self._event(fs.spec.name, f"memory sizing failed: {e}", level="warn")
            return
        if plan is None:
            return
        self._event(
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

    def _update_gauges(self) -> None:
        mt = self.gateway.metrics
        mt.instances.clear()
        counts: dict[tuple[str, str], int] = {}
        for i in self.instances.values():
            if i.profiling:
                continue
            key = (i.function, i.state.value)
            counts[key] = counts.get(key, 0) + 1
            mt.requested_share.labels(i.function, i.instance_id).set(i.share.quota_request)
            if i.achieved_share is not None:
                mt.achieved_share.labels(i.function, i.instance_id).set(i.achieved_share)
        for (fn, st), n in counts.items():
            mt.instances.labels(fn, st).set(n)
        for name, fs in self.functions.items():
            mt.predicted_rps.labels(name).set(fs.predicted_rps)
            mt.queued.labels(name).set(self.gateway.queued(name))
            if fs.memory.usage:
                usage = fs.memory.usage.values()
                mt.memory_reserved.labels(name).set(sum(u.limit_mb for u in usage))
                mt.memory_used.labels(name).set(sum(u.samples[-1][0] for u in usage if u.samples))

    def _event(
        self, function: str, message: str, *, instance: str | None = None, level: str = "info"
    ) -> None:
        emit = getattr(log, {"warn": "warning"}.get(level, level), log.info)
        emit("%s%s: %s", function, f" [{instance}]" if instance else "", message)
        with contextlib.suppress(Exception):
            self.state.add_event(function, message, instance=instance, level=level)


__all__ = [
    "AgentRef",
    "Controller",
    "ControllerConfig",
    "Device",
    "FunctionState",
    "LiveInstance",
]
