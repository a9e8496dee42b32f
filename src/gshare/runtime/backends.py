"""How a server's node agents are started, found, watched and stopped: the embedded default
(``LocalBackend``: one agent, a child process of the server) or Ray (``RayBackend``: one agent
actor per Ray node), both behind ``ClusterBackend``; ``cluster_backend`` picks one from the
server's options.

Who calls it: ``runtime.server`` (its ``_Runtime`` owns the backend and calls it in the order
``ClusterBackend`` gives). This module imports Ray only when the Ray backend runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import subprocess
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from gshare.runtime.control.agents import ProcessAgentHandle, RayAgentHandle
from gshare.runtime.messages import AgentGone, NodeInfo
from gshare.runtime.node.agent_process import spawn_agent
from gshare.runtime.options import ServeOptions

if TYPE_CHECKING:
    from gshare.runtime.control.loop import Controller

log = logging.getLogger("gshare.server")


class BackendHost(Protocol):
    """What a backend reads of the server that owns it (``runtime.server``'s ``_Runtime``)."""

    opts: ServeOptions
    session: str
    """This server's session id (every process it starts carries it)."""
    run_dir: str
    """The server's run directory (sockets, instance folders)."""
    store_root: str | None
    """Where the node agents keep their shared-memory model stores (None: no /dev/shm)."""


NODE_SCAN_S = 5.0
"""How often the Ray backend looks for nodes without an agent."""
CLUSTERS = ("local", "ray")
"""``gshare serve --cluster``: the embedded default (one machine, no Ray), or Ray."""


class ServeError(Exception):
    """A startup failure with a one-line message (the CLI prints it)."""


def _enable_ray_token_auth(token: str) -> None:
    """Ray's token authentication for a local Ray (``RAY_AUTH_MODE=token``, the session's own
    token in ``RAY_AUTH_TOKEN``; every process Ray starts inherits both). Ray reads its config
    once per process, at import, so it is refreshed here — through ``ray._raylet.Config``, what
    Ray's own ``_enable_token_auth`` calls; if that fails, Ray runs without token auth and the
    log says so."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]  # lazy: Ray is optional

        Config.initialize("")
    except Exception as e:  # a Ray without token auth: run as before, and say so
        os.environ.pop("RAY_AUTH_MODE", None)
        os.environ.pop("RAY_AUTH_TOKEN", None)
        log.warning("Ray token authentication is not available (%s): Ray's ports are open", e)


class ClusterBackend(Protocol):
    """How a server's node agents are started, found, watched and stopped: ``LocalBackend``
    (the embedded default: one agent, a child process) or ``RayBackend`` (one Ray actor per Ray
    node). ``_Runtime`` calls, in order: ``start`` (before the event loop, in the main thread),
    ``gateway_node_id``, then on the loop ``start_agents`` (agents added to the controller),
    ``watch`` (a task until shutdown: replaces dead agents, adds nodes that join),
    ``stop_agents``; and ``close`` after the loop, always (also after a failed start)."""

    name: str

    def start(self) -> None: ...

    def gateway_node_id(self) -> str: ...

    async def start_agents(self, controller: Controller) -> int: ...

    async def watch(self, controller: Controller) -> None: ...

    async def stop_agents(self) -> None: ...

    def close(self) -> None: ...


class LocalBackend:
    """The embedded default: one node, this machine; its agent is a child process of the
    server (``node.agent_process``), reached through a ``ProcessAgentHandle`` over a private
    socket pair. No Ray, no port besides the gateway's own.

    ``start`` spawns the agent at once (it builds its token servers and starts its template
    while the server imports and wires the rest); ``start_agents`` waits for its ``NodeInfo``.
    The agent dies with the server (its death signal); when it dies first, its socket's EOF
    reaches ``watch`` at once, which tells the controller (``Controller.agent_gone``) and starts
    a new agent on the same node id (retried every ``RESPAWN_RETRY_S`` while that fails)."""

    name = "local"
    RESPAWN_RETRY_S = 1.0

    def __init__(self, rt: BackendHost) -> None:
        self.rt = rt
        self.node_id = f"local-{rt.session}-{uuid.uuid4().hex[:8]}"
        self.handle: ProcessAgentHandle | None = None
        self._spawned: tuple[subprocess.Popen[bytes], socket.socket] | None = None
        self._gone: asyncio.Queue[ProcessAgentHandle] | None = None
        self._stopping = False

    def _init_args(self) -> dict[str, object]:
        o = self.rt.opts
        return {
            "node_id": self.node_id,
            "run_dir": self.rt.run_dir,
            "store_root": self.rt.store_root,
            "launcher": o.launcher,
            "device_mem_mb": o.device_mem_mb,
            "priority_sharing": o.priority_sharing,
            "node_ip": "127.0.0.1",
        }

    def start(self) -> None:
        self._spawned = spawn_agent(self._init_args())

    def gateway_node_id(self) -> str:
        return self.node_id

    async def _open(self, timeout_s: float) -> tuple[ProcessAgentHandle, NodeInfo]:
        proc, sock = self._spawned or spawn_agent(self._init_args())  # the main thread
        self._spawned = None
        assert self._gone is not None
        handle = ProcessAgentHandle(self.node_id, proc, sock, on_gone=self._gone.put_nowait)
        self.handle = handle
        try:
            info = await handle.open(timeout_s=timeout_s)
        except BaseException:
            await handle.shutdown(timeout_s=1.0)
            raise
        return handle, info

    async def start_agents(self, controller: Controller) -> int:
        self._gone = asyncio.Queue()
        handle, info = await self._open(timeout_s=120)
        controller.add_agent(handle, info)
        return 1

    async def watch(self, controller: Controller) -> None:
        assert self._gone is not None
        while True:
            dead = await self._gone.get()
            if self._stopping or dead is not self.handle:
                continue
            log.warning("the node agent (pid %d) died: %s; starting a new one", dead.pid, dead.gone)
            await controller.agent_gone(self.node_id, AgentGone(str(dead.gone)))
            await dead.shutdown(timeout_s=1.0)  # reap it
            while not self._stopping:
                try:
                    handle, info = await self._open(timeout_s=120)
                except Exception as e:
                    log.warning("the new node agent did not start (%s); retrying", e)
                    await asyncio.sleep(self.RESPAWN_RETRY_S)
                    continue
                controller.add_agent(handle, info)
                controller.nudge()
                break

    async def stop_agents(self) -> None:
        self._stopping = True
        if self.handle is not None:
            await self.handle.shutdown()

    def close(self) -> None:
        spawned, self._spawned = self._spawned, None
        procs = [spawned[0]] if spawned else []
        if spawned:
            spawned[1].close()
        if self.handle is not None:
            procs.append(self.handle.proc)
        for proc in procs:  # an agent the loop never stopped (a failed start)
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(10)


class RayBackend:
    """Ray: a local Ray instance this server starts (``--cluster ray``, ``--launcher ray``) or
    a cluster it joins (``--address``); one ``NodeAgent`` actor per alive Ray node, pinned there
    (``NodeAffinitySchedulingStrategy``). ``watch`` looks for nodes without an agent every
    ``NODE_SCAN_S`` (a node that joined, or one whose agent died: Ray reports the death to the
    next call, ``AgentGone``). ``close`` is ``ray.shutdown()``, which stops every Ray process of
    a local instance."""

    name = "ray"

    def __init__(self, rt: BackendHost) -> None:
        self.rt = rt
        self.agents: dict[str, Any] = {}  # Ray actor handles of NodeAgent
        self.started = False

    def start(self) -> None:
        import ray  # lazy: Ray is an optional dependency

        opts = self.rt.opts
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "logging_level": logging.WARNING,
            "log_to_driver": True,
            "namespace": "gshare",
        }
        if opts.address:
            kwargs["address"] = opts.address
        else:
            kwargs["address"] = "local"
            # one machine: Ray's servers listen on loopback only; a cluster's head is started
            # with `ray start`, which chooses its own address
            kwargs["_node_ip_address"] = "127.0.0.1"
            # Ray's gRPC servers still listen on every interface (Ray cannot bind them to
            # loopback): its token authentication makes them refuse who lacks this session's
            # token (only this server's processes inherit it)
            if "RAY_AUTH_MODE" not in os.environ:
                _enable_ray_token_auth(secrets.token_hex(32))
            kwargs["num_cpus"] = opts.num_cpus or os.cpu_count() or 1
            kwargs["object_store_memory"] = max(80, opts.object_store_mb) << 20
        try:
            ray.init(**kwargs)
        except Exception as e:
            raise ServeError(
                f"cannot start Ray ({'join ' + opts.address if opts.address else 'local'}): {e}"
            ) from None
        self.started = True

    def gateway_node_id(self) -> str:
        import ray  # lazy: Ray is an optional dependency

        return str(ray.get_runtime_context().get_node_id())

    def new_agents(self, timeout_s: float = 60) -> dict[str, NodeInfo]:
        """Start an agent on every alive Ray node that has none; return their infos (blocking:
        called in a worker thread)."""
        import ray  # lazy: Ray is an optional dependency
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: Ray

        from gshare.runtime.node.agent import NodeAgent  # lazy: only Ray runs it in this process

        o = self.rt.opts
        cls = ray.remote(NodeAgent)
        started: dict[str, Any] = {}
        for n in ray.nodes():  # type: ignore[no-untyped-call]
            nid = n["NodeID"]
            if not n.get("Alive") or nid in self.agents:
                continue
            started[nid] = cls.options(
                num_cpus=0,
                max_concurrency=32,
                max_restarts=0,
                name=f"gshare-agent-{self.rt.session}-{nid[:12]}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
            ).remote(
                nid,
                self.rt.run_dir,
                None,
                self.rt.store_root,
                o.launcher,
                o.device_mem_mb,
                o.priority_sharing,
            )
        if not started:
            return {}
        infos = ray.get([a.info.remote() for a in started.values()], timeout=timeout_s)
        self.agents.update(started)
        return dict(zip(started, infos, strict=True))

    async def start_agents(self, controller: Controller) -> int:
        infos = await asyncio.to_thread(self.new_agents, 120)
        for nid, info in infos.items():
            controller.add_agent(RayAgentHandle(nid, self.agents[nid]), info)
        return len(infos)

    async def watch(self, controller: Controller) -> None:
        import ray  # lazy: Ray is an optional dependency

        while True:
            await asyncio.sleep(NODE_SCAN_S)
            try:
                for nid in controller.dead_agents():  # replace a dead agent
                    old = self.agents.pop(nid, None)
                    if old is not None:
                        log.warning("the agent of node %s died; starting a new one", nid[:8])
                        with contextlib.suppress(Exception):
                            ray.kill(old, no_restart=True)
                for nid, info in (await asyncio.to_thread(self.new_agents)).items():
                    controller.add_agent(RayAgentHandle(nid, self.agents[nid]), info)
                    log.info("node %s joined: agent started (%s)", nid[:8], ", ".join(info.devices))
            except Exception as e:  # a node that fails to start an agent is retried later
                log.warning("node scan: %s", e)

    async def stop_agents(self) -> None:
        await asyncio.to_thread(self._stop_agents)

    def _stop_agents(self) -> None:
        import ray  # lazy: Ray is an optional dependency

        refs = []
        for a in self.agents.values():
            with contextlib.suppress(Exception):
                refs.append(a.shutdown.remote())
        with contextlib.suppress(Exception):
            ray.get(refs, timeout=30)
        for a in self.agents.values():
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self.agents.clear()

    def close(self) -> None:
        if not self.started:
            return
        import ray  # lazy: Ray is an optional dependency

        if self.agents:  # the loop never stopped them (a failed start)
            self._stop_agents()
        with contextlib.suppress(Exception):
            ray.shutdown()
        self.started = False


def cluster_backend(opts: ServeOptions) -> str:
    """Which backend ``opts`` asks for: ``ray`` with ``--address``, ``--cluster ray`` or
    ``--launcher ray`` (each instance a Ray actor), else ``local``. A contradiction, an unknown
    name, or Ray asked for but not installed is a ``ServeError`` with one line."""
    if opts.cluster not in (None, *CLUSTERS):
        raise ServeError(f"unknown cluster {opts.cluster!r} (known: {', '.join(CLUSTERS)})")
    wants_ray = [
        why
        for why, on in (
            ("--address", bool(opts.address)),
            ("--launcher ray", opts.launcher == "ray"),
            ("--cluster ray", opts.cluster == "ray"),
        )
        if on
    ]
    if opts.cluster == "local" and wants_ray:
        raise ServeError(f"{wants_ray[0]} needs Ray; it cannot be used with --cluster local")
    if not wants_ray:
        return "local"
    try:
        import ray  # noqa: F401 - the Ray backend needs it anyway
    except ImportError:
        raise ServeError(
            f"{wants_ray[0]} needs Ray, which is not installed: "
            "pip install 'gshare[cluster]' (or serve on one machine without it)"
        ) from None
    return "ray"


__all__ = [
    "CLUSTERS",
    "BackendHost",
    "NODE_SCAN_S",
    "ClusterBackend",
    "LocalBackend",
    "RayBackend",
    "ServeError",
    "cluster_backend",
]
