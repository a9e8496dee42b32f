"""The control API behind ``/system/...``: deploy, update, delete, list, status, logs, profile.

Who uses it: the gateway's HTTP app (``runtime.gateway.app.build_app``) calls a
``ControlApi`` for every authenticated control request; it acts on the controller
(``runtime.control.loop``) and the state database. Every bad input is an ``HttpError`` naming
the problem (400 spec errors, 404 unknown function, 409 conflicts, 503 no agent).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gshare import __version__
from gshare.documents import DocumentError, load_json, load_yaml
from gshare.runtime.control.loop import Controller
from gshare.runtime.control.profiler import LiveProfiler
from gshare.runtime.control.records import FunctionState, LiveInstance
from gshare.runtime.control.status import status_view
from gshare.runtime.gateway.control_plane import ControlPlane
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.stages import StageScheduler
from gshare.runtime.gateway.workflows import Call as WorkflowCall
from gshare.runtime.gateway.workflows import WorkflowRunner
from gshare.runtime.messages import LiveState
from gshare.spec import FunctionSpec, MemSteps, SpecError, parse_function_spec
from gshare.workflows.spec import WorkflowSpecError, parse_workflow

DELETE_DRAIN_S = 10.0
"""How long a delete waits for the requests its instances are running (then they get 410)."""


class ControlApi(ControlPlane):
    """The control API of one server (module doc)."""

    def __init__(
        self,
        controller: Controller,
        gateway: Gateway,
        stage_scheduler: StageScheduler | None,
        profiler: LiveProfiler | None = None,
    ) -> None:
        """``gateway``: the controller's (requests drained on delete, queue lengths);
        ``profiler``: ``gshare profile``'s jobs on the controller (None: profiling answers 503);
        ``stage_scheduler``: the live workflow scheduler the server was started with
        (``runtime.wiring`` builds it; None: ``direct``, each stage through its function's own
        queue)."""
        self.c = controller
        self.gateway = gateway
        self.profiler = profiler
        self._locks: dict[str, asyncio.Lock] = {}
        self.workflows = WorkflowRunner(gateway, scheduler=stage_scheduler)
        for name, spec, version in controller.state.list_workflows():
            try:  # restored as stored; a stage whose function is gone fails at invoke time
                functions = [s.get("function", "") for s in spec.get("stages", [])]
                self.workflows.put(parse_workflow(spec, known_functions=functions), version)
            except WorkflowSpecError as e:
                controller.state.add_event(name, f"cannot restore workflow: {e}", level="error")

    # -- workflows (runtime.gateway.workflows) ----------------------------------------------------

    async def deploy_workflow(
        self, body: bytes, content_type: str, *, update: bool
    ) -> dict[str, object]:
        try:
            data = await asyncio.to_thread(load_json if "json" in content_type else load_yaml, body)
        except DocumentError as e:
            raise HttpError(400, f"the workflow spec {e}") from None
        known = [n for n in self.c.functions]
        try:
            spec = await asyncio.to_thread(parse_workflow, data, known_functions=known)
        except WorkflowSpecError as e:
            raise HttpError(400, str(e)) from None
        async with self._name_lock("workflow:" + spec.name):
            exists = spec.name in self.workflows.workflows
            if exists and not update:
                raise HttpError(409, f"workflow {spec.name!r} already exists (use PUT to update)")
            if not exists and update:
                raise HttpError(404, f"workflow {spec.name!r} is not deployed")
            version = self.c.state.put_workflow(spec.name, spec.model_dump(mode="json"))
            self.workflows.put(spec, version)
            self.c.state.add_event(
                spec.name,
                f"workflow deployed (version {version}): "
                + ", ".join(f"{s.name}={s.function}" for s in spec.stages)
                + f"; slo {spec.slo_ms:g} ms",
            )
        return {"name": spec.name, "version": version, "stages": len(spec.stages)}

    async def delete_workflow(self, name: str) -> None:
        async with self._name_lock("workflow:" + name):
            if not self.workflows.remove(name):
                raise HttpError(404, f"workflow {name!r} is not deployed")
            self.c.state.delete_workflow(name)
            self.c.state.add_event(name, "workflow deleted")

    def list_workflows(self) -> list[dict[str, object]]:
        return self.workflows.view()

    async def run_workflow(
        self, name: str, body: bytes, enc: int, call: WorkflowCall
    ) -> tuple[int, bytes]:
        return await self.workflows.run(name, body, enc, call)

    def ready(self) -> bool:
        return self.c.ready()

    def function_version(self, name: str) -> int:
        fs = self.c.functions.get(name)
        if fs is None:
            raise HttpError(404, f"function {name!r} is not deployed")
        return fs.version

    async def deploy(
        self, body: bytes, content_type: str, *, update: bool | None
    ) -> dict[str, object]:
        is_json = "json" in content_type
        try:  # bounded, and off the event loop (a hostile document must not stall serving)
            data = await asyncio.to_thread(load_json if is_json else load_yaml, body)
        except DocumentError as e:
            raise HttpError(400, f"the function spec {e}") from None
        try:
            spec = await asyncio.to_thread(parse_function_spec, data)
        except SpecError as e:
            raise HttpError(400, f"invalid function spec: {e}") from None
        async with self._name_lock(spec.name):
            return await self._deploy_locked(spec, update)

    def _name_lock(self, name: str) -> asyncio.Lock:
        """The lock that serialises the control operations of one function name: a create,
        update or delete checks and changes the name's state as one step, so concurrent creates
        of one name give one 201 and 409s, and a delete cannot be undone by an update that was
        already past its check."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def _deploy_locked(self, spec: FunctionSpec, update: bool | None) -> dict[str, object]:
        c = self.c
        exists = spec.name in c.functions
        if update is False and exists:
            raise HttpError(409, f"function {spec.name!r} already exists (update it with PUT)")
        if update is True and not exists:
            raise HttpError(404, f"function {spec.name!r} is not deployed (create it with POST)")
        dump = spec.model_dump(mode="json")
        described = await self._describe(dump)
        if not described.get("ok"):
            raise HttpError(
                400,
                f"invalid function spec: handler/model of {spec.name!r} cannot be loaded: "
                f"{described.get('error')}",
            )
        generative = bool(described.get("generative")) or spec.is_generative_builtin
        if spec.slo is not None and not generative:
            raise HttpError(
                400,
                f"invalid function spec: slo (ttft_ms, tpot_ms) applies to generative functions "
                f"only, and the handler of {spec.name!r} does not follow the step-wise "
                f"generative contract (docs/generative.md)",
            )
        stored = c.state.put_function(spec.name, dump)
        inputs, outputs = _ports(described.get("inputs")), _ports(described.get("outputs"))
        c.state.set_function_io(
            spec.name, {"inputs": inputs, "outputs": outputs, "generative": generative}
        )
        if exists:  # replace the instances: drain the old ones, the autoscaler starts new ones
            for inst in list(c.instances.values()):
                if (
                    inst.function == spec.name
                    and inst.state is not LiveState.DRAINING
                    and not inst.profiling
                ):
                    c.drain(inst, "the function was updated")
        fs = c.register(spec, stored.version, inputs, outputs, generative=generative)
        verb = "updated" if exists else "deployed"
        c.state.add_event(spec.name, f"{verb} (version {stored.version}): {_spec_summary(spec)}")
        c.nudge()
        return self.function_status(fs.spec.name)

    async def _describe(self, spec: dict[str, object]) -> dict[str, object]:
        agent = next((a for a in self.c.agents.values() if a.alive), None)
        if agent is None:
            raise HttpError(503, "no node agent is running")
        try:
            return await agent.handle.describe(spec, list(self.c.extra_sys_path))
        except TimeoutError:
            raise HttpError(503, "the node agent did not answer in time") from None

    async def delete(self, name: str) -> None:
        async with self._name_lock(name):
            await self._delete_locked(name)

    async def _delete_locked(self, name: str) -> None:
        c = self.c
        if name not in c.functions:
            raise HttpError(404, f"function {name!r} is not deployed")
        # Drain: no new request, the queued ones get 410, the running ones may finish.
        self.gateway.close_function(name)
        deadline = c.clock() + DELETE_DRAIN_S
        while self.gateway.inflight_total(name) and c.clock() < deadline:
            await asyncio.sleep(0.05)
        c.unregister(name)
        c.state.delete_function(name)
        if self.profiler is not None:
            self.profiler.cancel(name)
        await asyncio.gather(
            *(
                c.stop_instance(i.instance_id, log_event=False)
                for i in list(c.instances.values())
                if i.function == name
            ),
            return_exceptions=True,
        )
        c.state.add_event(name, "deleted")

    def list_functions(self) -> list[dict[str, object]]:
        return [self.function_status(n) for n in sorted(self.c.functions)]

    def function_status(self, name: str) -> dict[str, object]:
        c = self.c
        fs = c.functions.get(name)
        if fs is None:
            raise HttpError(404, f"function {name!r} is not deployed")
        insts = [i for i in c.instances.values() if i.function == name and not i.profiling]
        ready = sum(1 for i in insts if i.state is LiveState.READY)
        route = self.gateway.routes.get(name)
        return {
            "name": name,
            "version": fs.version,
            "spec": fs.spec.model_dump(mode="json"),
            "spec_summary": _spec_summary(fs.spec),
            "image": fs.spec.model or fs.spec.handler,
            "invocationCount": fs.invocations + (route.arrivals if route else 0),
            "replicas": sum(1 for i in insts if i.state is not LiveState.DRAINING),
            "availableReplicas": ready,
            "available_replicas": ready,
            "predicted_rps": round(fs.predicted_rps, 3),
            "observed_rps": round(fs.observed_rps, 3),
            "queued": self.gateway.queued(name),
            "inputs": fs.inputs,
            "outputs": fs.outputs,
            "start_error": fs.start_error,
            "waiting_reason": route.waiting_reason if route else None,
            "config_source": fs.configs.describe(),
            "configs": len(fs.configs.configs),
            "config_throughput_rps": [round(c.throughput_rps, 3) for c in fs.configs.configs],
            "last_decision": fs.last_reason,
            "memory": _memory_view(fs),
            "priority": fs.spec.priority,
            "fikit": _fikit_view(fs, insts),
            "instances": [_instance_view(i) for i in sorted(insts, key=lambda i: i.instance_id)],
        }

    async def instance_stats(self, name: str, instance_id: str) -> dict[str, object]:
        """One ready instance's own counters (its ``stats`` command, through the gateway):
        requests, batches, busy and token-wait time, queued and running requests, and its
        batching loop's gaps between back-to-back batches (``loop_gaps_ms``, the newest)."""
        if name not in self.c.functions:
            raise HttpError(404, f"function {name!r} is not deployed")
        inst = self.c.instances.get(instance_id)
        if inst is None or inst.function != name:
            raise HttpError(404, f"function {name!r} has no instance {instance_id!r}")
        raw = await self.gateway.control(inst.route, instance_id, {"cmd": "stats"})
        out: dict[str, object] = {"id": instance_id, **json.loads(raw)}
        return out

    def logs(self, name: str, tail: int) -> list[str]:
        events = self.c.state.events(name, tail)
        if not events and name not in self.c.functions:
            raise HttpError(404, f"function {name!r} is not deployed and has no logs")
        return [e.format() for e in events]

    async def start_profile(self, name: str, params: dict[str, object]) -> dict[str, object]:
        if name not in self.c.functions:
            raise HttpError(404, f"function {name!r} is not deployed")
        if self.profiler is None:
            raise HttpError(503, "the profiler is not available")
        result: dict[str, object] = await self.profiler.start(name, params)
        return result

    def profile_status(self, name: str) -> dict[str, object]:
        """The profiling job's progress (its ``rows`` as measured) and the function's stored
        profile (``table``: ``[{sm_pct, quota_pct, batch, latency_ms}]``, what ``gshare simulate
        --profiles-from`` reads); 404 when it has neither."""
        table = [
            {
                "sm_pct": p.sm_pct,
                "quota_pct": p.quota_pct,
                "batch": p.batch,
                "latency_ms": p.latency_ms,
            }
            for p in self.c.state.profile_rows(name)
        ]
        result: dict[str, object] = {"function": name, "state": "none"}
        if self.profiler is not None:
            try:
                result = self.profiler.status(name)
            except HttpError:
                if not table:
                    raise
        elif not table:
            raise HttpError(503, "the profiler is not available")
        return {**result, "table": table}

    def status_view(self) -> dict[str, object]:
        """The status page's document (``runtime.control.status``)."""
        return status_view(self.c, self.gateway, self.workflows.status())

    def info(self) -> dict[str, object]:
        c = self.c
        return {
            "version": __version__,
            "autoscaler": c.config.autoscaler,
            "placer": c.config.placer,
            "workflow_policy": c.config.workflow_policy,
            "workflow_scheduler": (
                self.workflows.scheduler.view() if self.workflows.scheduler is not None else None
            ),
            "period_s": c.config.period_s,
            # the host's monotonic clock (time.monotonic) at the controller's last period ticks
            "control_ticks_s": list(c.ticks_s),
            "nodes": [
                {
                    "node_id": a.node_id,
                    "alive": a.alive,
                    "devices": list(a.info.devices),
                    "cpu_count": a.info.cpu_count,
                    **dict(a.info.extra),
                }
                for a in c.agents.values()
            ],
            "devices": [
                {"index": d.index, "node_id": d.node_id, "name": d.name} for d in c.devices
            ],
            "functions": len(c.functions),
            "instances": len(c.instances),
        }


