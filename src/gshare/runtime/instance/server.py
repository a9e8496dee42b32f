"""A function instance: one process serving one function with one GPU share.

Who creates it: the node agent of the node the placement policy chose
(``NodeAgent.start_instance``): a process forked from the node's instance template
(``node.launcher``, the default) or a Ray actor pinned to that node (``--launcher ray``). Its
``__init__`` does the whole cold start, in this order (FaST-GShare §3.3, Fig. 5a):

1. spatial partition — CPU: core affinity + intra-op threads (``partition.apply_cpu_partition``);
   CUDA: the MPS thread percentage was put in the process's environment by the agent before
   the process started, so it holds before the CUDA context exists;
2. the model — ``loading.make_handler(spec)`` and ``handler.load(weights, device)`` where the
   weights are the node's shared read-only copy (``ModelStore.get``, put there by the agent);
3. the time-token client (``TokenClient``) on the device's token-server socket;
4. the data-path server: a Unix-domain socket (and a TCP port when the gateway runs on another
   node) speaking ``instance.protocol``; plus the batching thread and the memory watchdog.

Data path: frames arrive on an asyncio loop (IO thread) and are queued; the batching thread takes up
to ``max_batch`` requests, waiting at most ``max_wait_ms`` after the first for more (a full batch
goes at once: ``policy.batching.next_batch``, the simulator's rule), asks the token server for a
token (``acquire``), runs ``handler.predict`` on the batch, and sends the responses with per-request
metrics (queue wait, token wait, busy time, batch size). A batch whose ``predict`` raises is re-run
one request at a time so that one bad input fails alone. Token reuse (Gemini: a token is a time
slice): while the next batch can start at once (``policy.batching.keep_token_for_next_batch``) the
instance keeps its token and runs that batch on it if the token's rest fits the predicted batch
(``policy.tokens.reuse_token``), else releases it and acquires another; when the queue has no batch
ready it releases the token (``idle``) with the busy time of all the batches it ran, so the protocol
is paid once per token under load, not once per batch.

Preemption points (FaST-GShare §3.3.2's hook library, at the framework level): FaST's
frontend intercepts every kernel launch and asks for a new token once the one it holds is
consumed, so no client runs far past its token. A CPU burst (one ``predict``) can take longer
than a whole token window, so the instance installs a global torch forward pre-hook: before
every ``nn.Module`` call inside a burst it checks the token, and when it is used up releases
it (``completed=False``, charging the time used) and blocks for the next one before the module
runs. A burst therefore overruns its token by at most one module's forward, and bursts of two
instances interleave at layer granularity. Handlers that do not use torch modules are
preempted only between batches.

Priority classes (FIKIT, ``instance.fikit``; when the device's board is in FIKIT mode): the
same preemption point reads the board's top active class (one 8-byte load); below it, the
instance gives its token back and holds the op — as a fill into a higher class's predicted idle
gap when BestPrioFit picks it, else until its class may run (the token server holds its
ACQUIRE). Its first T batches are measured (each leaf module's span: the function's kernel
profile, kept by the controller; ``kernel_profile`` in the launch skips it).

Memory limit (``mem_mb`` > 0 or resource-centric sizing, CPU; ``instance.memory``): the limit is
on the memory the instance's model uses, as on a GPU where it caps the allocator and excludes
the CUDA context: the process's private resident memory (the shared model weights do not count)
above the *baseline* — the private RSS once the runtime (Python, torch) is imported, before the
model loads. ``MemoryGovernor`` measures each batch's peak, and its watchdog grows the limit by
steps from the device's memory ledger when a request needs more (resource-centric sizing) or,
for a fixed limit or a refused grow that cannot be interrupted, answers every queued and
running request with ``ST_MEMORY_LIMIT`` naming the limit, writes the reason next to its socket
(the agent logs it) and exits; the agent restarts it. A refused grow of a torch handler fails
only the request that needed it, at its next module call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from gshare.policy.batching import keep_token_for_next_batch, next_batch
from gshare.policy.memory import MemoryPlan
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.memory import MemoryGovernor, MemoryLimitExceeded
from gshare.runtime.instance.oscap import SLACK_MB, is_memory_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceLaunch:
    """Everything an instance needs to start; built by the controller, completed by the agent
    (socket paths, model key), pickled to the actor. Plain data."""

    instance_id: str
    function: str
    spec: dict[str, Any]
    """The function spec (``FunctionSpec.model_dump(mode="json")``)."""
    sm_pct: float
    quota_request: float
    quota_limit: float
    mem_mb: float
    """The memory limit the instance starts with, MiB (0: none): a fixed limit, or the
    ``init`` of resource-centric sizing when ``mem_step_mb`` > 0."""
    priority: int
    max_batch: int
    max_wait_ms: float
    device: str = "cpu"
    """``cpu`` or ``cuda:N``."""
    device_index: int = 0
    sm_offset_pct: float = 0.0
    """Start of the instance's SM band (the placement rectangle's y)."""
    token_socket: str = ""
    token_secret: str = ""
    """This instance's credential on the token socket (the agent draws it; never in the
    environment, so other processes of the user cannot read it from ``/proc``)."""
    uds_path: str = ""
    listen_tcp: bool = False
    tcp_host: str = "0.0.0.0"
    """The address the TCP listener binds (the node's own address, from the controller)."""
    channel_secret: str = ""
    """What a TCP connection must present first (``OP_AUTH``); set whenever ``listen_tcp``."""
    """Also listen on TCP (the gateway runs on another node)."""
    model_key: str | None = None
    """Key of the shared weights in the node's ``ModelStore`` (None: the handler has none)."""
    store_root: str | None = None
    incarnation: int = 0
    """0 for the first start, +1 for every restart by the agent."""
    mem_step_mb: float = 0.0
    """Resource-centric sizing (``instance.memory``): grow the limit by this much when a
    request needs more (0: the limit is fixed)."""
    mem_max_mb: float = 0.0
    """... up to this much (0: as much as the device's memory ledger grants)."""
    extra_sys_path: tuple[str, ...] = ()
    """Folders to put on ``sys.path`` before importing a ``handler: module:Class``."""
    env: dict[str, str] = field(default_factory=dict)
    kernel_profile: dict[str, Any] | None = None
    """The function's FIKIT kernel profile from the state database (``KernelProfile.to_records``;
    None: the instance measures its first batches, ``instance.fikit``)."""


@dataclass
class _Item:
    req_id: int
    op: int
    enc: int
    payload: bytes
    writer: _Conn
    arrived: float
    ctx: Any = None
    """An OIP request's context (``gateway.oip_codec.OipCall``), from ``_decode`` to ``_encode``."""


class _Conn(asyncio.Protocol):
    """One gateway connection on the instance's IO loop."""

    def __init__(self, server: InstanceServer, secret: str = "") -> None:
        self.server = server
        self.reader = P.FrameReader(P.REQ_FIXED)
        self.transport: asyncio.Transport | None = None
        self.secret = secret.encode()
        """Non-empty on a TCP connection until its ``OP_AUTH`` frame proved it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        P.set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.ProtocolError:
            if self.transport:
                self.transport.close()
            return
        now = time.perf_counter()
        srv = self.server
        items: list[_Item] = []
        for f in frames:
            req_id, op, enc = P.REQ_REST.unpack_from(f)
            payload = f[P.REQ_FIXED :]
            if self.secret:  # a TCP connection: the first frame must prove the secret
                if op != P.OP_AUTH or not hmac.compare_digest(bytes(payload), self.secret):
                    log.warning("instance: a TCP connection did not authenticate; closed")
                    if self.transport:
                        self.transport.close()
                    return
                self.secret = b""
                continue
            if op == P.OP_AUTH:
                continue
            if op == P.OP_CONTROL:
                self.write(srv.control(req_id, payload))
            elif op == P.OP_CANCEL:
                if srv.cancel(self, req_id):
                    self.write(P.encode_response(req_id, P.ST_CANCELLED, P.ENC_RAW, b"cancelled"))
            elif srv.draining:
                self.write(P.encode_response(req_id, P.ST_DRAINING, P.ENC_RAW, b"draining"))
            else:
                items.append(_Item(req_id, op, enc, payload, self, now))
        if items:
            srv.enqueue(items)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, bytes | bytearray):
        return o.decode("utf-8", errors="replace")
    if isinstance(o, set | tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _private_rss_mb(proc: Any) -> float:
    mi = proc.memory_info()
    shared = int(getattr(mi, "shared", 0))
    return float(max(0, int(mi.rss) - shared)) / (1 << 20)


class InstanceServer:
    """The instance's machinery (see the module doc). ``InstanceActor`` wraps it for Ray; it
    can also run in a plain process."""

    def __init__(self, launch: InstanceLaunch) -> None:
        self.launch = launch
        self.started_s = time.time()
        self.draining = False
        self.max_batch = max(1, launch.max_batch)
        self.max_wait_s = max(0.0, launch.max_wait_ms) / 1000.0
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._running: list[_Item] = []
        self._stop = threading.Event()
        self._dead = False
        self.stats = {"requests": 0, "batches": 0, "busy_ms": 0.0, "token_wait_ms": 0.0}
        for k, v in launch.env.items():
            os.environ[k] = v
        import sys

        for p in launch.extra_sys_path:
            if p not in sys.path:
                sys.path.insert(0, p)

        # 1. spatial partition, before torch creates its thread pools.
        self.cores: list[int] = []
        if launch.device == "cpu":
            from gshare.runtime.node.partition import apply_cpu_partition

            self.cores = list(
                apply_cpu_partition(launch.sm_pct, sm_offset_pct=launch.sm_offset_pct)
            )
        # 1b. the GPU frontend: the driver-API interposer, when the agent preloaded it, gates
        # every kernel launch on this instance's tokens and caps its memory (runtime.native).
        native_tokens = False
        if launch.device.startswith("cuda"):
            from gshare.runtime.native import configure_interposer

            cap_mb = launch.mem_mb if launch.mem_step_mb <= 0 else launch.mem_max_mb
            native_tokens = configure_interposer(
                launch.token_socket, launch.instance_id, launch.token_secret, cap_mb
            )
        # 2. model.
        from gshare.runtime.instance.loading import make_handler
        from gshare.spec import load_function_spec

        self.baseline_mb = 0.0
        governed = (launch.mem_mb > 0 or launch.mem_step_mb > 0) and launch.device == "cpu"
        if governed:
            import psutil

            self.baseline_mb = _private_rss_mb(psutil.Process())  # torch is imported now
        # the kernel's hard cap under the governor's soft limit (instance.oscap)
        self.os_cap: Any = None
        plan = MemoryPlan(launch.mem_mb, launch.mem_step_mb, launch.mem_max_mb)
        if governed and math.isfinite(plan.cap_mb):
            from gshare.runtime.instance.oscap import apply_memory_cap

            self.os_cap = apply_memory_cap(plan.cap_mb)
            if self.os_cap.detail:
                log.warning("memory cap: %s", self.os_cap.detail)
        # the handler may not read the server's state (its control token): instance.sandbox
        from gshare.runtime.instance.sandbox import HIDE_ENV, SandboxState, hide_paths, tmp_dir

        hide = [p for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]
        self.sandbox = hide_paths(hide, tmp_dir(os.path.dirname(launch.uds_path) or "."))
        if self.sandbox.state is SandboxState.UNAVAILABLE:
            log.warning("the state directory is not hidden: %s", self.sandbox.detail)

        self.spec = load_function_spec(launch.spec)
        self.handler: Any = make_handler(self.spec)
        weights = None
        if launch.model_key:
            from gshare.runtime.node.model_store import ModelStore

            store = ModelStore(launch.store_root) if launch.store_root else ModelStore()
            weights = store.get(launch.model_key, device=launch.device)
        if launch.device.startswith("cuda") and launch.mem_mb > 0:
            import torch

            from gshare.runtime.node.partition import set_cuda_memory_fraction

            total_mb = torch.cuda.get_device_properties(launch.device).total_memory / (1 << 20)
            set_cuda_memory_fraction(min(1.0, launch.mem_mb / total_mb))
        self.handler.load(weights, launch.device)
        self.input_spec: list[Any] = []
        if hasattr(self.handler, "input_spec"):
            with contextlib.suppress(Exception):
                self.input_spec = list(self.handler.input_spec() or [])
        self.output_spec: list[Any] = []
        if hasattr(self.handler, "output_spec"):
            with contextlib.suppress(Exception):
                self.output_spec = list(self.handler.output_spec() or [])
        self._takes_parameters = _takes_parameters(self.handler)
        # 3. token client, and the preemption points inside a burst.
        from gshare.runtime.native import NativeTokens
        from gshare.runtime.tokens import TokenClient

        self.tokens: TokenClient | NativeTokens
        if native_tokens:  # the interposer holds this instance's one token connection
            self.tokens = NativeTokens()
        else:
            self.tokens = TokenClient(
                launch.token_socket, launch.instance_id, secret=launch.token_secret or None
            )
        self._in_burst = False
        self._worker_ident = -1
        self._seg_start = self._busy_s = self._rewait_s = 0.0
        import sys as _sys

        if "torch" in _sys.modules and not native_tokens:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._hook = register_module_forward_pre_hook(self._token_hook)
        # FIKIT across priority classes, when the device's board says so (instance.fikit).
        self._fikit: Any = None
        self._fikit_filling = False
        if "torch" in _sys.modules:
            self._fikit = _open_fikit(launch)
        # 4. data path.
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.AbstractServer] = []
        self.tcp_port: int | None = None
        ready = threading.Event()
        errors: list[BaseException] = []
        self._io = threading.Thread(
            target=self._io_main, args=(ready, errors), name="gshare-io", daemon=True
        )
        self._io.start()
        ready.wait(30)
        if errors:
            raise RuntimeError(f"instance {launch.instance_id}: cannot listen: {errors[0]}")
        self._worker = threading.Thread(target=self._batch_loop, name="gshare-batch", daemon=True)
        self._worker.start()
        self._mem: MemoryGovernor | None = None
        self._mem_channel: Any = None
        self._mem_aborted = False
        if governed:
            self._mem = MemoryGovernor(
                launch.instance_id,
                MemoryPlan(launch.mem_mb, launch.mem_step_mb, launch.mem_max_mb),
                self.baseline_mb,
                launch.uds_path + ".mem",
                ask=self._ask_memory,
                over_max=self._over_max,
                die=self._die_over_limit,
                idle=self._is_idle,
            )
            threading.Thread(target=self._mem.run, name="gshare-mem", daemon=True).start()

    # -- info --------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What the agent reports once the instance is ready."""
        from gshare.runtime.gateway.oip import input_spec_dicts

        return {
            "pid": os.getpid(),
            "uds_path": self.launch.uds_path,
            "tcp_port": self.tcp_port,
            "cores": self.cores,
            "inputs": input_spec_dicts(self.input_spec),
            "incarnation": self.launch.incarnation,
        }

    # -- IO loop ------------------------------------------------------------------------------

    def _io_main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            path = self.launch.uds_path
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            srv = self._loop.run_until_complete(
                self._loop.create_unix_server(lambda: _Conn(self), path=path, backlog=256)
            )
            self._servers.append(srv)
            if self.launch.listen_tcp:
                if not self.launch.channel_secret:
                    raise RuntimeError("a TCP listener needs a channel secret")
                secret = self.launch.channel_secret
                tcp = self._loop.run_until_complete(
                    self._loop.create_server(
                        lambda: _Conn(self, secret), host=self.launch.tcp_host, port=0
                    )
                )
                self._servers.append(tcp)
                self.tcp_port = tcp.sockets[0].getsockname()[1]
        except BaseException as e:  # reported to __init__
            errors.append(e)
            ready.set()
            return
        ready.set()
        self._loop.run_forever()

    def _send(self, out: list[tuple[_Conn, bytes]]) -> None:
        """Write responses from the batching thread (one loop wake-up per batch)."""
        if not out or self._loop.is_closed():
            return

        def write_all() -> None:
            for conn, data in out:
                conn.write(data)

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(write_all)

    def cancel(self, conn: _Conn, req_id: int) -> bool:
        """Drop a queued request of ``conn`` (``OP_CANCEL``, on the IO thread); False when it
        is not queued (running already, or answered)."""
        with self._cond:
            for it in self._queue:
                if it.req_id == req_id and it.writer is conn:
                    self._queue.remove(it)
                    return True
        return False

    def enqueue(self, items: list[_Item]) -> None:
        with self._cond:
            self._queue.extend(items)
            self._cond.notify()

    def control(self, req_id: int, payload: bytes) -> bytes:
        """An ``OP_CONTROL`` command, answered on the IO thread."""
        try:
            cmd = json.loads(payload or b"{}")
            name = cmd.get("cmd")
            if name == "set_batching":
                with self._cond:
                    self.max_batch = max(1, int(cmd.get("max_batch", self.max_batch)))
                    self.max_wait_s = max(0.0, float(cmd.get("max_wait_ms", 0.0))) / 1000.0
                    self._cond.notify()
                reply: dict[str, Any] = {"ok": True}
            elif name == "set_memory":
                if self._mem is None:
                    raise ValueError("the instance has no memory limit")
                self._mem.set_plan(
                    MemoryPlan(
                        float(cmd["init_mb"]), float(cmd["step_mb"]), float(cmd.get("max_mb", 0))
                    )
                )
                reply = {"ok": True}
            elif name == "drain":
                self.draining = True
                reply = {"ok": True}
            elif name == "kernel_profile":
                fk = self._fikit
                reply = (
                    {"phase": "off"}
                    if fk is None
                    else fk.report(with_profile=bool(cmd.get("profile", False)))
                )
            elif name == "stats":
                with self._cond:
                    reply = {
                        **self.stats,
                        "queued": len(self._queue),
                        "running": len(self._running),
                    }
            else:
                return P.encode_response(
                    req_id, P.ST_BAD_INPUT, P.ENC_RAW, f"unknown command {name!r}".encode()
                )
            return P.encode_response(req_id, P.ST_OK, P.ENC_JSON, json.dumps(reply).encode())
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            return P.encode_response(
                req_id, P.ST_BAD_INPUT, P.ENC_RAW, f"bad control frame: {e}".encode()
            )

    # -- batching ------------------------------------------------------------------------------

    def _take_batch(self) -> list[_Item] | None:
        with self._cond:
            while not self._queue:
                if self._stop.is_set():
                    return None
                self._cond.wait(0.5)
            while True:
                d = next_batch(*self._queue_now())
                if d.take > 0 or self._stop.is_set():
                    break
                assert d.deadline_ms is not None  # the queue is not empty
                self._cond.wait(max(0.0, d.deadline_ms / 1000.0 - time.perf_counter()))
            n = min(self.max_batch, len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            self._running = batch
            return batch

    def _queue_now(self) -> tuple[int, float | None, float, int, float]:
        """The arguments of ``policy.batching`` for the queue now (call with ``_cond`` held):
        length, oldest arrival, clock, ``max_batch`` and ``max_wait`` (milliseconds)."""
        q = self._queue
        oldest_ms = q[0].arrived * 1000.0 if q else None
        return (
            len(q),
            oldest_ms,
            time.perf_counter() * 1000.0,
            self.max_batch,
            self.max_wait_s * 1000.0,
        )

    def _decode(self, item: _Item) -> Any:
        if item.op == P.OP_EXAMPLE:
            if not hasattr(self.handler, "example_input"):
                raise ValueError("the handler has no example_input()")
            return self.handler.example_input()
        if item.enc == P.ENC_RAW:
            return item.payload
        if item.enc == P.ENC_JSON:
            return json.loads(item.payload)
        if item.enc == P.ENC_OIP:
            from gshare.runtime.gateway.oip_codec import decode_request

            item.ctx, payload = decode_request(item.payload, self.input_spec, self.output_spec)
            return payload
        raise ValueError(f"unknown payload encoding {item.enc}")

    def _encode(self, item: _Item, output: Any) -> tuple[int, bytes]:
        if item.enc == P.ENC_OIP:
            from gshare.runtime.gateway.oip_codec import encode_response

            return encode_response(item.ctx, self.launch.function, output)
        if isinstance(output, bytes | bytearray | memoryview):
            return P.ENC_RAW, bytes(output)
        return P.ENC_JSON, json.dumps(output, default=_json_default).encode()

    def _predict(self, inputs: list[Any], items: list[_Item]) -> Any:
        """``handler.predict``, with each request's OIP ``parameters`` (``{}`` for other
        encodings) when the handler takes a ``parameters`` argument (``models.Handler``)."""
        if not self._takes_parameters:
            return self.handler.predict(inputs)
        params = [dict(it.ctx.header.parameters) if it.ctx is not None else {} for it in items]
        return self.handler.predict(inputs, parameters=params)

    def _batch_loop(self) -> None:
        self._worker_ident = threading.get_ident()
        if self._fikit is not None:
            self._fikit.worker_ident = self._worker_ident
        while not self._stop.is_set():
            batch = self._take_batch()
            if batch is None:
                return
            try:
                self._run_batch(batch)
            except BaseException as e:  # never let the batching thread die silently
                msg = f"internal error in instance {self.launch.instance_id}: {e!r}".encode()
                self._send(
                    [
                        (it.writer, P.encode_response(it.req_id, P.ST_INTERNAL, P.ENC_RAW, msg))
                        for it in batch
                    ]
                )
            finally:
                with self._cond:
                    self._running = []
                    # Token reuse: keep the token only when the next batch can start at once
                    # (policy.batching.keep_token_for_next_batch).
                    keep = keep_token_for_next_batch(*self._queue_now())
                if not keep:
                    self._idle_tokens()

    def _run_batch(self, batch: list[_Item]) -> None:
        out: list[tuple[_Conn, bytes]] = []
        inputs: list[Any] = []
        good: list[_Item] = []
        for it in batch:
            try:
                inputs.append(self._decode(it))
                good.append(it)
            except Exception as e:
                msg = _input_error(e)
                out.append(
                    (
                        it.writer,
                        P.encode_response(it.req_id, P.ST_BAD_INPUT, P.ENC_RAW, msg.encode()),
                    )
                )
        if not good:
            self._send(out)
            return
        t_ask = time.perf_counter()
        fk = self._fikit
        self._fikit_filling = False
        if fk is not None:
            fk.begin_batch()
        give_way = fk is not None and fk.must_yield()  # FIKIT: a higher class is active
        if give_way and fk.fills_possible():
            # give the token back now; the first preemption point holds the first op (a gap
            # fill, or the token once this class may run)
            self.tokens.release_if_held(completed=False)
            self._fikit_filling = True
        else:
            # token reuse: a held token whose rest fits the batch (not while giving way)
            if give_way or not self.tokens.reusable():
                self.tokens.release_if_held(completed=False)
                self._acquire()
            self.tokens.begin_burst()
        t0 = time.perf_counter()
        self._seg_start = t0
        self._busy_s = 0.0
        self._rewait_s = 0.0
        self._in_burst = True
        mem = self._mem
        if mem is not None:
            mem.begin_batch()
        results: list[tuple[bool, Any]] = []
        first_ok = False
        try:
            try:
                outputs = self._predict(inputs, good)
                if len(outputs) != len(inputs):
                    raise RuntimeError(
                        f"predict returned {len(outputs)} outputs for {len(inputs)} inputs"
                    )
                results = [(True, o) for o in outputs]
                first_ok = True
            except Exception:
                failed = self._failure()
                if len(inputs) == 1:
                    results = [(False, failed)]
            # (out of the except block: the failed batch's frames, and what they held, are
            # released before a memory-limit abort frees the memory and the batch is re-run)
            self._after_failure()
            if not results:  # isolate the failing request(s)
                for x, it in zip(inputs, good, strict=True):
                    try:
                        results.append((True, self._predict([x], [it])[0]))
                    except Exception:
                        results.append((False, self._failure()))
                    self._after_failure()
        finally:
            self._in_burst = False
            if mem is not None:
                mem.end_batch(time.perf_counter() - t0)
            if fk is not None:
                fk.end_batch(ok=first_ok)
        seg_s = time.perf_counter() - self._seg_start
        if self.tokens.in_burst:
            self.tokens.end_burst()  # the token is kept for the next batch (see _batch_loop)
        busy_ms = (self._busy_s + seg_s) * 1000.0
        token_wait_ms = (t0 - t_ask + self._rewait_s) * 1000.0
        self.stats["requests"] += len(good)
        self.stats["batches"] += 1
        self.stats["busy_ms"] += busy_ms
        self.stats["token_wait_ms"] += token_wait_ms
        n = len(good)
        for it, (ok, value) in zip(good, results, strict=True):
            queue_ms = (t_ask - it.arrived) * 1000.0
            if ok:
                try:
                    enc, data = self._encode(it, value)
                    status = P.ST_OK
                except Exception as e:
                    status, enc, data = _encode_error(e)
            else:
                status, enc, data = value
            out.append(
                (
                    it.writer,
                    P.encode_response(
                        it.req_id, status, enc, data, queue_ms, token_wait_ms, busy_ms, n
                    ),
                )
            )
        self._send(out)

    def _failure(self) -> tuple[int, int, bytes]:
        """The response of the request whose ``predict`` raised (call in ``except``): a
        refused memory grow is a memory-limit error (the memory it held is freed first)."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, MemoryLimitExceeded):
            self._mem_aborted = True
            return P.ST_MEMORY_LIMIT, P.ENC_RAW, str(exc).encode()
        if self.os_cap is not None and exc is not None and is_memory_error(exc):
            self._mem_aborted = self._mem is not None
            cap = self.os_cap
            plan_mb = cap.cap_mb - SLACK_MB
            return (
                P.ST_MEMORY_LIMIT,
                P.ENC_RAW,
                (
                    f"the request exceeded the function's memory limit: the operating system "
                    f"({cap.kind.value}) refused an allocation past mem_mb {plan_mb:.0f} MiB "
                    f"+ {SLACK_MB:.0f} MiB for the runtime"
                ).encode(),
            )
        return _function_error()

    def _after_failure(self) -> None:
        """After a memory-limit abort (outside its ``except``): free what the batch held."""
        if self._mem_aborted and self._mem is not None:
            self._mem_aborted = False
            self._mem.after_abort()

    def _is_idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._running

    def _ask_memory(self, limit_mb: float, steps: int) -> tuple[bool, float, str]:
        """Ask the device's memory ledger for a new limit (the memory watchdog's thread)."""
        from gshare.runtime.tokens import MemoryChannel

        for attempt in range(2):
            try:
                if self._mem_channel is None:
                    self._mem_channel = MemoryChannel(
                        self.launch.token_socket,
                        self.launch.instance_id,
                        secret=self.launch.token_secret or None,
                    )
                r = self._mem_channel.resize(limit_mb, steps)
                return r.granted, r.limit_mb, r.refusal
            except Exception as e:  # the agent re-registered us, or its server restarted
                with contextlib.suppress(Exception):
                    self._mem_channel.close()
                self._mem_channel = None
                if attempt:
                    return False, limit_mb, f"the node's memory ledger is unreachable ({e})"
        raise AssertionError("unreachable")

    def _over_max(self) -> None:
        with contextlib.suppress(Exception):
            if self._mem_channel is not None:
                self._mem_channel.over_max()

    def _idle_tokens(self) -> None:
        """Release the held token, if any (the batch queue is empty: token reuse ends)."""
        from gshare.runtime.tokens import TokenRuntimeError

        # A failure closes the client; the next ``_acquire`` reconnects.
        with contextlib.suppress(TokenRuntimeError, ConnectionError, TimeoutError, ValueError):
            if self.tokens.in_burst:
                self.tokens.end_burst()
            self.tokens.idle()

    def _token_hook(self, module: Any, args: Any) -> None:
        """Global torch forward pre-hook: the frontend's preemption point (module doc)."""
        if not self._in_burst or threading.get_ident() != self._worker_ident:
            return
        mem = self._mem
        if mem is not None:
            mem.check()  # a refused memory grow aborts the batch here
        fk = self._fikit
        if fk is not None:  # FIKIT: task switching and gap fills (instance.fikit)
            if fk.must_yield():
                self._fikit_hold(fk, module, args)
            else:
                self._fikit_filling = False
            fk.before_op(module, args)
            if self._fikit_filling:
                return  # dispatched into a higher class's gap: runs without a token
        if self.tokens.token_left_ms() > 0.0:
            return
        now = time.perf_counter()
        seg_s = now - self._seg_start
        self._busy_s += seg_s
        self.tokens.release_if_held(completed=False)
        self._acquire()
        if not self.tokens.in_burst:  # a new client after a reconnect
            self.tokens.begin_burst()
        t1 = time.perf_counter()
        self._rewait_s += t1 - now
        self._seg_start = t1
        if fk is not None:
            fk.held(t1 - now)

    def _fikit_hold(self, fk: Any, module: Any, args: Any) -> None:
        """A higher class is active: give the token back and hold this op (``FikitHost.hold``)
        until it is dispatched as a gap fill or this class may run again (a token)."""
        now = time.perf_counter()
        self._busy_s += now - self._seg_start
        self.tokens.release_if_held(completed=False)
        self._fikit_filling = bool(fk.hold(module, args, self._acquire))
        if not self._fikit_filling and not self.tokens.in_burst:
            self.tokens.begin_burst()
        t1 = time.perf_counter()
        self._rewait_s += t1 - now
        self._seg_start = t1

    def _acquire(self) -> float:
        """``TokenClient.acquire``; when the agent re-registered this client (a quota change:
        the profiler's sweep) or the token server restarted, reconnect and ask again."""
        from gshare.runtime.tokens import TokenClient, TokenRuntimeError

        try:
            return self.tokens.acquire()
        except (TokenRuntimeError, ConnectionError):
            pass
        deadline = time.monotonic() + 10.0
        while True:
            with contextlib.suppress(Exception):
                self.tokens.close()
            try:
                self.tokens = TokenClient(
                    self.launch.token_socket,
                    self.launch.instance_id,
                    secret=self.launch.token_secret or None,
                )
                return self.tokens.acquire()
            except (TokenRuntimeError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    # -- memory limit (instance.memory) ---------------------------------------------------------

    def _die_over_limit(self, used_mb: float, limit_mb: float) -> None:
        reason = (
            f"instance {self.launch.instance_id} exceeded its memory limit (model memory "
            f"{used_mb:.0f} MiB above the runtime's {self.baseline_mb:.0f} MiB > mem_mb "
            f"{limit_mb:.0f} MiB) and is being restarted"
        )
        self.draining = True
        with self._cond:
            victims = list(self._running) + list(self._queue)
            self._queue.clear()
        msg = reason.encode()
        done = threading.Event()

        def fail_all() -> None:
            for it in victims:
                it.writer.write(P.encode_response(it.req_id, P.ST_MEMORY_LIMIT, P.ENC_RAW, msg))
            done.set()

        with contextlib.suppress(Exception), open(self.launch.uds_path + ".exit", "w") as f:
            f.write(reason)
        try:
            self._loop.call_soon_threadsafe(fail_all)
            done.wait(1.0)
            time.sleep(0.05)  # let the transports flush
        finally:
            os._exit(75)

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        if self._fikit is not None:
            with contextlib.suppress(Exception):
                self._fikit.close()
        if self._mem is not None:
            self._mem.stop()
        with self._cond:
            self._cond.notify_all()
        with contextlib.suppress(Exception):
            self.tokens.close()

        def close() -> None:
            for s in self._servers:
                s.close()
            self._loop.stop()

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(close)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.launch.uds_path)


def _open_fikit(launch: InstanceLaunch) -> Any:
    """The instance's ``FikitHost`` when its device's board is in FIKIT mode, else None (token
    sharing alone; also when the board cannot be used: a warning says why)."""
    try:
        from gshare.runtime.tokens.board import open_board

        board = open_board(launch.token_socket, launch.instance_id)
        if board is None:
            return None
        from gshare.runtime.instance.fikit import FikitHost

        return FikitHost(
            board, launch.function, launch.kernel_profile, device=launch.device, pid=os.getpid()
        )
    except Exception as e:  # FIKIT is an optimisation: never fail a start over it
        import sys

        print(f"gshare: FIKIT is off for {launch.instance_id}: {e!r}", file=sys.stderr)
        return None


def _input_error(e: Exception) -> str:
    from gshare.runtime.gateway.oip import OipError

    if isinstance(e, OipError):
        return str(e)
    if isinstance(e, json.JSONDecodeError):
        return f"malformed JSON body: {e}"
    return f"the function cannot decode the input: {type(e).__name__}: {e}"


def _encode_error(e: Exception) -> tuple[int, int, bytes]:
    """The (status, encoding, message) of an output that cannot be encoded: a bad request when
    the request asked for what the handler did not give (``OipError``), else a 5xx."""
    from gshare.runtime.gateway.oip import OipError

    if isinstance(e, OipError):
        return P.ST_BAD_INPUT, P.ENC_RAW, str(e).encode()
    return P.ST_FUNCTION_ERROR, P.ENC_RAW, f"cannot encode the output: {e}".encode()


def _takes_parameters(handler: Any) -> bool:
    """Whether ``handler.predict`` has a ``parameters`` argument (it then gets the requests'
    OIP parameters)."""
    import inspect

    try:
        p = inspect.signature(handler.predict).parameters.get("parameters")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _function_error() -> tuple[int, int, bytes]:
    """The (status, encoding, message) of the exception being handled: input-like errors
    (ValueError, TypeError, KeyError, IndexError) are the caller's fault (4xx), others 5xx."""
    import sys

    exc = sys.exc_info()[1]
    assert exc is not None
    # the traceback goes to the instance's log file (``i-ID.log`` in the server's run
    # directory), not to the caller: source locations are not the caller's business
    log.warning(
        "the function raised:\n%s",
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ValueError | TypeError | KeyError | IndexError):
        return P.ST_BAD_INPUT, P.ENC_RAW, f"the function rejected the input: {text}".encode()
    return P.ST_FUNCTION_ERROR, P.ENC_RAW, f"the function raised {text}".encode()


class InstanceActor:
    """The Ray actor around ``InstanceServer`` (the agent wraps it with ``ray.remote``)."""

    def __init__(self, launch: dict[str, Any]) -> None:
        self.server = InstanceServer(InstanceLaunch(**launch))

    def ready(self) -> dict[str, Any]:
        return self.server.info()

    def stop(self) -> None:
        self.server.stop()


def launch_to_dict(launch: InstanceLaunch) -> dict[str, Any]:
    return asdict(launch)


__all__ = ["InstanceActor", "InstanceLaunch", "InstanceServer", "launch_to_dict"]
