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

Preemption points (a global torch forward pre-hook checks the token before every module call
inside a burst) and priority classes (FIKIT): ``instance.gate``, the ``DeviceGate`` the server
owns; it also holds the token client and the memory governor. The wire (connections, the IO
thread): ``instance.wire``; steps 1–2 of the cold start: ``instance.startup``; the launch
description: ``instance.launch``; error replies: ``instance.errors``.

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

import contextlib
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gshare.policy.batching import keep_token_for_next_batch, next_batch
from gshare.policy.memory import MemoryPlan
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.errors import encode_error, input_error
from gshare.runtime.instance.gate import DeviceGate
from gshare.runtime.instance.launch import InstanceInfo, InstanceLaunch
from gshare.runtime.instance.startup import cold_start
from gshare.runtime.instance.wire import Conn, DataPath, Item, json_default

if TYPE_CHECKING:
    from gshare.runtime.instance.generative.serving import EngineHost

LOOP_GAP_SAMPLES = 512
"""Loop gaps the instance keeps for its ``stats`` command (the newest)."""
SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval in an instance process (``sys.setswitchinterval``; Python's
default is 5 ms): how long a thread that holds the GIL keeps it once another asks for it.

NOTE — answers held behind the next request. The IO thread writes a batch's answers
(``DataPath.send``) and needs the GIL to do it; with the next request queued, the batching
thread goes straight into its ``predict``, and a handler that holds the GIL (a Python loop,
small torch operators on the CPU) kept it until that request ended or the switch interval
forced a hand-over. Found on the fidelity harness's priority pair (2.2-ms requests, one
instance): 8 % of the answers reached the gateway within 0.2 ms of the one before them, each
held for the next request's whole computation (docs/journal/fidelity.md). Waiting for the IO
thread before the next batch fixed that but cost the saturated share pair 5 % of its
throughput (the batching thread idle while the IO thread waited for a core); a shorter switch
interval bounds the hold without idling the batching thread."""


class InstanceServer:
    """The instance's machinery (see the module doc). ``InstanceActor`` wraps it for Ray; it
    can also run in a plain process."""

    def __init__(self, launch: InstanceLaunch) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL_S)  # before any of its threads start
        self.launch = launch
        self.started_s = time.time()
        self.draining = False
        self.max_batch = max(1, launch.max_batch)
        self.max_wait_s = max(0.0, launch.max_wait_ms) / 1000.0
        self._cond = threading.Condition()
        self._queue: deque[Item] = deque()
        self._running: list[Item] = []
        self._stop = threading.Event()
        self._dead = False
        self._predict_since: float | None = None
        """When the running ``predict`` started (None: none runs); the predict watchdog's."""
        self.stats = {
            "requests": 0,
            "batches": 0,
            "busy_ms": 0.0,
            "token_wait_ms": 0.0,
            "loop_gaps": 0,
            "loop_gap_ms": 0.0,
        }
        self.loop_gaps_ms: deque[float] = deque(maxlen=LOOP_GAP_SAMPLES)
        """The last ``LOOP_GAP_SAMPLES`` loop gaps (ms): from a batch's end to the start of the
        next one when that one was ready at once (its token kept): the answers' encoding and
        send and the loop's bookkeeping. The ``stats`` command reports them (the simulator's
        ``batch_gap_ms`` is measured from them)."""
        self._kept_since: float | None = None
        """End of the last batch when the next one was ready at once (its token kept)."""
        # 1.-2. spatial partition, memory cap, sandbox and model (instance.startup).
        cs = cold_start(launch)
        self.cores = cs.cores
        self.baseline_mb = cs.baseline_mb
        self.os_cap = cs.os_cap
        self.sandbox = cs.sandbox
        self.spec = cs.spec
        self.handler = cs.handler
        self.input_spec = cs.input_spec
        self.output_spec = cs.output_spec
        self._takes_parameters = cs.takes_parameters
        # 3. token client, and the preemption points inside a burst (instance.gate).
        self.gate = DeviceGate(launch, cs.native_tokens, cs.os_cap)
        # 4. data path: a generative handler's engine thread, or the batching thread.
        self._wire = DataPath(self, launch)
        self.gen: EngineHost | None = None
        # lazy: the generative modules import torch, after the partition (cold start step 1)
        from gshare.runtime.instance.generative.contract import StepwiseHandler
        from gshare.runtime.instance.generative.serving import EngineHost

        if isinstance(self.handler, StepwiseHandler):
            self.gen = EngineHost(self.handler, launch, self.gate, self._wire.send)
        self._wire.start()
        if self.gen is not None:
            self.gen.start()
        else:
            threading.Thread(target=self._batch_loop, name="gshare-batch", daemon=True).start()
        if launch.predict_timeout_s > 0:
            threading.Thread(
                target=self._watch_predict, name="gshare-predict-watchdog", daemon=True
            ).start()
        if cs.governed:
            self.gate.start_memory(self.baseline_mb, die=self._die_over_limit, idle=self._is_idle)

    # -- info --------------------------------------------------------------------------------

    @property
    def tcp_port(self) -> int | None:
        """The TCP listener's port (None: no listener, or not bound yet)."""
        return self._wire.tcp_port

    def info(self) -> InstanceInfo:
        """What the agent reports once the instance is ready."""
        from gshare.runtime.oip.header import input_spec_dicts  # lazy: numpy, for OIP only

        return {
            "pid": os.getpid(),
            "uds_path": self.launch.uds_path,
            "tcp_port": self.tcp_port,
            "cores": self.cores,
            "inputs": input_spec_dicts(self.input_spec),
            "incarnation": self.launch.incarnation,
        }

    # -- the IO thread's calls (instance.wire.ConnOwner) ----------------------------------------

    def cancel(self, conn: Conn, req_id: int) -> bool:
        """Drop a queued request of ``conn`` (``OP_CANCEL``, on the IO thread); False when it
        is not queued (running already, or answered). A generation stops at its engine's next
        step and is answered then (``EngineHost.cancel``)."""
        if self.gen is not None:
            self.gen.cancel(conn, req_id)
            return False
        with self._cond:
            for it in self._queue:
                if it.req_id == req_id and it.writer is conn:
                    self._queue.remove(it)
                    return True
        return False

    def enqueue(self, items: list[Item]) -> None:
        if self.gen is not None:
            for it in items:
                self.gen.submit(it)
            return
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
                reply: dict[str, object] = {"ok": True}
            elif name == "set_memory":
                if self.gate.mem is None:
                    raise ValueError("the instance has no memory limit")
                self.gate.mem.set_plan(
                    MemoryPlan(
                        float(cmd["init_mb"]), float(cmd["step_mb"]), float(cmd.get("max_mb", 0))
                    )
                )
                reply = {"ok": True}
            elif name == "drain":
                self.draining = True
                reply = {"ok": True}
            elif name == "kernel_profile":
                fk = self.gate.fikit
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
                        "loop_gaps_ms": [round(g, 4) for g in list(self.loop_gaps_ms)],
                    }
                if self.gen is not None:
                    reply["engine"] = self.gen.stats()
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

    def _take_batch(self) -> list[Item] | None:
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

    def _decode(self, item: Item) -> object:
        if item.op == P.OP_EXAMPLE:
            if not hasattr(self.handler, "example_input"):
                raise ValueError("the handler has no example_input()")
            return self.handler.example_input()
        if item.enc == P.ENC_RAW:
            return bytes(item.payload)
        if item.enc == P.ENC_JSON:
            return json.loads(bytes(item.payload))
        if item.enc == P.ENC_OIP:
            from gshare.runtime.oip.payload import decode_request  # lazy: numpy, for OIP only

            item.ctx, payload = decode_request(item.payload, self.input_spec, self.output_spec)
            return payload
        raise ValueError(f"unknown payload encoding {item.enc}")

    def _encode(self, item: Item, output: object) -> tuple[int, bytes | list[bytes | memoryview]]:
        if item.enc == P.ENC_OIP:
            # lazy: numpy, for OIP only
            from gshare.runtime.oip.payload import encode_response_parts

            assert item.ctx is not None  # set by _decode
            return encode_response_parts(item.ctx, self.launch.function, output)
        if isinstance(output, bytes | bytearray | memoryview):
            return P.ENC_RAW, bytes(output)
        return P.ENC_JSON, json.dumps(output, default=json_default).encode()

    def _predict(self, inputs: list[object], items: list[Item]) -> list[object]:
        """``handler.predict``, with each request's OIP ``parameters`` (``{}`` for other
        encodings) when the handler takes a ``parameters`` argument (``models.Handler``); the
        predict watchdog times it (``_watch_predict``)."""
        self._predict_since = time.monotonic()
        try:
            predict: Callable[..., list[object]] = self.handler.predict
            if not self._takes_parameters:
                return predict(inputs)
            params = [dict(it.ctx.header.parameters) if it.ctx is not None else {} for it in items]
            return predict(inputs, parameters=params)
        finally:
            self._predict_since = None

    def _watch_predict(self) -> None:
        """The predict watchdog (its own thread, when ``predict_timeout_s`` > 0): a ``predict``
        that runs past the limit cannot be interrupted from Python, so the instance fails its
        requests with ``ST_TIMEOUT`` and exits for the agent to restart it."""
        limit = self.launch.predict_timeout_s
        period = min(1.0, max(0.05, limit / 10.0))
        while not self._stop.wait(period):
            since = self._predict_since
            if since is not None and time.monotonic() - since > limit:
                self._die(
                    P.ST_TIMEOUT,
                    f"predict of function {self.launch.function!r} ran past its "
                    f"predict_timeout_s of {limit:g} s: the request fails and instance "
                    f"{self.launch.instance_id} is restarted",
                )

    def _batch_loop(self) -> None:
        self.gate.bind_worker()
        while not self._stop.is_set():
            batch = self._take_batch()
            if batch is None:
                return
            try:
                self._run_batch(batch)
            except BaseException as e:  # never let the batching thread die silently
                msg = f"internal error in instance {self.launch.instance_id}: {e!r}".encode()
                self._wire.send(
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
                    self._kept_since = None
                    self.gate.idle_tokens()

    def _run_batch(self, batch: list[Item]) -> None:
        since, self._kept_since = self._kept_since, None
        out: list[tuple[Conn, bytes]] = []
        inputs: list[object] = []
        good: list[Item] = []
        for it in batch:
            try:
                inputs.append(self._decode(it))
                good.append(it)
            except Exception as e:
                msg = input_error(e)
                out.append(
                    (
                        it.writer,
                        P.encode_response(it.req_id, P.ST_BAD_INPUT, P.ENC_RAW, msg.encode()),
                    )
                )
        if not good:
            self._wire.send(out)
            return
        gate = self.gate
        t_ask = time.perf_counter()
        if since is not None:  # the loop gap since the batch before (stats)
            gap_ms = (t_ask - since) * 1000.0
            self.stats["loop_gaps"] += 1
            self.stats["loop_gap_ms"] += gap_ms
            self.loop_gaps_ms.append(gap_ms)
        t0 = gate.begin_batch()
        results: list[tuple[bool, Any]] = []  # (True, output) or (False, failure response)
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
                failed = gate.failure()
                if len(inputs) == 1:
                    results = [(False, failed)]
            # (out of the except block: the failed batch's frames, and what they held, are
            # released before a memory-limit abort frees the memory and the batch is re-run)
            gate.after_failure()
            if not results:  # isolate the failing request(s)
                for x, it in zip(inputs, good, strict=True):
                    try:
                        results.append((True, self._predict([x], [it])[0]))
                    except Exception:
                        results.append((False, gate.failure()))
                    gate.after_failure()
        finally:
            gate.end_batch(t0, ok=first_ok)
        busy_ms, token_wait_ms = gate.end_burst(t_ask, t0)
        self._kept_since = time.perf_counter()
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
                    status, enc, data = encode_error(e)
            else:
                status, enc, data = value
            frame = it.writer.response_frame(
                it.req_id, status, enc, data, queue_ms, token_wait_ms, busy_ms, n
            )
            out.append((it.writer, frame))
        self._wire.send(out)

    def _is_idle(self) -> bool:
        if self.gen is not None:
            return self.gen.idle
        with self._cond:
            return not self._queue and not self._running

    # -- memory limit (instance.memory) ---------------------------------------------------------

    def _die_over_limit(self, used_mb: float, limit_mb: float) -> None:
        self._die(
            P.ST_MEMORY_LIMIT,
            f"instance {self.launch.instance_id} exceeded its memory limit (model memory "
            f"{used_mb:.0f} MiB above the runtime's {self.baseline_mb:.0f} MiB > mem_mb "
            f"{limit_mb:.0f} MiB) and is being restarted",
        )

    def _die(self, status: int, reason: str) -> None:
        """Fail every running and queued request with ``status`` and ``reason``, record the
        reason for the agent (``<socket>.exit``) and exit: the agent restarts the instance."""
        self.draining = True
        with self._cond:
            victims = list(self._running) + list(self._queue)
            self._queue.clear()
        msg = reason.encode()
        done = threading.Event()

        live = [(it.writer, it.req_id) for it in victims]
        if self.gen is not None:
            live += self.gen.live()

        def fail_all() -> None:
            for conn, req_id in live:
                conn.write(P.encode_response(req_id, status, P.ENC_RAW, msg))
            done.set()

        with contextlib.suppress(Exception), open(self.launch.uds_path + ".exit", "w") as f:
            f.write(reason)
        try:
            self._wire.call_soon(fail_all)
            done.wait(1.0)
            time.sleep(0.05)  # let the transports flush
        finally:
            os._exit(75)

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        if self.gen is not None:
            self.gen.stop()
        self.gate.close()
        with self._cond:
            self._cond.notify_all()
        self.gate.close_tokens()
        self._wire.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.launch.uds_path)


class InstanceActor:
    """The Ray actor around ``InstanceServer`` (the agent wraps it with ``ray.remote``)."""

    def __init__(self, launch: dict[str, Any]) -> None:
        self.server = InstanceServer(InstanceLaunch(**launch))

    def ready(self) -> InstanceInfo:
        return self.server.info()

    def stop(self) -> None:
        self.server.stop()


__all__ = ["InstanceActor", "InstanceServer"]
