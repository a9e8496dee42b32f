"""The node agent: one per node, owning the node's devices and instances.

Who creates it: the server's cluster backend (``runtime.server``). On one machine (the
embedded default) it is a child process of the server, spoken to over a private socket pair
(``node.agent_process``); on a Ray cluster (``--cluster ray``, ``--address``) it is a Ray actor
per alive node, pinned there with ``NodeAffinitySchedulingStrategy``. This module imports Ray
only when it runs under Ray (``launcher="ray"`` or a Ray node). The controller then calls it
(control calls, a few per second at most, never per request):

* ``start_instance(launch)`` — put the function's weights in the node's ``ModelStore`` once
  (``node.tasks.put_weights`` in a throw-away process on this node, so the agent's process
  stays free of CPU-bound work: it hosts the token servers, whose answers need the GIL),
  reserve its starting memory limit in the device's memory ledger (``policy.memory``, kept by
  the device's token server; a device without that much free refuses the start), register the
  instance with its device's ``TokenServer`` (``ClientSpec``: SM %, quota request and limit,
  priority), and start the instance process on this node (CUDA: with the MPS thread
  percentage in its environment before its CUDA context exists; without an MPS daemon a
  warning says the share is time-only);
* ``stop_instance(id)`` — kill the instance process, unregister its token client, release its
  memory reservation, remove its socket;
* ``status()`` — every instance's state (starting / ready / restarting / failed), pid, socket,
  resident memory and restarts, its memory limit and the peak memory of its recent batches
  (which the instance appends to ``<socket>.mem``; the monitor reads them), each device's
  memory ledger, and each device's token table (``TokenServer.snapshot``): the controller
  turns ``total_used_ms`` deltas into the achieved share per instance;
* ``set_share`` — change an instance's token quotas in place (the profiler's quota sweep);
* ``describe(spec)`` — import the handler once in a throw-away process and report its OIP
  input description, or the error (a bad ``handler`` fails the deployment, not the first call);
* ``shutdown()`` — kill every instance, stop the token servers, drop the shared weights,
  remove the run directory.

How instance processes start (``launcher``): ``fork`` (the default) forks them from the
node's pre-imported template process (``launcher.Launcher``): they share its import heap
(Python, torch, transformers) copy-on-write as they share the weights through the store, and
a cold start skips the imports. The template is a child of the agent; it and every instance
die with the agent. ``ray`` makes each instance a Ray actor of its own (``InstanceActor``),
pinned to this node with ``NodeAffinitySchedulingStrategy``, and runs the one-off jobs as Ray
tasks. Both run the same ``InstanceServer``; the agent supervises both the same way, by pid.

Token servers run ``policy.tokens.LIVE_TOKEN_CONFIG`` (long uncontended tokens that instances
reuse for back-to-back batches; a small margin below each client's per-window limit), with the
fields of ``token_config`` overridden. With ``priority_sharing="fikit"`` (the default, ``gshare
serve --priority-sharing``) each also keeps its device's FIKIT board (``tokens.board``, beside
its socket in the run directory) and the class plan (``policy.priority.plan_classes``; a
quota is then guaranteed against the same and lower priority classes only:
``reserve_for_lower_priority=False``); ``status`` reports each instance's FIKIT phase and
counters from the board.

Crash handling (the rule and the instance's files: ``node.supervision``): a monitor thread
checks the instances' processes every ``MONITOR_PERIOD_S``, and a starting instance's ``.ready``
file every ``STARTING_CHECK_S``. An instance whose process died
(killed, crashed, or exited over its memory limit — it leaves the reason next to its socket) is
restarted in place (same id, same socket path, ``incarnation`` + 1) up to ``MAX_RESTARTS`` times
per ``RESTART_WINDOW_S``; beyond that it is marked failed and the controller replaces it. The
gateway sees the connection drop at once and retries or fails the requests it had sent (see
``gateway``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import psutil

from gshare.policy.tokens import ClientSpec
from gshare.runtime.instance.launch import InstanceLaunch, launch_to_dict
from gshare.runtime.instance.walls import WALLS_ENV
from gshare.runtime.messages import InstanceState, NodeInfo, NodeStatus
from gshare.runtime.native import cuda_deployment_env, deployment_kind, preload_env
from gshare.runtime.node import tasks as node_tasks
from gshare.runtime.node.devices import detect_devices, device_memory_mb, instance_device_env
from gshare.runtime.node.files import DEFAULT_STORE_ROOT, ensure_private_dir, store_dir
from gshare.runtime.node.launcher import LAUNCHERS, Launcher
from gshare.runtime.node.partition import mps_available, start_mps_daemon
from gshare.runtime.node.reports import node_status
from gshare.runtime.node.supervision import (
    MAX_RESTARTS,
    MONITOR_PERIOD_S,
    START_TIMEOUT_S,
    STARTING_CHECK_S,
    Managed,
    exit_reason,
    exit_status_text,
    log_tail,
    read_memory_samples,
    read_ready,
    restart_refused,
)
from gshare.runtime.node.tenancy import (
    build_weights_walled,
    instance_walls,
    tenant_walls,
    write_launch_secrets,
)
from gshare.runtime.tokens import LIVE_TOKEN_CONFIG, TokenServer
from gshare.runtime.tokens.board import board_path

if TYPE_CHECKING:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gshare.runtime.node.model_store import ModelStore
    from gshare.runtime.node.tasks import HandlerDescription

log = logging.getLogger("gshare.agent")

PRIORITY_SHARING = ("fikit", "tokens")
"""How a device combines functions of different ``priority`` (``gshare serve
--priority-sharing``): ``fikit`` — FIKIT orders the priority classes, tokens share the device
within a class (``policy.priority.plan_classes``; a board per device, ``tokens.board``);
``tokens`` — priorities only order the token queue."""
EXIT_REPORT_WAIT_S = 1.0
"""How long the monitor waits for the template to report the exit status of an instance it
found dead while it started (``_exit_code_soon``): the message names the code or signal."""


def _last_line(e: BaseException) -> str:
    """The most useful line of a Ray error: the innermost exception's message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ":" in ln and not ln.startswith(("File ", "^", "~")):
            return ln[:500]
    return (lines[-1] if lines else repr(e))[:500]


