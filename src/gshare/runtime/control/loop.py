"""The controller: the live runtime's twin of the simulator's (``sim.cluster``) control loop.

Who runs it: the server process, on the same asyncio loop as the gateway. Every
``period_s`` (1 s) ``reconcile`` does, for the whole cluster:

1. **observe** — each node agent's ``status()`` (one Ray call per node): instance states
   (ready instances are connected to the gateway; crashes and restarts are logged; a failed
   start releases the instance and, when the function has no other instance, fails its
   queued requests with the start error and backs off), and the token servers' per-client
   ``total_used_ms``, whose growth over the period is each instance's achieved share;
2. **predict** — each function's arrivals counted by the gateway over the period, folded into
   an EWMA and a window maximum (``policy.rate``, as the simulator does); the prediction is
   ``max(EWMA, window max) × headroom``;
3. **keep-alive** — ``policy.prewarm.keep_alive_deadline_ms`` of the last arrival: until it
   passes a function keeps at least one instance; after it the prediction is 0, so the
   autoscaler removes every instance above ``min_instances`` (scale to zero);
4. **decide** — the autoscaler (``policy.autoscale``, FaST-GShare Algorithm 1 by default)
   with the function's candidate configs, its running instances and ``min/max_instances``;
5. **apply** — new instances are bound to a device and rectangle by the placer
   (``policy.placement``, Maximal Rectangles by default) and started by that device's node
   agent; removed instances are drained (the gateway stops sending, in-flight requests
   finish) and then stopped, and their rectangle released.

A request for a function with no instance nudges the loop at once (cold start): the
autoscaler is asked right away with the queued demand, and the requests wait in the
gateway's queue until the instance is ready.

Candidate configs (``configs_for``), in order of preference:

* ``resources: auto`` and the function was profiled (``gshare profile``): FaST-GShare's
  ``candidate_configs`` over the live profile table (every measured sm × quota × batch up to
  ``max_batch``, filtered by ``slo_ms``);
* ``resources: auto`` on a CUDA node, built-in model present in the shipped V100 table:
  ``candidate_configs`` over that table;
* ``resources: auto`` otherwise: ``DEFAULT_SHARE`` (documented below), one config;
* explicit ``resources``: that one config.

A config's throughput comes from the profile table when the function was profiled at that
point; otherwise it is estimated from what the instances measure (the gateway's EWMA of busy
time per request): ``quota_request × 1000 / busy_ms_per_request``, and before any
measurement from ``DEFAULT_BUSY_MS_PER_REQUEST``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from gshare.policy import autoscale, rate
from gshare.policy.placement import NoCapacity, make_placer
from gshare.policy.prewarm import keep_alive_deadline_ms
from gshare.profiles import ProfileError, ProfileTable
from gshare.resources import GpuShare
from gshare.runtime.control.state import StateStore
from gshare.runtime.gateway.router import ControlPlane, Gateway, HttpError
from gshare.runtime.instance.server import InstanceLaunch, launch_to_dict
from gshare.spec import FunctionSpec, SpecError, parse_function_spec

log = logging.getLogger("gshare.controller")

DEFAULT_SHARE = GpuShare(sm_pct=50.0, quota_request=0.5, quota_limit=1.0)
"""The share of a ``resources: auto`` function that has no profile (CPU nodes, or a model not
in the shipped table): half the cores (SMs), half of every window guaranteed, and idle time up
to the whole window (elastic). ``gshare profile NAME`` replaces it with measured configs."""
DEFAULT_BUSY_MS_PER_REQUEST = 20.0
"""Busy time per request assumed before an unprofiled function has run (then measured)."""
NO_SLO_MS = 3_600_000.0
"""SLO used to filter candidate configs of a function without ``slo_ms`` (any config)."""
STARTING_POLL_S = 0.25
"""Agent poll interval while an instance is starting (between reconcile periods)."""
MAX_DEVICES = 256
"""Upper bound of devices the placer tracks (devices of nodes that join later included)."""


@dataclass
class ControllerConfig:
    """Knobs of the control loop (defaults as the simulator's ``ClusterConfig``)."""

    period_s: float = 1.0
    headroom: float = 1.2
    rate_alpha: float = 0.5
    rate_window: int = 3
    autoscaler: str = "fast-heuristic"
    placer: str = "mra"
    drain_timeout_s: float = 120.0
    """Longest a removed instance drains its in-flight requests before it is stopped."""
    start_backoff_s: float = 2.0
    """First back-off after a failed start; doubles per failure, at most 60 s."""
    agent_timeout_s: float = 10.0


@dataclass
class AgentRef:
    node_id: str
    actor: Any
    info: dict[str, Any]
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
    state: str = "starting"
    """starting | ready | restarting | draining"""
    created_s: float = field(default_factory=time.monotonic)
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
    route: str = ""
    """The gateway route it serves (the function's; a private one for profiling)."""

    def __post_init__(self) -> None:
        self.route = self.route or self.function


@dataclass
class FunctionState:
    spec: FunctionSpec
    version: int
    ewma: rate.EwmaRate
    window: rate.WindowMaxRate
    inputs: list[dict[str, Any]] = field(default_factory=list)
    predicted_rps: float = 0.0
    observed_rps: float = 0.0
    invocations: int = 0
    backoff_until: float = 0.0
    start_failures: int = 0
    start_error: str | None = None
    configs: list[autoscale.ScaleConfig] = field(default_factory=list)
    config_source: str = ""
    table: ProfileTable | None = None
    table_loaded: bool = False
    last_reason: str = ""
    last_shortfall_s: float = 0.0


class Controller(ControlPlane):
    """See the module doc. ``agents`` maps node id → agent; the server adds them."""

    def __init__(
        self,
        state: StateStore,
        gateway: Gateway,
        config: ControllerConfig | None = None,
        *,
        gateway_node_id: str = "",
        extra_sys_path: tuple[str, ...] = (),
    ) -> None:
        self.state = state
        self.gateway = gateway
        self.config = config or ControllerConfig()
        self.gateway_node_id = gateway_node_id
        self.extra_sys_path = extra_sys_path
        self.scale = autoscale.get_autoscaler(self.config.autoscaler)
        self.placer = make_placer(self.config.placer, max_gpus=MAX_DEVICES)
        self.agents: dict[str, AgentRef] = {}
        self.devices: list[Device] = []
        self.functions: dict[str, FunctionState] = {}
        self.instances: dict[str, LiveInstance] = {}
        self._counter = 0
        self._nudge = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_observe = time.monotonic()
        self._started = False
        self.profiler: Any = None
        gateway.on_cold = self._on_cold

    # -- setup -----------------------------------------------------------------------------------

    def add_agent(self, node_id: str, actor: Any, info: dict[str, Any]) -> None:
        """Register a node agent and its devices (the server calls it at start and when a
        node joins)."""
        self.agents[node_id] = AgentRef(node_id, actor, info)
        for i, name in enumerate(info.get("devices", ["cpu"])):
            self.devices.append(Device(len(self.devices), node_id, i, name))

    async def start(self) -> None:
        """Restore the deployed functions from the state and start the loop."""
        for sf in self.state.list_functions():
            try:
                spec = parse_function_spec(sf.spec)
            except SpecError as e:
                self.state.add_event(sf.name, f"cannot restore: {e}", level="error")
                continue
            self._register(spec, sf.version, (sf.io or {}).get("inputs", []))
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
            *(self._stop_instance(iid, log_event=False) for iid in list(self.instances)),
            return_exceptions=True,
        )

    def ready(self) -> bool:
        return self._started and any(a.alive for a in self.agents.values())

    def _register(self, spec: FunctionSpec, version: int, inputs: list[dict[str, Any]]) -> FunctionState:
        fs = FunctionState(
            spec=spec,
            version=version,
            ewma=rate.EwmaRate(alpha=self.config.rate_alpha),
            window=rate.WindowMaxRate(k=self.config.rate_window),
            inputs=inputs,
        )
        old = self.functions.get(spec.name)
        if old is not None:
            fs.invocations = old.invocations
            fs.ewma, fs.window = old.ewma, old.window
        self.functions[spec.name] = fs
        self.gateway.add_function(spec.name, spec.slo_ms, spec.batching.max_batch, inputs)
        self._refresh_configs(fs)
        return fs

    # -- control API -----------------------------------------------------------------------------

    async def deploy(self, body: bytes, content_type: str, *, update: bool | None) -> dict[str, Any]:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise HttpError(400, "the function spec must be UTF-8 JSON or YAML") from None
        try:
            data = json.loads(text) if "json" in content_type else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            first = " ".join(str(e).split())[:300]
            raise HttpError(400, f"the function spec is not valid {'JSON' if 'json' in content_type else 'YAML'} ({first})") from None
        try:
            spec = parse_function_spec(data)
        except SpecError as e:
            raise HttpError(400, f"invalid function spec: {e}") from None
        exists = spec.name in self.functions
        if update is False and exists:
            raise HttpError(409, f"function {spec.name!r} already exists (update it with PUT)")
        if update is True and not exists:
            raise HttpError(404, f"function {spec.name!r} is not deployed (create it with POST)")
        dump = spec.model_dump(mode="json")
        described = await self._describe(dump)
        if not described.get("ok"):
            raise HttpError(400, f"invalid function spec: handler/model of {spec.name!r} cannot be loaded: {described.get('error')}")
        stored = self.state.put_function(spec.name, dump)
        inputs = described.get("inputs") or []
        self.state.set_function_io(spec.name, {"inputs": inputs})
        if exists:  # replace the instances: drain the old ones, the autoscaler starts new ones
            for inst in list(self.instances.values()):
                if inst.function == spec.name and inst.state != "draining" and not inst.profiling:
                    self._drain(inst, "the function was updated")
        fs = self._register(spec, stored.version, inputs)
        self.state.add_event(spec.name, f"{'updated' if exists else 'deployed'} (version {stored.version}): {_spec_summary(spec)}")
        self._nudge.set()
        return self.function_status(fs.spec.name)

    async def _describe(self, spec: dict[str, Any]) -> dict[str, Any]:
        agent = next((a for a in self.agents.values() if a.alive), None)
        if agent is None:
            raise HttpError(503, "no node agent is running")
        try:
            result: dict[str, Any] = await asyncio.wait_for(
                _await_ref(agent.actor.describe.remote(spec, list(self.extra_sys_path))), 300
            )
            return result
        except TimeoutError:
            raise HttpError(503, "the node agent did not answer in time") from None

    async def delete(self, name: str) -> None:
        if name not in self.functions:
            raise HttpError(404, f"function {name!r} is not deployed")
        del self.functions[name]
        self.state.delete_function(name)
        self.gateway.remove_function(name)
        if self.profiler is not None:
            self.profiler.cancel(name)
        await asyncio.gather(
            *(self._stop_instance(i.instance_id, log_event=False) for i in list(self.instances.values()) if i.function == name),
            return_exceptions=True,
        )
        self.state.add_event(name, "deleted")

    def list_functions(self) -> list[dict[str, Any]]:
        return [self.function_status(n) for n in sorted(self.functions)]

    def function_status(self, name: str) -> dict[str, Any]:
        fs = self.functions.get(name)
        if fs is None:
            raise HttpError(404, f"function {name!r} is not deployed")
        insts = [i for i in self.instances.values() if i.function == name and not i.profiling]
        return {
            "name": name,
            "version": fs.version,
            "spec": fs.spec.model_dump(mode="json"),
            "image": fs.spec.model or fs.spec.handler,
            "invocationCount": fs.invocations + self._pending_arrivals(name),
            "replicas": sum(1 for i in insts if i.state != "draining"),
            "availableReplicas": sum(1 for i in insts if i.state == "ready"),
            "available_replicas": sum(1 for i in insts if i.state == "ready"),
            "predicted_rps": round(fs.predicted_rps, 3),
            "observed_rps": round(fs.observed_rps, 3),
            "queued": self.gateway.queued(name),
            "inputs": fs.inputs,
            "start_error": fs.start_error,
            "config_source": fs.config_source,
            "configs": len(fs.configs),
            "last_decision": fs.last_reason,
            "instances": [_instance_view(i) for i in sorted(insts, key=lambda i: i.instance_id)],
        }

    def _pending_arrivals(self, name: str) -> int:
        r = self.gateway.routes.get(name)
        return r.arrivals if r else 0

    def logs(self, name: str, tail: int) -> list[str]:
        events = self.state.events(name, tail)
        if not events and name not in self.functions:
            raise HttpError(404, f"function {name!r} is not deployed and has no logs")
        return [e.format() for e in events]

    async def start_profile(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        if name not in self.functions:
            raise HttpError(404, f"function {name!r} is not deployed")
        if self.profiler is None:
            raise HttpError(503, "the profiler is not available")
        result: dict[str, Any] = await self.profiler.start(name, params)
        return result

    def profile_status(self, name: str) -> dict[str, Any]:
        if self.profiler is None:
            raise HttpError(503, "the profiler is not available")
        result: dict[str, Any] = self.profiler.status(name)
        return result

    def info(self) -> dict[str, Any]:
        from gshare import __version__

        return {
            "version": __version__,
            "autoscaler": self.config.autoscaler,
            "placer": self.config.placer,
            "period_s": self.config.period_s,
            "nodes": [
                {"node_id": a.node_id, "alive": a.alive, **{k: v for k, v in a.info.items() if k != "node_id"}}
                for a in self.agents.values()
            ],
            "devices": [{"index": d.index, "node_id": d.node_id, "name": d.name} for d in self.devices],
            "functions": len(self.functions),
            "instances": len(self.instances),
        }

    # -- candidate configs -------------------------------------------------------------------------

    def profile_changed(self, name: str) -> None:
        fs = self.functions.get(name)
        if fs is not None:
            fs.table_loaded = False
            self._refresh_configs(fs)

    def _refresh_configs(self, fs: FunctionState) -> None:
        """Recompute the function's candidate configs (see the module doc)."""
        spec = fs.spec
        if not fs.table_loaded:
            fs.table = self.state.profile_table(spec.name)
            fs.table_loaded = True
        max_batch = spec.batching.max_batch
        slo = spec.slo_ms or NO_SLO_MS
        wait = spec.batching.max_wait_ms
        table, name = fs.table, spec.name
        if spec.resources == "auto":
            if table is not None:
                bs = [b for b in table.batches(name) if b <= max_batch] or [min(table.batches(name))]
                sms = sorted({p.sm_pct for p in table.measured(name)})
                qs = sorted({p.quota_pct for p in table.measured(name)})
                try:
                    fs.configs = autoscale.candidate_configs(
                        table, name, slo, sm_values=sms, quota_values=qs, batches=bs, max_wait_ms=wait
                    )
                    fs.config_source = f"live profile ({len(fs.configs)} configs meet the SLO)"
                except autoscale.AutoscaleError as e:
                    fs.configs = autoscale.candidate_configs(
                        table, name, NO_SLO_MS, sm_values=sms, quota_values=qs, batches=bs, max_wait_ms=wait
                    )
                    fs.config_source = f"live profile, SLO unmet ({e})"
                return
            if spec.model and self._has_cuda() and spec.device != "cpu":
                v100 = ProfileTable.shipped_v100()
                if v100.has_model(spec.model):
                    try:
                        fs.configs = autoscale.candidate_configs(v100, spec.model, slo, max_wait_ms=wait)
                        fs.config_source = "shipped V100 profile"
                        return
                    except (autoscale.AutoscaleError, ProfileError):
                        pass
            share = DEFAULT_SHARE
            fs.config_source = "default share (not profiled)"
        else:
            share = spec.resources.share()
            fs.config_source = "spec resources"
        fs.configs = [self._config_at(fs, share, max_batch)]

    def _config_at(self, fs: FunctionState, share: GpuShare, batch: int) -> autoscale.ScaleConfig:
        q_pct = share.quota_request * 100.0
        name = fs.spec.name
        if fs.table is not None:
            with contextlib.suppress(ProfileError):
                lat = fs.table.latency_ms(name, share.sm_pct, q_pct, batch)
                return autoscale.ScaleConfig(share.sm_pct, q_pct, batch, batch * 1000.0 / lat, lat)
        r = self.gateway.routes.get(name)
        per_item = r.exec_ms_per_item if r is not None and r.exec_ms_per_item else DEFAULT_BUSY_MS_PER_REQUEST
        t = share.quota_request * 1000.0 / max(per_item, 1e-3)
        return autoscale.ScaleConfig(share.sm_pct, q_pct, batch, t, batch * 1000.0 / t)

    def _share_of(self, fs: FunctionState, cfg: autoscale.ScaleConfig) -> GpuShare:
        spec = fs.spec
        q = cfg.quota_pct / 100.0
        if spec.resources == "auto":
            limit = DEFAULT_SHARE.quota_limit if fs.config_source.startswith("default") else q
            return GpuShare(cfg.sm_pct, q, max(q, limit), 0.0)
        return GpuShare(cfg.sm_pct, q, max(q, spec.resources.quota_limit), float(spec.resources.mem_mb))

    def _has_cuda(self) -> bool:
        return any(d.name.startswith("cuda") for d in self.devices)

    # -- the loop --------------------------------------------------------------------------------

    def _on_cold(self, function: str) -> None:
        self._nudge.set()

    async def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stopping:
            timeout = max(0.0, next_tick - time.monotonic())
            if any(i.state in ("starting", "restarting") for i in self.instances.values()):
                timeout = min(timeout, STARTING_POLL_S)  # connect new instances promptly
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), timeout)
            if self._stopping:
                return
            try:
                if time.monotonic() >= next_tick:
                    self._nudge.clear()
                    next_tick = time.monotonic() + self.config.period_s
                    await self.reconcile()
                elif self._nudge.is_set():
                    self._nudge.clear()
                    await self._cold_starts()
                else:  # an instance is starting: only look at the agents
                    await self._observe()
            except Exception:  # never let the loop die; log and go on
                log.exception("reconcile failed")

    async def reconcile(self) -> None:
        """One control period (see the module doc)."""
        await self._observe()
        now = time.monotonic()
        interval = max(1e-3, now - self._last_observe)
        self._last_observe = now
        for name in sorted(self.functions):
            fs = self.functions.get(name)
            if fs is not None:
                await self._scale(fs, interval)
        await self._finish_drains()
        self._update_gauges()

    async def _cold_starts(self) -> None:
        """Nudged: start an instance right away for functions with queued requests and none."""
        for name, fs in list(self.functions.items()):
            if self.gateway.queued(name) and not self._live_of(name):
                await self._scale(fs, None)

    def _live_of(self, name: str) -> list[LiveInstance]:
        return [
            i
            for i in self.instances.values()
            if i.function == name and i.state != "draining" and not i.profiling
        ]

    async def _scale(self, fs: FunctionState, interval_s: float | None) -> None:
        name = fs.spec.name
        now_wall = time.time()
        if interval_s is not None:  # a period tick: observe the rate
            n = self.gateway.take_arrivals(name)
            fs.invocations += n
            fs.observed_rps = n / interval_s
            fs.ewma = rate.observe(fs.ewma, n, interval_s)
            fs.window = rate.observe(fs.window, n, interval_s)
            self._refresh_configs(fs)
        predicted = max(rate.predict(fs.ewma), rate.predict(fs.window)) * self.config.headroom
        # Idle since the later of the last arrival and the last answer: a request that waited
        # through a cold start longer than keep_alive_s must not see its instance scaled away
        # the moment it is ready. Requests in flight keep the function warm.
        last = self.gateway.idle_since_s(name)
        keep_warm = self.gateway.outstanding(name) > 0
        if last is not None and not keep_warm:
            deadline_ms = keep_alive_deadline_ms(last * 1000.0, fs.spec.keep_alive_s * 1000.0)
            if now_wall * 1000.0 >= deadline_ms:
                predicted = 0.0  # idle past keep-alive: let the autoscaler scale to min
                fs.ewma = rate.EwmaRate(alpha=self.config.rate_alpha)
                fs.window = rate.WindowMaxRate(k=self.config.rate_window)
            else:
                keep_warm = True
        queued = self.gateway.queued(name)
        if queued and predicted <= 0.0:
            predicted = 1e-3  # demand is waiting: at least one instance
        fs.predicted_rps = predicted
        min_eff = max(fs.spec.min_instances, 1 if (keep_warm or queued) else 0)
        min_eff = min(min_eff, fs.spec.max_instances)
        live = self._live_of(name)
        by_key = {(c.sm_pct, c.quota_pct, c.batch): c for c in fs.configs}
        running = [
            autoscale.Instance(i.instance_id, name, by_key.get((i.config.sm_pct, i.config.quota_pct, i.config.batch), i.config))
            for i in live
        ]
        try:
            decision = self.scale(
                name, predicted, running, fs.configs, min_instances=min_eff, max_instances=fs.spec.max_instances
            )
        except autoscale.AutoscaleError as e:
            self._event(fs, f"autoscaler: {e}", level="error")
            return
        add = list(decision.add)
        if add and time.monotonic() < fs.backoff_until:
            add = []
        if decision.remove or add:
            fs.last_reason = decision.reason
            self._event(fs, f"scale: R={predicted:.2f} rps, {decision.reason}; +{len(add)} -{len(decision.remove)}")
        for iid in decision.remove:
            inst = self.instances.get(iid)
            if inst is not None:
                self._drain(inst, "scaled down")
        for cfg in add:
            await self._start_instance(fs, cfg)

    # -- instance lifecycle ----------------------------------------------------------------------

    async def _start_instance(self, fs: FunctionState, cfg: autoscale.ScaleConfig, *, profiling: bool = False, share: GpuShare | None = None, device: Device | None = None) -> LiveInstance | None:
        name = fs.spec.name
        self._counter += 1
        iid = f"{name}-{'p' if profiling else ''}{self._counter}"
        share = share or self._share_of(fs, cfg)
        if device is None:
            try:
                binding = self.placer.place_share(iid, share)
            except NoCapacity as e:
                now = time.monotonic()
                if now - fs.last_shortfall_s > 30:
                    fs.last_shortfall_s = now
                    self._event(fs, f"no room for another instance: {e}", level="warn")
                return None
            ok = binding.gpu < len(self.devices) and self.agents[self.devices[binding.gpu].node_id].alive
            if not ok:
                self.placer.release(iid)
                now = time.monotonic()
                if now - fs.last_shortfall_s > 30:
                    fs.last_shortfall_s = now
                    self._event(fs, "no room for another instance: every device is full", level="warn")
                return None
            device = self.devices[binding.gpu]
            sm_offset = binding.rect.y
        else:
            sm_offset = 0.0
        spec = fs.spec
        launch = InstanceLaunch(
            instance_id=iid,
            function=name,
            spec=spec.model_dump(mode="json"),
            sm_pct=share.sm_pct,
            quota_request=share.quota_request,
            quota_limit=share.quota_limit,
            mem_mb=share.mem_mb,
            priority=spec.priority,
            max_batch=cfg.batch,
            max_wait_ms=spec.batching.max_wait_ms,
            device=device.name,
            device_index=device.local_index,
            sm_offset_pct=min(100.0, max(0.0, sm_offset)),
            listen_tcp=device.node_id != self.gateway_node_id,
            extra_sys_path=self.extra_sys_path,
        )
        inst = LiveInstance(iid, name, cfg, share, device, profiling=profiling)
        self.instances[iid] = inst
        agent = self.agents[device.node_id]
        try:
            await asyncio.wait_for(_await_ref(agent.actor.start_instance.remote(launch_to_dict(launch))), self.config.agent_timeout_s)
        except Exception as e:
            del self.instances[iid]
            if not profiling:
                self.placer.release(iid)
            self._event(fs, f"cannot start instance {iid}: {e}", level="error")
            return None
        if not profiling:
            self.gateway.metrics.cold_starts.labels(name).inc()
        self._event(
            fs,
            f"starting on node {device.node_id[:8]} {device.name}: sm {share.sm_pct:g}%, quota "
            f"{share.quota_request:g}/{share.quota_limit:g}, batch {cfg.batch}, est. {cfg.throughput_rps:.1f} rps",
            instance=iid,
        )
        return inst

    def _drain(self, inst: LiveInstance, why: str) -> None:
        if inst.state == "draining":
            return
        inst.state = "draining"
        inst.drain_since = time.monotonic()
        self.gateway.drain(inst.route, inst.instance_id)
        self._event_name(inst.function, f"draining ({why})", instance=inst.instance_id)

    async def _finish_drains(self) -> None:
        now = time.monotonic()
        for inst in list(self.instances.values()):
            if inst.state != "draining" or inst.drain_since is None:
                continue
            if self.gateway.inflight(inst.route, inst.instance_id) == 0 or now - inst.drain_since > self.config.drain_timeout_s:
                await self._stop_instance(inst.instance_id)

    async def _stop_instance(self, iid: str, *, log_event: bool = True, why: str = "stopped") -> None:
        inst = self.instances.pop(iid, None)
        if inst is None:
            return
        self.gateway.instance_gone(inst.route, iid)
        agent = self.agents.get(inst.device.node_id)
        if agent is not None and agent.alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_await_ref(agent.actor.stop_instance.remote(iid)), self.config.agent_timeout_s)
        if not inst.profiling:
            with contextlib.suppress(KeyError):
                self.placer.release(iid)
            self.placer.take_moves()  # moves within a device change no mechanism on our side
        self.gateway.metrics.forget_instance(inst.function, iid)
        if log_event:
            self._event_name(inst.function, why, instance=iid)

    # -- observation -----------------------------------------------------------------------------

    async def _observe(self) -> None:
        refs = {nid: a for nid, a in self.agents.items() if a.alive}
        results = await asyncio.gather(
            *(asyncio.wait_for(_await_ref(a.actor.status.remote()), self.config.agent_timeout_s) for a in refs.values()),
            return_exceptions=True,
        )
        for (nid, agent), res in zip(refs.items(), results, strict=True):
            if isinstance(res, BaseException):
                await self._agent_lost(agent, res)
                continue
            await self._apply_status(nid, res)

    async def _agent_lost(self, agent: AgentRef, err: BaseException) -> None:
        import ray

        if not isinstance(err, ray.exceptions.RayActorError | ray.exceptions.ActorDiedError):
            log.warning("agent on node %s did not answer: %s", agent.node_id[:8], err)
            return
        agent.alive = False
        log.error("agent on node %s is gone: %s", agent.node_id[:8], err)
        for inst in list(self.instances.values()):
            if inst.device.node_id == agent.node_id:
                self._event_name(inst.function, f"lost with node {agent.node_id[:8]}", instance=inst.instance_id, level="error")
                await self._stop_instance(inst.instance_id, log_event=False)

    async def _apply_status(self, node_id: str, status: dict[str, Any]) -> None:
        by_id = {s["instance_id"]: s for s in status["instances"]}
        tokens = status.get("tokens", {})
        now_s = float(status.get("now_s", time.monotonic()))
        for inst in [i for i in self.instances.values() if i.device.node_id == node_id]:
            st = by_id.get(inst.instance_id)
            if st is None:
                if time.monotonic() - inst.created_s > self.config.agent_timeout_s:
                    self._event_name(inst.function, "vanished from its node agent", instance=inst.instance_id, level="error")
                    await self._stop_instance(inst.instance_id, log_event=False)
                continue
            fs = self.functions.get(inst.function)
            inst.pid = st.get("pid")
            inst.rss_mb = float(st.get("rss_mb") or 0.0)
            inst.cores = st.get("cores")
            inst.uds_path = st.get("uds_path")
            inst.tcp_port = st.get("tcp_port")
            restarts = int(st.get("restarts") or 0)
            if restarts > inst.restarts:
                self.gateway.metrics.restarts.labels(inst.function).inc(restarts - inst.restarts)
                inst.restarts = restarts
                inst.last_exit = st.get("last_exit")
                self._event_name(inst.function, f"crashed and restarted ({inst.last_exit})", instance=inst.instance_id, level="warn")
            state = st["state"]
            if state == "ready":
                connected = self.gateway.is_connected(inst.route, inst.instance_id)
                if inst.incarnation != st["incarnation"] or not connected:
                    tcp = (status["node_ip"], inst.tcp_port) if inst.tcp_port and node_id != self.gateway_node_id else None
                    uds = inst.uds_path if node_id == self.gateway_node_id else None
                    await self.gateway.instance_ready(
                        inst.route, inst.instance_id, uds_path=uds, tcp=tcp, max_batch=inst.config.batch
                    )
                    if self.gateway.is_connected(inst.route, inst.instance_id):
                        inst.incarnation = st["incarnation"]
                        if inst.state == "draining":
                            self.gateway.drain(inst.route, inst.instance_id)
                if inst.state in ("starting", "restarting") and self.gateway.is_connected(inst.route, inst.instance_id):
                    took = time.monotonic() - inst.created_s
                    inst.state = "ready"
                    self._event_name(inst.function, f"ready (pid {inst.pid}, cores {inst.cores}, after {took:.1f} s)", instance=inst.instance_id)
                    if fs is not None:
                        fs.start_failures = 0
                        fs.start_error = None
                        if st.get("inputs") and not fs.inputs:
                            fs.inputs = st["inputs"]
                            self.state.set_function_io(inst.function, {"inputs": fs.inputs})
                            r = self.gateway.routes.get(inst.function)
                            if r is not None:
                                r.inputs = fs.inputs
            elif state in ("starting", "restarting") and inst.state == "ready":
                inst.state = "restarting"
                inst.created_s = time.monotonic()
                self.gateway.instance_restarting(inst.route, inst.instance_id)
            elif state == "failed":
                err = st.get("error") or "unknown error"
                self._event_name(inst.function, f"failed: {err}", instance=inst.instance_id, level="error")
                await self._stop_instance(inst.instance_id, log_event=False)
                if fs is not None and not inst.profiling:
                    fs.start_failures += 1
                    fs.backoff_until = time.monotonic() + min(60.0, self.config.start_backoff_s * 2 ** (fs.start_failures - 1))
                    fs.start_error = f"function {inst.function!r} failed to start: {err}"
                    if not any(i.state == "ready" for i in self._live_of(inst.function)):
                        self.gateway.set_start_error(inst.function, fs.start_error)
                continue
            tok = tokens.get(inst.instance_id)
            if tok is not None:
                used = float(tok["total_used_ms"])
                if inst.used_ms is not None and inst.used_t is not None and now_s > inst.used_t:
                    inst.achieved_share = max(0.0, (used - inst.used_ms) / ((now_s - inst.used_t) * 1000.0))
                inst.used_ms, inst.used_t = used, now_s

    # -- metrics and events ------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        mt = self.gateway.metrics
        mt.instances.clear()
        counts: dict[tuple[str, str], int] = {}
        for i in self.instances.values():
            if i.profiling:
                continue
            counts[(i.function, i.state)] = counts.get((i.function, i.state), 0) + 1
            mt.requested_share.labels(i.function, i.instance_id).set(i.share.quota_request)
            if i.achieved_share is not None:
                mt.achieved_share.labels(i.function, i.instance_id).set(i.achieved_share)
        for (fn, st), n in counts.items():
            mt.instances.labels(fn, st).set(n)
        for name, fs in self.functions.items():
            mt.predicted_rps.labels(name).set(fs.predicted_rps)
            mt.queued.labels(name).set(self.gateway.queued(name))

    def _event(self, fs: FunctionState, message: str, *, instance: str | None = None, level: str = "info") -> None:
        self._event_name(fs.spec.name, message, instance=instance, level=level)

    def _event_name(self, function: str, message: str, *, instance: str | None = None, level: str = "info") -> None:
        getattr(log, {"warn": "warning"}.get(level, level), log.info)("%s%s: %s", function, f" [{instance}]" if instance else "", message)
        with contextlib.suppress(Exception):
            self.state.add_event(function, message, instance=instance, level=level)


async def _await_ref(ref: Any) -> Any:
    return await ref


def _spec_summary(spec: FunctionSpec) -> str:
    what = f"model {spec.model}" if spec.model else f"handler {spec.handler}"
    res = "resources auto" if spec.resources == "auto" else (
        f"sm {spec.resources.sm_pct:g}%, quota {spec.resources.quota_request:g}/{spec.resources.quota_limit:g}"
        + (f", mem {spec.resources.mem_mb} MiB" if spec.resources.mem_mb else "")
    )
    return (
        f"{what}, {res}, batch {spec.batching.max_batch}/{spec.batching.max_wait_ms:g} ms, "
        f"instances {spec.min_instances}..{spec.max_instances}, keep-alive {spec.keep_alive_s:g} s"
    )


def _instance_view(i: LiveInstance) -> dict[str, Any]:
    return {
        "id": i.instance_id,
        "state": i.state,
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
        "token_clock_s": i.used_t,
        "restarts": i.restarts,
        "last_exit": i.last_exit,
        "rss_mb": i.rss_mb,
        "uds_path": i.uds_path,
    }


__all__ = ["DEFAULT_SHARE", "Controller", "ControllerConfig", "FunctionState", "LiveInstance"]
