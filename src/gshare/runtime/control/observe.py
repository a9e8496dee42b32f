"""Observation: what the node agents report, applied to the controller's records.

Who calls it: ``Controller.observe`` (every reconcile period, and every ``STARTING_POLL_S``
while an instance starts) owns one ``StatusObserver``. It asks each live agent for its
``NodeStatus`` and applies it: instance states (a ready instance is connected to the gateway; a
crash and restart is counted and logged; a failed start releases the instance, backs the
function off and, with no other instance, fails its queued requests with the start error), the
token servers' ``total_used_ms`` (each instance's achieved share over the period), the memory
reports (``control.memory``) and FIKIT's counters and kernel profile. A lost agent's instances
are stopped and its devices fenced. What must hold: it runs on the server's asyncio loop only,
and it changes the controller's records but never starts instances (that is ``Controller``'s
step).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gshare.policy.control import on_start_failed, on_started
from gshare.runtime.control.records import AgentRef, FunctionState, LiveInstance
from gshare.runtime.control.state import kernel_code_key
from gshare.runtime.messages import (
    AgentGone,
    FikitUsage,
    InstanceState,
    LiveState,
    MemoryUsage,
    NodeStatus,
)

if TYPE_CHECKING:
    from gshare.runtime.control.loop import Controller

log = logging.getLogger("gshare.controller")


class StatusObserver:
    """Applies node status to one ``Controller``'s records (module doc)."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller

    async def observe(self) -> None:
        """Ask every live agent for its status and apply it."""
        refs = [a for a in self.c.agents.values() if a.alive]
        results = await asyncio.gather(*(a.handle.status() for a in refs), return_exceptions=True)
        for agent, res in zip(refs, results, strict=True):
            if isinstance(res, AgentGone):
                if agent.alive and self.c.agents.get(agent.node_id) is agent:  # not replaced
                    await self.agent_lost(agent, res)
            elif isinstance(res, BaseException):
                log.warning("agent on node %s did not answer: %s", agent.node_id[:8], res)
            else:
                await self.apply_status(agent.node_id, res)

    async def agent_lost(self, agent: AgentRef, err: BaseException) -> None:
        agent.alive = False
        log.error("agent on node %s is gone: %s", agent.node_id[:8], err)
        with contextlib.suppress(KeyError):
            self.c.gateway.metrics.node_up.remove(agent.node_id[:12])
        for inst in list(self.c.instances.values()):
            if inst.device.node_id == agent.node_id:
                self.c.event(
                    inst.function,
                    f"lost with node {agent.node_id[:8]}",
                    instance=inst.instance_id,
                    level="error",
                )
                await self.c.stop_instance(inst.instance_id, log_event=False)
        self.c.fence(agent.node_id)

    async def apply_status(self, node_id: str, status: NodeStatus) -> None:
        by_id = {s.instance_id: s for s in status.instances}
        local = node_id == self.c.gateway_node_id
        for inst in [i for i in self.c.instances.values() if i.device.node_id == node_id]:
            st = by_id.get(inst.instance_id)
            iid = inst.instance_id
            if st is None:
                if self.c.clock() - inst.created_s > self.c.config.agent_timeout_s:
                    self.c.event(
                        inst.function, "vanished from its node agent", instance=iid, level="error"
                    )
                    await self.c.stop_instance(iid, log_event=False)
                continue
            fs = self.c.functions.get(inst.function)
            inst.pid, inst.rss_mb, inst.cores = st.pid, st.rss_mb, st.cores
            if st.memory is not None and fs is not None and not inst.profiling:
                self.observe_memory(fs, inst, st.memory)
            if st.fikit is not None and fs is not None and not inst.profiling:
                await self.observe_fikit(fs, inst, st.fikit)
            inst.uds_path, inst.tcp_port = st.uds_path, st.tcp_port
            if st.restarts > inst.restarts:
                self.c.gateway.metrics.restarts.labels(inst.function).inc(
                    st.restarts - inst.restarts
                )
                inst.restarts = st.restarts
                inst.last_exit = st.last_exit
                self.c.event(
                    inst.function,
                    f"crashed and restarted ({inst.last_exit})",
                    instance=iid,
                    level="warn",
                )
            if st.state is InstanceState.READY:
                await self.connect(inst, st.incarnation, status.node_ip, local)
                connected = self.c.gateway.is_connected(inst.route, iid)
                if inst.state in (LiveState.STARTING, LiveState.RESTARTING) and connected:
                    took = self.c.clock() - inst.created_s
                    inst.state = LiveState.READY
                    self.c.event(
                        inst.function,
                        f"ready (pid {inst.pid}, cores {inst.cores}, after {took:.1f} s)",
                        instance=iid,
                    )
                    if fs is not None:
                        fs.control = on_started(fs.control)
                        fs.start_error = None
                        if st.inputs and not fs.inputs:
                            self.learn_inputs(fs, st.inputs)
            elif st.state is InstanceState.STARTING and inst.state is LiveState.READY:
                inst.state = LiveState.RESTARTING
                inst.created_s = self.c.clock()
                self.c.gateway.instance_restarting(inst.route, iid)
            elif st.state is InstanceState.FAILED:
                err = st.error or "unknown error"
                self.c.event(inst.function, f"failed: {err}", instance=iid, level="error")
                await self.c.stop_instance(iid, log_event=False)
                if fs is not None and not inst.profiling:
                    fs.control = on_start_failed(fs.control, self.c.clock(), self.c.config.control)
                    fs.start_error = f"function {inst.function!r} failed to start: {err}"
                    if not any(i.state is LiveState.READY for i in self.c.live_of(inst.function)):
                        self.c.gateway.set_start_error(inst.function, fs.start_error)
                continue
            tok = status.tokens.get(iid)
            if tok is not None:
                used, now_s = tok.total_used_ms, status.now_s
                if inst.used_ms is not None and inst.used_t is not None and now_s > inst.used_t:
                    elapsed_ms = (now_s - inst.used_t) * 1000.0
                    inst.achieved_share = max(0.0, (used - inst.used_ms) / elapsed_ms)
                inst.used_ms, inst.used_t = used, now_s

    async def connect(
        self, inst: LiveInstance, incarnation: int, node_ip: str, local: bool
    ) -> None:
        """Connect the gateway to a ready instance (again, after a restart in place)."""
        iid = inst.instance_id
        if inst.incarnation == incarnation and self.c.gateway.is_connected(inst.route, iid):
            return
        tcp = (node_ip, inst.tcp_port) if inst.tcp_port and not local else None
        uds = inst.uds_path if local else None
        await self.c.gateway.instance_ready(
            inst.route,
            iid,
            uds_path=uds,
            tcp=tcp,
            max_batch=inst.config.batch,
            secret=inst.channel_secret,
        )
        if self.c.gateway.is_connected(inst.route, iid):
            inst.incarnation = incarnation
            if inst.state is LiveState.DRAINING:
                self.c.gateway.drain(inst.route, iid)

    def learn_inputs(self, fs: FunctionState, inputs: list[dict[str, Any]]) -> None:
        fs.inputs = inputs
        self.c.state.set_function_io(fs.spec.name, {"inputs": inputs, "outputs": fs.outputs})
        r = self.c.gateway.routes.get(fs.spec.name)
        if r is not None:
            r.inputs = inputs

    def observe_memory(self, fs: FunctionState, inst: LiveInstance, usage: MemoryUsage) -> None:
        """An instance's memory report: its reservation as it changes, and the counters."""
        grows, steps, refusals = fs.memory.observe(inst.instance_id, usage)
        inst.share = replace(inst.share, mem_mb=usage.limit_mb)
        inst.memory = usage
        mt = self.c.gateway.metrics
        if grows:
            mt.memory_kills_avoided.labels(inst.function).inc(grows)
        if steps:
            mt.memory_steps.labels(inst.function).inc(steps)
        if refusals:
            mt.memory_refusals.labels(inst.function).inc(refusals)

    async def observe_fikit(self, fs: FunctionState, inst: LiveInstance, usage: FikitUsage) -> None:
        """An instance's FIKIT report: the counters' growth into the metrics, and once the
        function's first instance is in the sharing phase, its kernel profile into the state
        database (the instance's ``kernel_profile`` command)."""
        prev = inst.fikit
        inst.fikit = usage
        mt = self.c.gateway.metrics
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
            await self.store_kernel_profile(fs, inst)

    async def store_kernel_profile(self, fs: FunctionState, inst: LiveInstance) -> None:
        name = fs.spec.name
        try:
            raw = await self.c.gateway.control(
                inst.route, inst.instance_id, {"cmd": "kernel_profile", "profile": True}
            )
            doc = json.loads(raw)
            profile = doc.get("profile")
            if isinstance(profile, dict) and int(profile.get("runs", 0)) > 0:
                code = kernel_code_key(fs.spec.model_dump(mode="json"))
                self.c.state.put_kernel_profile(name, code, profile, int(profile["runs"]))
                fs.kernel_runs = int(profile["runs"])
                self.c.event(
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