def _ports(value: object) -> list[dict[str, Any]]:
    """The OIP tensor descriptions in a handler's description (``[]`` when it declares none)."""
    return [p for p in value if isinstance(p, dict)] if isinstance(value, list) else []


def _mem_text(mem: str | int | MemSteps) -> str:
    """``512 MiB``, ``auto`` or ``256 MiB growing by 128 up to 2048 MiB`` (init, step, max)."""
    if isinstance(mem, str):
        return mem
    if isinstance(mem, int):
        return f"{mem} MiB"
    return f"{mem.init} MiB growing by {mem.step} up to {mem.max} MiB"


def _spec_summary(spec: FunctionSpec) -> str:
    what = f"model {spec.model}" if spec.model else f"handler {spec.handler}"
    if spec.resources == "auto":
        res = "resources auto"
    else:
        r = spec.resources
        res = f"sm {r.sm_pct:g}%, quota {r.quota_request:g}/{r.quota_limit:g}" + (
            "" if not r.mem_mb else f", mem {_mem_text(r.mem_mb)}"
        )
    b = spec.batching
    return (
        f"{what}, {res}, batch {b.max_batch}/{b.max_wait_ms:g} ms, "
        f"instances {spec.min_instances}..{spec.max_instances}, keep-alive {spec.keep_alive_s:g} s"
    )


