"""A generative function's instance: the engine thread that serves its requests, token by token.

Who calls it: ``instance.server.InstanceServer`` makes one ``EngineHost`` instead of its
batching thread when the handler follows the step-wise contract (``StepwiseHandler``). Its IO
thread hands every request to ``submit`` (``OP_GENERATE``: streamed; ``OP_INVOKE``: the whole
completion in one frame) and every ``OP_CANCEL`` to ``cancel``; ``serve`` is the engine
thread's loop.

What it does: each request becomes a sequence of the ``GenerationEngine`` (continuous
batching: it joins the running batch at the next step). The engine's hooks are the
instance's ``DeviceGate`` (``GateHooks``): each step is one burst — ``begin_batch`` (acquire
or reuse the time token; FIKIT gives way there), the step, ``end_batch`` + ``end_burst`` — and
the token goes back (``idle_tokens``) when no step is ready. Its KV limit is asked of
``kv_grant``: within the function's memory plan (``mem_mb``; ``MemoryGovernor`` grows the
instance's limit from the memory it measures, as for one-shot batches), refused past the
plan's cap (the engine then preempts or refuses a sequence; the instance goes on). Chunks
become ``ST_CHUNK`` frames and each sequence's last chunk its final frame
(``instance.protocol``'s module doc), written once per step (one IO-loop wake-up); the engine's
counters go out as ``ST_STATS`` frames.

What must hold: the engine's ``step`` runs on the engine thread only (``serve``), which is
also the gate's worker thread (its preemption points); ``submit`` and ``cancel`` run on the IO
thread and only touch the engine through its thread-safe ``submit`` / ``cancel`` and the
host's lock; every accepted request gets exactly one final frame (a disconnect's included:
``ST_CANCELLED`` once the engine freed its KV; a step that fails inside the engine itself ends
every live sequence that way, and the gateway answers them 503).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gshare.policy.generation import DEFAULT_MAX_BATCH_SEQS, KvPlan
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.generative.contract import (
    Chunk,
    FinishReason,
    GenerationParams,
    StepwiseHandler,
)
from gshare.runtime.instance.generative.engine import (
    GenerationEngine,
    SequenceHandle,
    engine_config,
)
from gshare.runtime.instance.models import InputError

if TYPE_CHECKING:
    from gshare.runtime.instance.gate import DeviceGate
    from gshare.runtime.instance.launch import InstanceLaunch
    from gshare.runtime.instance.wire import Conn, Item

log = logging.getLogger("gshare.runtime.instance.server")

MIB = 1 << 20


class GateHooks:
    """The engine's ``StepHooks`` on the instance's ``DeviceGate`` (module doc)."""

    def __init__(self, gate: DeviceGate) -> None:
        self.gate = gate
        self._t_ask = 0.0
        self._t0 = 0.0
        self.token_wait_ms = 0.0
        """The last step's wait for its token."""
        self.holding = False

    def before_step(self) -> None:
        self._t_ask = time.perf_counter()
        self._t0 = self.gate.begin_batch()
        self.holding = True

    def after_step(self, busy_s: float, ok: bool) -> None:
        self.gate.end_batch(self._t0, ok=ok)
        _busy_ms, self.token_wait_ms = self.gate.end_burst(self._t_ask, self._t0)

    def idle(self) -> None:
        if self.holding:
            self.holding = False
            self.gate.idle_tokens()


def kv_plan(launch: InstanceLaunch) -> KvPlan:
    """The KV cache's plan from the function's memory plan: unbounded without one, else up to
    its cap (a fixed ``mem_mb``, or ``max`` of ``{init, step, max}``), by its steps."""
    cap_mb = launch.mem_max_mb if launch.mem_step_mb > 0 else launch.mem_mb
    if cap_mb <= 0:
        return KvPlan()
    step = int(launch.mem_step_mb * MIB) if launch.mem_step_mb > 0 else 0
    return KvPlan(init_bytes=0, step_bytes=step, max_bytes=int(cap_mb * MIB))


@dataclass(slots=True)
class _Request:
    conn: Conn
    req_id: int
    streamed: bool
    handle: SequenceHandle
    text: list[str] = field(default_factory=list)
    """The whole completion so far (one-shot requests only)."""


