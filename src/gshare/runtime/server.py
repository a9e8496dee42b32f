"""``gshare serve``: one process that runs the gateway and the controller, and its node agents
— embedded (one machine, no Ray: the default) or on Ray (``--cluster ray``, ``--address``).

Processes (docs/DESIGN.md §5)::

    gshare serve (this process)
      ├─ uvicorn + FastAPI gateway ─┐ one asyncio loop
      ├─ grpc.aio, with --grpc-port ┤ (the gateway's gRPC API, same OipService)
      ├─ controller ────────────────┘ (policy.control + placement every second; SQLite state)
      └─ ClusterBackend: how node agents start, are found, watched and stopped
           local (default): one node agent, a child process (socket pair, death signal)
           ray: a local Ray instance (--cluster ray) or a cluster (--address); one agent
                actor per Ray node, pinned with NodeAffinitySchedulingStrategy
           └─ node agent: token server per device (UDS), model store, instance lifecycle, MPS
                └─ instance template (--launcher fork, the default) forks the instances on
                   the node the placer chose (--launcher ray: one Ray actor each):
                     batching + token client + model; a UDS/TCP server for the gateway

``runtime.wiring`` builds the server's objects (gateway, controller, stage scheduler, control
API, OIP service) the same way for both backends. ``run_server`` binds the HTTP socket first (a
busy port — HTTP's or ``--grpc-port``'s — fails at once), starts the backend (Ray, or the
agent's process), builds the objects, and in the app's startup waits for the agents, restores
the deployed functions and serves until SIGINT or SIGTERM. Shutdown, in order: stop accepting
(gRPC calls in flight get the same grace as HTTP requests), answer everything queued or in
flight with 503, stop the controller and every instance, shut the agents down (token
servers, model store, run directory), and close the backend — ``ray.shutdown()`` stops every
Ray process of a local instance; the embedded agent has exited by then. Nothing is left
behind. ``state_dir/server.json`` tells clients where the server listens while it runs
(``url``; ``grpc``: host:port with gRPC; ``cluster``: local or ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import glob
import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import psutil

from gshare.runtime.backends import (
    CLUSTERS,
    ClusterBackend,
    LocalBackend,
    RayBackend,
    ServeError,
    cluster_backend,
)
from gshare.runtime.instance.oscap import SESSION_ENV, remove_session_cgroups
from gshare.runtime.instance.sandbox import HIDE_ENV
from gshare.runtime.instance.walls import UID_BASE, UID_SPAN, kill_session
from gshare.runtime.options import DEFAULT_HOST, DEFAULT_PORT, ServeOptions

if TYPE_CHECKING:  # the server's objects are built (and their modules imported) at ``serve``
    import uvicorn

    from gshare.runtime.control.state import StateStore
    from gshare.runtime.gateway.grpc_server import GrpcServer
    from gshare.runtime.gateway.oip_service import OipService
    from gshare.runtime.wiring import ServerObjects

log = logging.getLogger("gshare.server")

SERVER_FILE = "server.json"
"""In the state directory while a server runs: its URL, pid, session, run directory, model
store and cluster backend (and ``grpc``, its gRPC address); ``gshare`` commands find the server
by it, and the next start reclaims what a killed one left (``reclaim_stale_server``)."""


def reclaim_stale_server(state_dir: Path) -> None:
    """Before a start: refuse when another live server uses ``state_dir``; when the last one
    was killed without stopping (``kill -9``), reclaim what it left — its processes (found by
    ``SESSION_ENV``: Ray's, the node agents, templates, instances), its run directory, its
    shared-memory model store and ``server.json``. Called by ``run_server``."""

    path = state_dir / SERVER_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    pid = doc.get("pid") if isinstance(doc, dict) else None
    if isinstance(pid, int) and pid != os.getpid() and psutil.pid_exists(pid):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(psutil.Process(pid).cmdline())
            if "gshare" in cmd:
                raise ServeError(
                    f"another gshare server (pid {pid}, {doc.get('url')}) uses the state "
                    f"directory {state_dir}; stop it first, or use --state"
                )
    session = doc.get("session") if isinstance(doc, dict) else None
    victims: list[psutil.Process] = []
    if isinstance(session, str) and session:
        me = os.getuid()

        def ours(uid: int) -> bool:  # ours, or a tenant's instance behind the walls
            return uid == me or (me == 0 and UID_BASE <= uid < UID_BASE + UID_SPAN)

        for p in psutil.process_iter(["uids"]):
            try:
                if p.pid == os.getpid() or p.info["uids"] is None or not ours(p.info["uids"].real):
                    continue
                if p.environ().get(SESSION_ENV) == session:
                    p.kill()
                    victims.append(p)
            except psutil.Error:
                continue
        psutil.wait_procs(victims, timeout=10)  # gone before their files are removed
        kill_session(session)  # what tenants started, in their instances' cgroups (walls)
        remove_session_cgroups(session)  # the instances' memory cgroups
    uid = os.getuid()
    for key, prefix in (
        ("run_dir", os.path.join(tempfile.gettempdir(), f"gshare-{uid}") + os.sep),
        ("store_root", f"/dev/shm/gshare-{uid}-"),
    ):
        target = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(target, str) and target.startswith(prefix):  # only what we create
            shutil.rmtree(target, ignore_errors=True)
            for per_node in glob.glob(glob.escape(target) + "-*"):  # the agents' stores
                shutil.rmtree(per_node, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.unlink()
    log.warning(
        "reclaimed what a server that did not stop left (pid %s, session %s): %d processes, "
        "its run directory and model store",
        pid,
        session,
        len(victims),
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit TCP_NODELAY (Linux): uvicorn writes a response's headers
    # and body separately, and with Nagle the body of every response after the first on a
    # keep-alive connection waits for the client's delayed ACK (~40 ms).
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def run_server(opts: ServeOptions) -> None:
    """Run ``gshare serve`` until a signal (see the module doc). Raises ``ServeError``."""
    # lazy, here and below: gshare.testing and the CLI import this module for its options and
    # names; uvicorn and the server's own modules (wiring: FastAPI, ~0.9 s) load to serve
    import uvicorn

    from gshare.policy.autoscale import AUTOSCALERS
    from gshare.policy.placement import PLACERS
    from gshare.runtime.control.state import StateStore, ensure_token, resolve_state_dir
    from gshare.runtime.gateway.http_protocol import guarded_protocol
    from gshare.runtime.node.launcher import LAUNCHERS

    if opts.placer not in PLACERS:
        raise ServeError(f"unknown placer {opts.placer!r} (known: {', '.join(sorted(PLACERS))})")
    if opts.autoscaler not in AUTOSCALERS:
        raise ServeError(
            f"unknown autoscaler {opts.autoscaler!r} (known: {', '.join(sorted(AUTOSCALERS))})"
        )
    from gshare.runtime.gateway.stages import WORKFLOW_POLICY_NAMES  # lazy (run_server)

    if opts.workflow_policy not in (*WORKFLOW_POLICY_NAMES, "direct"):
        raise ServeError(
            f"unknown workflow policy {opts.workflow_policy!r} "
            f"(known: {', '.join(WORKFLOW_POLICY_NAMES)}, direct)"
        )
    if opts.launcher not in LAUNCHERS:
        raise ServeError(f"unknown launcher {opts.launcher!r} (known: {', '.join(LAUNCHERS)})")
    if opts.priority_sharing not in ("fikit", "tokens"):
        raise ServeError(
            f"unknown priority sharing {opts.priority_sharing!r} (known: fikit, tokens)"
        )
    cluster_backend(opts)  # an unknown --cluster, or Ray asked for but not installed
    logging.basicConfig(
        level=getattr(logging, opts.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    state_dir = resolve_state_dir(opts.state)
    try:
        store = StateStore.open(state_dir)
        token = ensure_token(state_dir)
    except OSError as e:
        raise ServeError(f"cannot use state directory {state_dir}: {e.strerror or e}") from None
    except sqlite3.DatabaseError as e:
        raise ServeError(
            f"the state database {state_dir / 'gshare.db'} is unreadable ({e}); move it away to "
            "start with an empty state, or point --state at another directory"
        ) from None
    reclaim_stale_server(state_dir)
    sock = _bind(opts.host, opts.port)
    if opts.grpc_port:  # fail at once, before the agents start (the gRPC server binds it later)
        try:
            _bind(opts.host, opts.grpc_port).close()
        except ServeError as e:
            sock.close()
            raise ServeError(f"gRPC port: {e}") from None
    port = sock.getsockname()[1]
    url = f"http://{opts.host if ':' not in opts.host else '[' + opts.host + ']'}:{port}"

    stop = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def early(sig: int, _frame: FrameType | None) -> None:
        stop.set()  # a signal while the backend starts: stop after it

    for s in previous:
        signal.signal(s, early)
    runtime: _Runtime | None = None
    try:
        runtime = _Runtime(opts, store, token, state_dir)
        runtime.backend.start()  # Ray's start, or the agent's spawn (this, the main, thread)
        for s in previous:  # ray.init installs its own SIGTERM handler
            signal.signal(s, early)
        if stop.is_set():
            return
        app = runtime.build(url)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            # the loop is asyncio.run's below (uvicorn's loop option applies only to its own
            # run()); uvloop measured faster on HTTP but not on gRPC: docs/journal/oip.md
            loop="asyncio",
            http=guarded_protocol(
                opts.read_timeout_s,
                opts.max_connections,
                max_connections_per_client=opts.max_connections_per_client,
                write_timeout_s=opts.write_timeout_s,
            ),
        )
        server = _uvicorn_server(config)
        server.should_exit = stop.is_set()
        (state_dir / SERVER_FILE).write_text(
            json.dumps(
                {
                    "url": url,
                    "pid": os.getpid(),
                    "session": runtime.session,
                    "run_dir": runtime.run_dir,
                    "store_root": runtime.store_root,
                    "cluster": runtime.backend.name,
                }
            )
        )
        asyncio.run(server.serve(sockets=[sock]))
        if runtime.startup_error:
            raise ServeError(runtime.startup_error)
    finally:
        for s in previous:
            with contextlib.suppress(Exception):
                signal.signal(s, signal.SIG_IGN)
        try:
            if runtime is not None:
                runtime.shutdown()
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError):
                (state_dir / SERVER_FILE).unlink()
            store.close()
            for s, h in previous.items():
                with contextlib.suppress(Exception):
                    signal.signal(s, h)
        print("gshare: stopped", file=sys.stderr, flush=True)


def _uvicorn_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn.Server whose signal handlers only ask it to exit (uvicorn's own re-raise the
    signal after shutdown, which would kill the process before Ray is shut down)."""
    import uvicorn  # lazy: the CLI imports this module for its options

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return

            def handle(sig: int, _frame: FrameType | None) -> None:
                if self.should_exit and sig == signal.SIGINT:
                    self.force_exit = True
                self.should_exit = True

            old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    return Server(config)


class _Runtime:
    """The agents (through a ``ClusterBackend``), gateway and controller of one server."""

    def __init__(self, opts: ServeOptions, store: StateStore, token: str, state_dir: Path) -> None:
        self.opts = opts
        self.store = store
        self.token = token
        self.state_dir = state_dir
        self.session = uuid.uuid4().hex[:8]
        # Every process of this server (Ray's, the agents', templates, instances) inherits it,
        # so the next start can find them if this one is killed (reclaim_stale_server).
        os.environ[SESSION_ENV] = self.session
        # ... and the instances among them hide the state directory from handlers
        os.environ[HIDE_ENV] = str(state_dir.resolve())
        uid = os.getuid()
        self.run_dir = os.path.join(tempfile.gettempdir(), f"gshare-{uid}", self.session)
        self.store_root = (
            f"/dev/shm/gshare-{uid}-{self.session}" if os.path.isdir("/dev/shm") else None
        )
        self.backend: ClusterBackend = (
            RayBackend(self) if cluster_backend(opts) == "ray" else LocalBackend(self)
        )
        self.objects: ServerObjects | None = None
        """What ``build`` wired (None before)."""
        self.startup_error: str | None = None
        """Why the app's startup failed (uvicorn then exits quietly; ``run_server`` raises)."""

    def build(self, url: str) -> Any:
        """The server's objects (``runtime.wiring``) and its ASGI app, whose lifespan starts
        the agents, the controller and the backend's watch, and stops them in order."""
        # lazy: FastAPI and the server's modules load to serve (run_server)
        from gshare.runtime.wiring import build_server_objects, http_app

        objs = build_server_objects(
            self.opts,
            self.store,
            gateway_node_id=self.backend.gateway_node_id(),
            extra_sys_path=(os.getcwd(),),
        )
        self.objects = objs
        controller, gateway, backend = objs.controller, objs.gateway, self.backend

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any) -> AsyncIterator[None]:
            try:
                nodes = await backend.start_agents(controller)
            except Exception as e:
                self.startup_error = f"node agents did not start: {e}"
                raise
            await controller.start()
            watcher = asyncio.create_task(backend.watch(controller), name="gshare-agents")
            grpc_server = None
            stop_watching_collector: Callable[[], None] | None = None
            try:
                if self.opts.grpc_port is not None:
                    grpc_server = await self.start_grpc(objs.oip, objs.gateway.max_body_bytes)
                log.info("froze %d objects of the startup heap", freeze_startup_heap())
                stop_watching_collector = objs.gateway.metrics.watch_collector()
                print(
                    f"gshare: serving on {url} (state {self.state_dir}, {nodes} node(s), "
                    f"{'Ray' if backend.name == 'ray' else 'embedded, no Ray'})",
                    file=sys.stderr,
                    flush=True,
                )
                yield
            finally:
                watcher.cancel()
                if stop_watching_collector is not None:
                    stop_watching_collector()
                if grpc_server is not None:  # RPCs in flight get the grace HTTP gets
                    await grpc_server.stop(5.0)
                log.info("stopping the controller and every instance")
                gateway.fail_all(503, "the server is shutting down")
                objs.oip.close()  # every shared-memory region unmapped
                for name in list(objs.profiler.jobs):
                    objs.profiler.cancel(name)
                await controller.stop()
                log.info("shutting down the node agents")
                await backend.stop_agents()

        return http_app(objs, self.token, lifespan)

    async def start_grpc(self, oip: OipService, max_message_bytes: int) -> GrpcServer:
        """The gRPC server on ``--grpc-port`` (the gateway's loop); its address goes to
        ``server.json`` as ``grpc``."""
        # lazy: grpc loads only with --grpc-port
        from gshare.runtime.gateway.grpc_server import start_grpc_server

        assert self.opts.grpc_port is not None
        try:
            srv = await start_grpc_server(
                oip,
                self.opts.host,
                self.opts.grpc_port,
                max_message_bytes=max_message_bytes,
            )
        except OSError as e:
            self.startup_error = str(e)
            raise
        path = self.state_dir / SERVER_FILE
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
            doc["grpc"] = srv.address
            tmp = path.with_name(SERVER_FILE + ".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(path)
        print(f"gshare: gRPC (KServe v2 / Triton) on {srv.address}", file=sys.stderr, flush=True)
        return srv

    def shutdown(self) -> None:
        """After the loop (or a failed start): stop what is left of the backend (Ray), then
        remove the run directory and the model stores (a dead agent's too)."""
        t0 = time.monotonic()
        self.backend.close()
        log.info("backend %s closed (%.1f s)", self.backend.name, time.monotonic() - t0)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.store_root:  # the agents remove theirs; what a dead agent left goes too
            for d in [self.store_root, *glob.glob(glob.escape(self.store_root) + "-*")]:
                shutil.rmtree(d, ignore_errors=True)


def freeze_startup_heap() -> int:
    """Collect once and move everything the server holds after its startup (modules, FastAPI,
    pydantic's schemas, the restored deployments) into the collector's permanent generation;
    returns how many objects were frozen. Who calls: the app's lifespan, once, before it serves.

    NOTE — the gateway's full collections. Under ``mlp-chain``'s load (10 workflows and 20 calls
    a second) the server paused 39-43 ms in a full (generation 2) collection about every 85 s,
    scanning the whole startup heap, and every request in flight waited for it: three workflows
    at 40-67 ms against a 7-ms median, at the same second of every run (``bench/fidelity.py``
    found them as the calibrations' p99). Frozen objects are never scanned again; the
    collector stays on for what serving allocates."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


__all__ = [
    "CLUSTERS",
    "ClusterBackend",
    "DEFAULT_HOST",
    "LocalBackend",
    "RayBackend",
    "DEFAULT_PORT",
    "SERVER_FILE",
    "ServeError",
    "ServeOptions",
    "cluster_backend",
    "freeze_startup_heap",
    "run_server",
]