def _memory_view(fs: FunctionState) -> dict[str, object] | None:
    """The function's memory sizing: the plan its next instances start with, and the history
    it was solved from (None: no memory limit)."""
    plan = fs.memory.plan(fs.spec)
    if not plan.governed:
        return None
    return {
        "init_mb": plan.init_mb,
        "step_mb": plan.step_mb,
        "max_mb": plan.max_mb or None,
        "auto": not isinstance(fs.spec.resources, str) and fs.spec.resources.mem_mb == "auto",
        "measured_batches": len(fs.memory.history),
    }


def _fikit_view(fs: FunctionState, insts: list[LiveInstance]) -> dict[str, object]:
    """The function's FIKIT phase (``policy.priority.TaskPhase``): ``measuring`` while one of its
    instances measures, ``sharing`` once they share (or a kept profile lets the next one start
    sharing), ``-`` when its device shares by tokens alone or nothing ran yet; its instances'
    counters summed."""
    usages = [i.fikit for i in insts if i.fikit is not None]
    if any(u.phase == "measuring" for u in usages):
        phase = "measuring"
    elif any(u.phase == "sharing" for u in usages) or fs.kernel_runs > 0:
        phase = "sharing"
    else:
        phase = "-"
    return {
        "phase": phase,
        "profile_runs": fs.kernel_runs,
        "preemptions": sum(u.preemptions for u in usages),
        "fills": sum(u.fills for u in usages),
        "measure_s": round(sum(u.measure_s for u in usages), 3),
    }