class EngineHost:
    """The engine thread of a generative instance (module doc)."""

    def __init__(
        self,
        handler: StepwiseHandler,
        launch: InstanceLaunch,
        gate: DeviceGate,
        send: Callable[[list[tuple[Conn, bytes]]], None],
    ) -> None:
        self.launch = launch
        self.gate = gate
        self.send = send
        self.hooks = GateHooks(gate)
        self.plan = kv_plan(launch)
        seqs = launch.max_batch if launch.max_batch > 1 else DEFAULT_MAX_BATCH_SEQS
        self.engine = GenerationEngine(
            handler,
            engine_config(handler, kv=self.plan, max_batch_seqs=seqs),
            hooks=self.hooks,
            kv_grant=self._kv_grant,
        )
        self._lock = threading.Lock()
        self._by_seq: dict[str, _Request] = {}
        self._by_req: dict[tuple[int, int], str] = {}
        """(id of the connection, request id) → sequence id."""
        self._conns: dict[int, Conn] = {}
        """Connections that submitted a generation: where ``ST_STATS`` frames go."""
        self._out: list[tuple[Conn, bytes]] = []
        self._chunks: list[Chunk] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_stats_s = 0.0
        self._idle_stats_sent = False
        self._thread = threading.Thread(target=self.serve, name="gshare-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the IO thread ---------------------------------------------------------------------------

    def submit(self, it: Item) -> None:
        """Start a generation for ``it`` (``OP_GENERATE`` or ``OP_INVOKE``); a request the
        engine cannot take is answered at once (``ST_BAD_INPUT``)."""
        try:
            prompt, params = self._decode(it)
            with self._lock:
                h = self.engine.submit(prompt, params, on_chunk=self._on_chunk)
                self._by_seq[h.seq_id] = _Request(it.writer, it.req_id, it.op == P.OP_GENERATE, h)
                self._by_req[(id(it.writer), it.req_id)] = h.seq_id
                self._conns[id(it.writer)] = it.writer
        except InputError as e:
            it.writer.write(
                P.encode_response(it.req_id, P.ST_BAD_INPUT, P.ENC_RAW, str(e).encode())
            )
            return
        self._wake.set()

    def _decode(self, it: Item) -> tuple[Any, GenerationParams]:
        if it.op == P.OP_EXAMPLE:
            raise InputError("a generative function has no example input")
        if it.enc == P.ENC_RAW:
            return bytes(it.payload), GenerationParams()
        if it.enc != P.ENC_JSON:
            raise InputError(
                f"function {self.launch.function!r} is generative: send a prompt as JSON "
                '({"prompt": ..., "parameters": {...}}) or raw UTF-8, or use the generate and '
                "OpenAI-compatible routes"
            )
        try:
            doc = json.loads(bytes(it.payload))
        except ValueError as e:
            raise InputError(f"malformed JSON: {e}") from None
        if isinstance(doc, dict):
            params = doc.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise InputError("parameters must be a JSON object")
            return doc, GenerationParams.parse(params)
        return doc, GenerationParams()

    def cancel(self, conn: Conn, req_id: int) -> None:
        """The gateway's ``OP_CANCEL``: the sequence stops at the next step boundary (its final
        frame says ``ST_CANCELLED``)."""
        with self._lock:
            sid = self._by_req.get((id(conn), req_id))
        if sid is not None:
            self.engine.cancel(sid)
            self._wake.set()

    def live(self) -> list[tuple[Conn, int]]:
        """The requests not answered yet (the instance's ``_die`` fails them)."""
        with self._lock:
            return [(r.conn, r.req_id) for r in self._by_seq.values()]

    @property
    def idle(self) -> bool:
        return not self.engine.has_work

    def stats(self) -> dict[str, object]:
        c = self.engine.counters()
        return {
            "running": c.running,
            "waiting": c.waiting,
            "kv_bytes": c.kv_bytes,
            "kv_limit_bytes": c.kv_limit_bytes,
            "tokens_generated": c.tokens_generated,
            "prefill_tokens": c.prefill_tokens,
            "steps": c.steps,
            "busy_s": round(c.busy_s, 6),
            "preemptions": c.preemptions,
            "refused": c.refused,
            "cancelled": c.cancelled,
            "finished": c.finished,
        }

    # -- the engine thread -----------------------------------------------------------------------

    def serve(self) -> None:
        """Step while there is work, flush each step's frames, hand the token back and wait
        when no step is ready (module doc)."""
        self.gate.bind_worker()
        while not self._stop.is_set():
            self._wake.clear()
            ran = False
            batch = 0
            try:
                if self.engine.has_work:
                    d = self.engine.step().decision
                    ran = not d.idle
                    batch = len(d.prefill) + len(d.decode)
            except Exception:  # never let the engine thread die: its live sequences end
                log.exception("instance %s: the engine failed a step", self.launch.instance_id)
                with contextlib.suppress(Exception):
                    self.engine.close()
            finally:
                self._frames(batch)
                self._flush(working=ran)
            if ran:
                continue
            self.hooks.idle()
            self._wake.wait(0.05)
        self.engine.close()
        self._frames(0)
        self._flush(working=False)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _kv_grant(self, limit_bytes: int) -> bool:
        cap = self.plan.max_bytes
        return cap <= 0 or limit_bytes <= cap

    def _on_chunk(self, c: Chunk) -> None:
        """A chunk of the step being run (engine thread): kept for ``_frames``."""
        self._chunks.append(c)

    def _frames(self, batch: int) -> None:
        """The step's chunks as frames (``batch``: the sequences the step ran)."""
        chunks, self._chunks = self._chunks, []
        for c in chunks:
            with self._lock:
                r = self._by_seq.get(c.seq_id)
                if r is None:
                    continue
                if c.last:
                    del self._by_seq[c.seq_id]
                    self._by_req.pop((id(r.conn), r.req_id), None)
            if c.last:
                self._out.append((r.conn, self._final(r, c)))
            elif r.conn.transport is None:  # the gateway's connection is gone: stop it
                self.engine.cancel(c.seq_id)
            elif r.streamed:
                body = json.dumps({"text": c.text, "tokens": len(c.token_ids)}).encode()
                frame = P.encode_response(r.req_id, P.ST_CHUNK, P.ENC_JSON, body, batch=batch)
                self._out.append((r.conn, frame))
            else:
                r.text.append(c.text)

    def _final(self, r: _Request, c: Chunk) -> bytes:
        reason = c.finish_reason
        if reason is FinishReason.CANCELLED:
            return P.encode_response(r.req_id, P.ST_CANCELLED, P.ENC_RAW, b"cancelled")
        if reason is FinishReason.REFUSED:
            return P.encode_response(r.req_id, P.ST_BAD_INPUT, P.ENC_RAW, c.error.encode())
        if reason is FinishReason.ERROR:
            msg = f"function {self.launch.function!r} failed while generating: {c.error}"
            return P.encode_response(r.req_id, P.ST_FUNCTION_ERROR, P.ENC_RAW, msg.encode())
        t = c.timings
        completion = len(r.handle.generated)
        queued_ms = (t.queued_s * 1000.0) if t else 0.0
        if r.streamed:
            doc: dict[str, object] = {
                "text": c.text,
                "tokens": len(c.token_ids),
                "finish_reason": str(reason),
                "prompt_tokens": r.handle.prompt_tokens,
                "completion_tokens": completion,
                "ttft_ms": None if t is None or t.ttft_s is None else t.ttft_s * 1000.0,
                "tpot_ms": None if t is None or t.tpot_s is None else t.tpot_s * 1000.0,
                "queued_ms": queued_ms,
                "preemptions": t.preemptions if t else 0,
            }
        else:
            r.text.append(c.text)
            doc = {"text": "".join(r.text), "finish_reason": str(reason), "tokens": completion}
        return P.encode_response(
            r.req_id,
            P.ST_OK,
            P.ENC_JSON,
            json.dumps(doc).encode(),
            queue_ms=queued_ms,
            token_wait_ms=self.hooks.token_wait_ms,
        )

    def _flush(self, *, working: bool) -> None:
        """Write the step's frames; the counters every ``STATS_PERIOD_S`` while working and
        once when the engine goes idle."""
        now = time.monotonic()
        if working:
            due = now - self._last_stats_s >= P.STATS_PERIOD_S
            self._idle_stats_sent = False
        else:
            due = not self._idle_stats_sent
            self._idle_stats_sent = True
        if due and self._conns:
            self._last_stats_s = now
            frame = P.encode_response(0, P.ST_STATS, P.ENC_JSON, json.dumps(self.stats()).encode())
            with self._lock:
                conns = [c for c in self._conns.values() if c.transport is not None]
                self._conns = {id(c): c for c in conns}
            self._out.extend((c, frame) for c in conns)
        if self._out:
            out, self._out = self._out, []
            self.send(out)


__all__ = ["DEFAULT_MAX_BATCH_SEQS", "EngineHost", "GateHooks", "kv_plan"]