def _ray() -> ModuleType:
    """Ray, imported on first use: only an agent that runs under Ray (a Ray node, or
    ``launcher="ray"``) gets here; the embedded default never imports it."""
    import ray  # lazy: Ray is an optional dependency (module doc)

    return ray


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    """A Ray scheduling strategy that keeps a task or actor on ``node_id``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: Ray

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


class NodeAgent:
    """The node agent (see the module doc): a Ray actor (``ray.remote(NodeAgent)``) or the
    object a ``node.agent_process`` child serves. ``node_ip`` is the node's address (None: ask
    Ray, for an agent on a Ray node); ``launcher="ray"`` needs Ray."""

    def __init__(
        self,
        node_id: str,
        run_dir: str,
        token_config: dict[str, Any] | None = None,
        store_root: str | None = None,
        launcher: str = "fork",
        device_mem_mb: float | None = None,
        priority_sharing: str = "fikit",
        cuda_deployment: str | None = None,
        node_ip: str | None = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO)
        if priority_sharing not in PRIORITY_SHARING:
            raise ValueError(
                f"priority_sharing must be one of {', '.join(PRIORITY_SHARING)}, "
                f"got {priority_sharing!r}"
            )
        self.priority_sharing = priority_sharing
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        self.node_id = node_id
        self.node_ip: str = node_ip or _ray().util.get_node_ip_address()
        # per node, so that several Ray nodes on one host (Ray's cluster utilities, the
        # multi-node tests) do not share token sockets or model stores
        tag = node_id[:12]
        self.run_dir = Path(run_dir) / f"node-{tag}"
        ensure_private_dir(self.run_dir, levels=3)  # 0700, ours (node.files)
        self.store_root = f"{store_root}-{tag}" if store_root else None
        self._store_dir = store_dir(self.store_root or DEFAULT_STORE_ROOT)
        # tenant walls around forked instances (instance.walls); GSHARE_TENANT_WALLS=0: none
        self.walls = launcher == "fork" and os.environ.get(WALLS_ENV, "1") != "0"
        self.devices = detect_devices()
        # The GPU frontend's deployment for CUDA instances (runtime.native): "preload" (the
        # interposer in LD_PRELOAD, the default) or "shim" (a libcuda.so.1 built from the
        # interposer and the node's driver, first on LD_LIBRARY_PATH); cuda_deployment, else
        # GSHARE_CUDA_DEPLOYMENT. A shim that cannot be made fails the agent, loudly.
        self.cuda_deployment = deployment_kind(cuda_deployment)
        self._cuda_env: dict[str, str] | None = None  # None: preload_env() at each use
        if self.cuda_deployment == "shim" and any(d.startswith("cuda") for d in self.devices):
            self._cuda_env = cuda_deployment_env(self.run_dir, self.cuda_deployment)
            log.info("CUDA instances on node %s load the libcuda.so.1 shim", node_id[:8])
        self.mps = False
        if any(d.startswith("cuda") for d in self.devices):
            self.mps = mps_available() or start_mps_daemon()
            if not self.mps:
                log.warning(
                    "no MPS daemon on node %s: GPU shares are time-only (sm_pct not enforced)",
                    node_id[:8],
                )
        cfg = replace(LIVE_TOKEN_CONFIG, **(token_config or {}))
        if priority_sharing == "fikit":  # a quota is guaranteed against the same class and below
            cfg = replace(cfg, reserve_for_lower_priority=False)
        self.device_memory_mb = [device_memory_mb(d, device_mem_mb) for d in self.devices]
        self.token_servers: list[TokenServer] = []
        for i, _ in enumerate(self.devices):
            sock = str(self.run_dir / f"tokens{i}.sock")
            ts = TokenServer(
                sock,
                cfg,
                memory_mb=self.device_memory_mb[i],
                board=board_path(sock),
                priority_classes=priority_sharing == "fikit",
            )
            ts.start()
            self.token_servers.append(ts)
        self.cpu_count = len(os.sched_getaffinity(0))
        self._lock = threading.RLock()
        self._instances: dict[str, Managed] = {}
        self._model_keys: set[str] = set()
        self._built_keys: dict[str, str | None] = {}
        """A user handler's spec (JSON) -> the key its walled ``build_weights`` gave (or None)."""
        self._model_store: ModelStore | None = None
        self._key_locks: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        self._forked = threading.Event()
        """Set when an instance was forked: the monitor looks for its ``.ready`` file at once."""
        self.launcher_kind = launcher
        self._actor_cls: Any = None
        """``ray.remote(InstanceActor)`` (``launcher="ray"``)."""
        if launcher == "ray":
            # lazy: the instance runtime, which only launcher="ray" imports into the agent
            from gshare.runtime.instance.server import InstanceActor

            self._actor_cls = _ray().remote(InstanceActor)
        self._launcher: Launcher | None = None
        self._launcher_lock = threading.Lock()
        if launcher == "fork":  # import the runtime now, not at the first deployment
            cuda = any(d.startswith("cuda") for d in self.devices)
            cuda_env = preload_env() if self._cuda_env is None else self._cuda_env
            self._launcher = Launcher(env=cuda_env if cuda else None)
            threading.Thread(
                target=self._launcher_started, name="gshare-template", daemon=True
            ).start()
        self._monitor = threading.Thread(
            target=self._monitor_loop, name="gshare-monitor", daemon=True
        )
        self._monitor.start()

    def _log_path(self, launch: InstanceLaunch) -> Path:
        """Where a forked instance's stdout and stderr go."""
        return self.run_dir / f"i-{launch.instance_id}.log"

    # -- queries -------------------------------------------------------------------------------

    def info(self) -> NodeInfo:
        return NodeInfo(
            node_id=self.node_id,
            devices=tuple(self.devices),
            cpu_count=self.cpu_count,
            device_memory_mb=tuple(self.device_memory_mb),
            extra={
                "node_ip": self.node_ip,
                "pid": os.getpid(),
                "mps": self.mps,
                "run_dir": str(self.run_dir),
                "launcher": self.launcher_kind,
                "priority_sharing": self.priority_sharing,
            },
        )

    def describe(self, spec: dict[str, object], extra_sys_path: list[str]) -> HandlerDescription:
        try:
            # the handler's import is tenant code: inside its walls
            walls = (
                tenant_walls(str(spec.get("name", "")), spec, extra_sys_path).to_dict()
                if self.walls
                else None
            )
            result = self._node_task("describe_handler", [spec, extra_sys_path], 300.0, walls=walls)
            return cast("HandlerDescription", result)
        except Exception as e:
            return {"ok": False, "error": _last_line(e)}

    def _launcher_started(self) -> Launcher:
        """The node's template process, started (or restarted after a death) on first need."""
        assert self._launcher is not None
        with self._launcher_lock:
            if not self._launcher.alive():
                if self._launcher.pid is not None:
                    log.warning(
                        "the instance template of node %s died; starting a new one",
                        self.node_id[:8],
                    )
                self._launcher.start()
        return self._launcher

    def _node_task(
        self,
        name: str,
        args: list[object],
        timeout_s: float,
        walls: dict[str, object] | None = None,
    ) -> object:
        """Run ``node.tasks.NAME(*args)`` in a throw-away process on this node (inside
        ``walls``, ``instance.walls``, when given: a task that imports a tenant's code)."""
        if self._launcher is not None:
            return self._launcher_started().call(
                f"gshare.runtime.node.tasks:{name}", args, timeout_s, walls=walls
            )
        ray = _ray()
        task = ray.remote(getattr(node_tasks, name)).options(
            num_cpus=0, scheduling_strategy=_pinned(self.node_id)
        )
        result: object = ray.get(task.remote(*args), timeout=timeout_s)
        return result

    def status(self) -> NodeStatus:
        """``node.reports.node_status`` of this node (its instances read under the lock)."""
        ledgers = [ts.memory_snapshot() for ts in self.token_servers]
        with self._lock:
            return node_status(
                self.node_id,
                self.node_ip,
                self._instances,
                self.token_servers,
                ledgers,
                fikit=self.priority_sharing == "fikit",
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def start_instance(self, launch: InstanceLaunch) -> None:
        """Start an instance (returns at once; ``status`` reports it starting, then ready or
        failed). The agent fills in the socket paths, the token credential and the model key."""
        base = launch
        idx = min(base.device_index, len(self.token_servers) - 1)
        # its own directory (its socket, .ready/.exit/.mem, its temporary files), which the
        # walls give to its uid (instance.walls)
        sock = str(self.run_dir / f"i-{base.instance_id}" / f"i-{base.instance_id}.sock")
        device = self.devices[idx]
        env = {
            **base.env,
            **instance_device_env(
                device,
                base.sm_pct,
                self.cpu_count,
                mps=self.mps,
                epoch_s=self.token_servers[idx].epoch_s,
                cuda_env=self._cuda_env,
            ),
        }
        ts = self.token_servers[idx]
        if base.mem_mb > 0 or base.mem_step_mb > 0:
            grant = ts.reserve_memory(base.instance_id, base.mem_mb)
            if not grant.granted:
                raise RuntimeError(
                    f"device {device} of node {self.node_id[:8]} has {grant.free_mb:.0f} MiB of "
                    f"memory unreserved; instance {base.instance_id} needs {base.mem_mb:.0f} MiB"
                )
        filled = replace(
            base,
            token_secret=base.token_secret or secrets.token_hex(16),
            device=device,
            device_index=idx,
            token_socket=self.token_servers[idx].socket_path,
            uds_path=sock,
            store_root=self.store_root,
            env=env,
        )
        m = Managed(filled)
        with self._lock:
            if base.instance_id in self._instances:
                raise ValueError(f"instance {base.instance_id} already exists on this node")
            self._instances[base.instance_id] = m
        m.mem_offset = 0
        threading.Thread(target=self._start, args=(m, True), daemon=True).start()

    def _start(self, m: Managed, first: bool) -> None:
        launch = m.launch
        try:
            if self._launcher is not None:  # a built-in model's classes, shared by its instances
                self._launcher_started().preload(str(launch.spec.get("model") or ""))
            if first:
                lock = self._key_locks.setdefault(launch.function, threading.Lock())
                with lock:
                    key = self._put_weights(launch)
                if key:
                    self._model_keys.add(key)
                    if launch.device.startswith("cuda"):  # one device copy per GPU (CUDA IPC)
                        self._store().export_cuda(key, launch.device)
                launch = replace(launch, model_key=key)
                self.token_servers[launch.device_index].add_client(
                    ClientSpec(
                        client_id=launch.instance_id,
                        sm_pct=launch.sm_pct,
                        quota_request=launch.quota_request,
                        quota_limit=launch.quota_limit,
                        priority=launch.priority,
                    ),
                    secret=launch.token_secret,
                )
            for suffix in (".exit", ".ready"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(launch.uds_path + suffix)
            if self._launcher is not None:
                self._fork_instance(m, launch)
                return
            opts: dict[str, Any] = {
                "num_cpus": 0,
                "max_restarts": 0,
                "max_concurrency": 2,
                "scheduling_strategy": _pinned(self.node_id),
            }
            if launch.env:  # set before the process starts (MPS %, OpenMP waits)
                opts["runtime_env"] = {"env_vars": dict(launch.env)}
            actor = self._actor_cls.options(**opts).remote(launch_to_dict(launch))
            with self._lock:
                if m.state is InstanceState.STOPPED:
                    _ray().kill(actor, no_restart=True)
                    return
                m.launch = launch
                m.actor = actor
                m.ready_ref = actor.ready.remote()
                m.started_s = time.monotonic()
        except Exception as e:
            with self._lock:
                if m.state is not InstanceState.STOPPED:
                    m.state = InstanceState.FAILED
                    m.error = f"cannot start: {_last_line(e)}"

    def _fork_instance(self, m: Managed, launch: InstanceLaunch) -> None:
        """``launcher="fork"``: fork the instance from the node's template (``_start``'s end)."""
        data = launch_to_dict(launch)
        secrets_path = write_launch_secrets(data, os.path.dirname(launch.uds_path))
        pid = self._launcher_started().launch(
            data,
            str(self._log_path(launch)),
            walls=instance_walls(launch, str(self._store_dir)).to_dict() if self.walls else None,
            secrets_path=secrets_path,
        )
        with self._lock:
            m.launch = launch
            m.pid = pid
            m.started_s = time.monotonic()
            with contextlib.suppress(psutil.Error):
                m.proc = psutil.Process(pid)
            if m.state is InstanceState.STOPPED:
                self._kill(m)
        self._forked.set()

    def _put_weights(self, launch: InstanceLaunch) -> str | None:
        """The function's weights into the node's store (``node.tasks``); their key. A user
        handler's ``initial_weights()`` is tenant code: it runs inside the tenant's walls and
        hands over a .safetensors file, which a root task stores."""
        spec = launch.spec
        user_code = not spec.get("model") and not spec.get("weights")
        if not (self.walls and user_code):
            key = self._node_task(
                "put_weights", [self.store_root, spec, sorted(self._model_keys)], START_TIMEOUT_S
            )
            return cast("str | None", key)
        ident = json.dumps(spec, sort_keys=True, default=str)
        if ident in self._built_keys:  # built for an earlier instance: its tenant code ran once
            return self._built_keys[ident]
        build = self.run_dir / f"w-{launch.instance_id}"
        built = build_weights_walled(self._node_task, launch, build, START_TIMEOUT_S)
        self._built_keys[ident] = built
        return built

    def _kill(self, m: Managed) -> None:
        """Kill the instance's process (either launcher); the caller holds the lock. A forked
        process the template reported dead is not signalled (its pid may be reused)."""
        if m.actor is not None:
            with contextlib.suppress(Exception):
                _ray().kill(m.actor, no_restart=True)
        elif m.pid is not None and (
            self._launcher is None or self._launcher.exit_code(m.pid) is None
        ):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(m.pid, signal.SIGKILL)

    def stop_instance(self, instance_id: str) -> None:
        with self._lock:
            m = self._instances.pop(instance_id, None)
            if m is None:
                return
            m.state = InstanceState.STOPPED
            self._kill(m)
        with contextlib.suppress(Exception):
            self.token_servers[m.launch.device_index].remove_client(instance_id)
        self.token_servers[m.launch.device_index].release_memory(instance_id)
        for suffix in ("", ".exit", ".ready", ".mem"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(m.launch.uds_path + suffix)
        shutil.rmtree(os.path.dirname(m.launch.uds_path), ignore_errors=True)

    def set_share(self, instance_id: str, quota_request: float, quota_limit: float) -> None:
        """Change an instance's token quotas in place (``TokenServer.set_quota``: no reconnect).
        Used by the profiler between trials and by the live workflow scheduler per task."""
        with self._lock:
            m = self._instances[instance_id]
            m.launch = replace(m.launch, quota_request=quota_request, quota_limit=quota_limit)
            ts = self.token_servers[m.launch.device_index]
        ts.set_quota(instance_id, quota_request, quota_limit)

    def _store(self) -> ModelStore:
        """This agent's ``ModelStore`` (created on first use: it imports torch)."""
        if self._model_store is None:
            from gshare.runtime.node.model_store import ModelStore  # lazy: torch (docstring)

            self._model_store = ModelStore(self.store_root) if self.store_root else ModelStore()
        return self._model_store

    def shutdown(self) -> None:
        self._stop.set()
        self._forked.set()  # wakes the monitor
        with self._lock:
            ids = list(self._instances)
        for iid in ids:
            self.stop_instance(iid)
        if self._launcher is not None:
            with contextlib.suppress(Exception):
                self._launcher.stop()
        for ts in self.token_servers:
            with contextlib.suppress(Exception):
                ts.stop()
        if self.store_root:  # this server's own store: remove it whole
            shutil.rmtree(self.store_root, ignore_errors=True)
        else:
            for key in list(self._model_keys):
                with contextlib.suppress(Exception):
                    self._store().drop(key)
        with contextlib.suppress(OSError):  # the node's store directory, once empty
            self._store_dir.rmdir()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # -- monitor ---------------------------------------------------------------------------------

    def _monitor_loop(self) -> None:
        """Every ``MONITOR_PERIOD_S`` every instance (``_check``); in between, every
        ``STARTING_CHECK_S`` while a forked instance starts, its ``.ready`` file alone."""
        next_full_s = time.monotonic()
        while True:
            with self._lock:
                items = list(self._instances.values())
            starting = [m for m in items if m.state is InstanceState.STARTING and m.pid is not None]
            wait_s = max(0.0, next_full_s - time.monotonic())
            if starting:
                wait_s = min(wait_s, STARTING_CHECK_S)
            self._forked.wait(wait_s)
            self._forked.clear()
            if self._stop.is_set():
                return
            full = time.monotonic() >= next_full_s
            if full:
                next_full_s = time.monotonic() + MONITOR_PERIOD_S
            for m in items if full else starting:
                try:
                    if full:
                        self._check(m, psutil)
                    else:
                        self._take_ready(m)
                except Exception as e:  # keep monitoring the others
                    log.warning("monitor: %s", e)

    def _take_ready(self, m: Managed) -> bool:
        """A forked instance that wrote its ``.ready`` file is READY (True)."""
        info = read_ready(m)
        if info is None:
            return False
        with self._lock:
            if m.state is InstanceState.STARTING:
                m.info = info
                m.state = InstanceState.READY
                m.error = None
        return True

    def _check(self, m: Managed, psutil: ModuleType) -> None:
        if (
            m.state is InstanceState.STARTING and m.pid is not None
        ):  # forked: its .ready file says when
            if self._take_ready(m):
                return
            if not self._alive(m, psutil):
                code = self._exit_code_soon(m.pid)
                reason = exit_reason(
                    m, f"failed to start: the process exited{exit_status_text(code)}"
                )
                log_path = self._log_path(m.launch)
                tail = log_tail(log_path)
                where = f"log: {log_path}" + (f"; it ends: {tail}" if tail else "; it is empty")
                self._on_death(m, f"{reason} ({where})", start_failure=True)
            elif time.monotonic() - m.started_s > START_TIMEOUT_S:
                self._on_death(m, f"not ready after {START_TIMEOUT_S:.0f} s", start_failure=True)
        elif m.state is InstanceState.STARTING and m.ready_ref is not None:
            ray = _ray()
            done, _ = ray.wait([m.ready_ref], timeout=0)
            if done:
                try:
                    info = ray.get(done[0])
                except Exception as e:
                    self._on_death(m, f"failed to start: {_last_line(e)}", start_failure=True)
                    return
                with self._lock:
                    if m.state is InstanceState.STARTING:
                        m.info = info
                        m.proc = psutil.Process(info["pid"])
                        m.state = InstanceState.READY
                        m.error = None
            elif time.monotonic() - m.started_s > START_TIMEOUT_S:
                self._on_death(m, f"not ready after {START_TIMEOUT_S:.0f} s", start_failure=True)
        elif m.state is InstanceState.READY and m.proc is not None:
            if self._alive(m, psutil):
                with contextlib.suppress(Exception):
                    mi = m.proc.memory_info()
                    m.rss_mb = mi.rss / (1 << 20)
                read_memory_samples(m)
                return
            self._on_death(m, exit_reason(m, "process exited"), start_failure=False)

    def _exit_code_soon(self, pid: int) -> int | None:
        """The exit status of a forked instance found dead (``_check``), waiting up to
        ``EXIT_REPORT_WAIT_S`` for the template's report: a process seen as a zombie has
        exited, and the template reports it once it has reaped it (None: not reported)."""
        if self._launcher is None:
            return None
        deadline = time.monotonic() + EXIT_REPORT_WAIT_S
        while (code := self._launcher.exit_code(pid)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return code

    def _alive(self, m: Managed, psutil: ModuleType) -> bool:
        if (
            m.pid is not None
            and self._launcher is not None
            and self._launcher.exit_code(m.pid) is not None
        ):
            return False
        if m.proc is None:
            return False
        try:
            return bool(m.proc.is_running() and m.proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def _on_death(self, m: Managed, reason: str, *, start_failure: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if m.state in (InstanceState.STOPPED, InstanceState.FAILED):
                return
            m.last_exit = reason
            self._kill(m)
            m.actor = m.ready_ref = m.proc = m.pid = None
            give_up = restart_refused(m, reason, now, start_failure=start_failure)
            if give_up is not None:
                m.state, m.error = InstanceState.FAILED, give_up
                return
            if m.launch.mem_mb > 0 or m.launch.mem_step_mb > 0:  # back to its starting limit
                self.token_servers[m.launch.device_index].reserve_memory(
                    m.launch.instance_id, m.launch.mem_mb
                )
            m.launch = replace(m.launch, incarnation=m.launch.incarnation + 1)
            m.state = InstanceState.STARTING
            m.info = {}
        log.warning("instance %s died (%s); restarting", m.launch.instance_id, reason)
        threading.Thread(target=self._start, args=(m, False), daemon=True).start()


__all__ = ["MAX_RESTARTS", "NodeAgent"]