def _instance_view(i: LiveInstance) -> dict[str, object]:
    return {
        "id": i.instance_id,
        "state": i.state.value,
        "node_id": i.device.node_id,
        "device": i.device.name,
        "pid": i.pid,
        "cores": i.cores,
        "sm_pct": i.share.sm_pct,
        "quota_request": i.share.quota_request,
        "quota_limit": i.share.quota_limit,
        "mem_mb": i.share.mem_mb,
        "batch": i.config.batch,
        "throughput_rps": round(i.config.throughput_rps, 2),
        "achieved_share": None if i.achieved_share is None else round(i.achieved_share, 4),
        "token_used_ms": i.used_ms,
        "token_held_ms": i.token_held_ms,
        "tokens": i.tokens,
        "token_idle_hold_ms": None
        if i.token_idle_hold_ms is None
        else round(i.token_idle_hold_ms, 4),
        "token_clock_s": i.used_t,
        "restarts": i.restarts,
        "last_exit": i.last_exit,
        "rss_mb": i.rss_mb,
        "memory": None
        if i.memory is None
        else {
            "limit_mb": i.memory.limit_mb,
            "grows": i.memory.grows,
            "steps": i.memory.steps,
            "refusals": i.memory.refusals,
            "last_peak_mb": round(i.memory.samples[-1][0], 1) if i.memory.samples else None,
        },
        "fikit": None
        if i.fikit is None
        else {
            "phase": i.fikit.phase,
            "runs": i.fikit.runs,
            "preemptions": i.fikit.preemptions,
            "fills": i.fikit.fills,
            "gaps": i.fikit.gaps,
            "measure_s": round(i.fikit.measure_s, 3),
            "wait_s": round(i.fikit.wait_s, 3),
        },
        "uds_path": i.uds_path,
    }


__all__ = ["ControlApi"]
