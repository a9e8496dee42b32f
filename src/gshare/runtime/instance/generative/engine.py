"""The generation engine: an iteration-level (continuous) batching loop over a step-wise handler.

Who calls it: an instance's ``generative.serving.EngineHost`` owns one — its IO thread
``submit``s requests and ``cancel``s them (a client that disconnects), its engine thread runs
``step`` in a loop; ``CausalLM.predict`` / ``generate`` run a private one to
completion; the tests and bench/generate.py drive ``step`` directly.

One ``step``: take the new and cancelled sequences (between steps only), ask the pure policy
(``policy.generation.plan_step``) which sequences prefill how many tokens, which decode, which
are preempted or refused; apply the preemptions (``free`` when the KV is dropped), make sure
the KV limit covers the step (``kv_grant``), then run the step as one burst — ``before_step``,
the handler's ``prefill`` and ``decode``, ``after_step(busy_s, ok)`` — and emit one ``Chunk``
per sequence that got a token (the last one with its finish reason and timings).

Hooks (``StepHooks``; an instance's are ``serving.GateHooks``): ``before_step()`` blocks until
the instance holds its time token (``DeviceGate.begin_batch``), ``after_step(busy_s, ok)``
closes the burst (``DeviceGate.end_batch`` + ``end_burst``) and ``idle()`` gives the token back
when no step is ready (``DeviceGate.idle_tokens``). ``kv_grant(limit_bytes) -> bool`` asks for
a KV limit (an instance checks it against the function's memory plan); refused, the engine
plans again under the limit it holds (the policy preempts or refuses; the instance is never
killed).

NOTE: FaST-GShare §3.3.2 — a decode step is one burst of the instance's time token, so shares
and quotas hold per step; Orca §3 — the iteration-level loop itself (the decision is the
policy's).

What must hold: ``submit``, ``cancel``, ``counters`` and a handle's ``drain`` are thread-safe;
``step`` / ``serve`` run on one thread only (the handler's calls come from it); a sequence's
chunks are emitted in order and exactly one is last; a finished, cancelled or refused sequence's
KV is freed before its last chunk is emitted.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gshare.policy.generation import (
    KvPlan,
    SeqSnapshot,
    StepConfig,
    StepDecision,
    StepSnapshot,
    kv_limit,
    plan_step,
)
from gshare.runtime.instance.generative.contract import (
    Chunk,
    FinishReason,
    GenerationParams,
    PrefillWork,
    SequenceTimings,
    SeqView,
    StepwiseHandler,
)
from gshare.runtime.instance.generative.tokenizer import TextStream
from gshare.runtime.instance.models import InputError

_SEQ_IDS = itertools.count()
"""Sequence ids unique in the process (engines may share a handler, whose caches are by id)."""


class StepHooks(Protocol):
    """The instance's token gate around each step (module doc)."""

    def before_step(self) -> None: ...

    def after_step(self, busy_s: float, ok: bool) -> None: ...

    def idle(self) -> None: ...


class NoHooks:
    """No gate: an engine alone on its device (tests, benches, ``predict``)."""

    def before_step(self) -> None:
        pass

    def after_step(self, busy_s: float, ok: bool) -> None:
        pass

    def idle(self) -> None:
        pass


def engine_config(model: StepwiseHandler, kv: KvPlan = KvPlan(), **overrides: Any) -> StepConfig:
    """The policy's configuration for ``model`` (its KV bytes per token and context) with
    ``overrides`` (``max_batch_seqs``, ``mode``, ``fikit``, ...)."""
    spec = model.generation_spec()
    return StepConfig(
        kv_bytes_per_token=spec.kv_bytes_per_token,
        max_context_tokens=spec.max_context_tokens,
        kv=kv,
        **overrides,
    )


class SequenceHandle:
    """One submitted sequence: its state (engine thread) and its output (any thread)."""

    def __init__(
        self,
        seq_id: str,
        view: SeqView,
        priority: int,
        submitted_s: float,
        on_chunk: Callable[[Chunk], None] | None,
    ) -> None:
        self.seq_id = seq_id
        self.view = view
        self.prompt_tokens = len(view.token_ids)
        self.priority = priority
        self.submitted_s = submitted_s
        self.on_chunk = on_chunk
        self.text = TextStream(view.params.stop)
        self.token_times_s: list[float] = []
        """When each generated token was emitted (engine clock)."""
        self.first_step_s: float | None = None
        self.preemptions = 0
        self.in_last_step = False
        self.finished = False
        self.finish_reason: FinishReason | None = None
        self._chunks: list[Chunk] = []
        self._lock = threading.Lock()

    @property
    def generated(self) -> list[int]:
        return self.view.token_ids[self.prompt_tokens :]

    def drain(self) -> list[Chunk]:
        """The chunks emitted since the last ``drain`` (any thread)."""
        with self._lock:
            out, self._chunks = self._chunks, []
        return out

    def timings(self) -> SequenceTimings:
        t = self.token_times_s
        return SequenceTimings(
            ttft_s=t[0] - self.submitted_s if t else None,
            tpot_s=(t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None,
            queued_s=(self.first_step_s or self.submitted_s) - self.submitted_s,
            preemptions=self.preemptions,
        )

    def _emit(self, chunk: Chunk) -> None:
        with self._lock:
            self._chunks.append(chunk)
        if self.on_chunk is not None:
            self.on_chunk(chunk)


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """A snapshot of the engine (the instance sends them as ``ST_STATS`` frames: metrics)."""

    running: int = 0
    """Live sequences that hold KV."""
    waiting: int = 0
    """Live sequences without KV (new, or preempted with their KV dropped)."""
    kv_bytes: int = 0
    kv_limit_bytes: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0
    """Prompt tokens fed, recomputed ones included."""
    steps: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    refused: int = 0
    cancelled: int = 0
    finished: int = 0


@dataclass(slots=True)
class StepReport:
    """What one ``step`` did (tests, benches)."""

    decision: StepDecision
    busy_s: float = 0.0
    finished: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class GenerationEngine:
    """Iteration-level batching over one step-wise handler (module doc)."""

    def __init__(
        self,
        model: StepwiseHandler,
        config: StepConfig | None = None,
        *,
        hooks: StepHooks | None = None,
        kv_grant: Callable[[int], bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.spec = model.generation_spec()
        self.config = config or engine_config(model)
        self.config.check()
        self.hooks: StepHooks = hooks or NoHooks()
        self.kv_grant = kv_grant
        self.clock = clock
        self._live: dict[str, SequenceHandle] = {}
        self._incoming: list[SequenceHandle] = []
        self._cancel: set[str] = set()
        self._cond = threading.Condition()
        self._kv_limit = self.config.kv.init_bytes
        self._kv_cap: int | None = None
        self._c = EngineCounters(kv_limit_bytes=self._kv_limit)

    # -- any thread -----------------------------------------------------------------------------

    def submit(
        self,
        inputs: Any,
        params: GenerationParams | None = None,
        *,
        priority: int = 0,
        on_chunk: Callable[[Chunk], None] | None = None,
        seq_id: str | None = None,
    ) -> SequenceHandle:
        """A new sequence, joining at the next step boundary. ``InputError`` at once for a bad
        prompt. A sampled request without a seed gets a random one."""
        params = params or GenerationParams()
        if not params.greedy and params.seed is None:
            params = replace(params, seed=random.getrandbits(31))
        ids = self.model.encode_prompt(inputs)
        if not ids:
            raise InputError("the prompt has no tokens")
        sid = seq_id or f"seq-{next(_SEQ_IDS)}"
        h = SequenceHandle(sid, SeqView(sid, list(ids), params), priority, self.clock(), on_chunk)
        with self._cond:
            self._incoming.append(h)
            self._cond.notify_all()
        return h

    def cancel(self, seq_id: str) -> None:
        """Stop ``seq_id`` at the next step boundary: its KV is freed, its last chunk says
        ``cancelled`` (a no-op for a finished or unknown id)."""
        with self._cond:
            self._cancel.add(seq_id)
            self._cond.notify_all()

    def counters(self) -> EngineCounters:
        with self._cond:
            return self._c

    @property
    def has_work(self) -> bool:
        with self._cond:
            return bool(self._live or self._incoming)

    # -- the engine thread ----------------------------------------------------------------------

    def step(self) -> StepReport:
        """One iteration (module doc); an idle decision runs nothing and calls no hook."""
        self._take_new()
        decision = self._plan()
        report = StepReport(decision)
        for r in decision.refuse:
            self._finish(self._live[r.seq_id], FinishReason.REFUSED, error=r.message)
            self._count(refused=1)
        for p in decision.preempt:
            h = self._live[p.seq_id]
            h.preemptions += 1
            h.in_last_step = False
            self._count(preemptions=1)
            if p.drop_kv:
                self.model.free(h.seq_id)
                h.view.cached_tokens = 0
        if decision.idle:
            self._set_kv()
            return report
        work = [PrefillWork(self._live[p.seq_id].view, p.n_tokens) for p in decision.prefill]
        dec = [self._live[s] for s in decision.decode]
        now = self.clock()
        for h in [*(self._live[p.seq_id] for p in decision.prefill), *dec]:
            if h.first_step_s is None:
                h.first_step_s = now
        self.hooks.before_step()
        t0 = self.clock()
        ok = True
        pre_out: list[int | None] = []
        dec_out: list[int] = []
        try:
            pre_out = self._call(lambda: self.model.prefill(work), [w.seq for w in work], report)
            dec_out = self._call(
                lambda: self.model.decode([h.view for h in dec]), [h.view for h in dec], report
            )
        finally:
            busy = self.clock() - t0
            ok = not report.failed
            self.hooks.after_step(busy, ok)
        report.busy_s = busy
        for h in self._live.values():
            h.in_last_step = False
        t_emit = self.clock()
        for w, tok in zip(work, pre_out, strict=False):
            h = self._live[w.seq.seq_id]
            h.view.cached_tokens += w.n_tokens
            h.in_last_step = True
            self._count(prefill_tokens=w.n_tokens)
            if tok is not None:
                self._token(h, tok, t_emit, report)
        for h, tok in zip(dec, dec_out, strict=False):
            h.view.cached_tokens += 1
            h.in_last_step = True
            self._token(h, tok, t_emit, report)
        self._count(steps=1, busy_s=busy)
        self._set_kv()
        return report

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until no sequence is live; the number of steps run."""
        n = 0
        while self.has_work and n < max_steps:
            self.step()
            n += 1
        return n

    def close(self) -> None:
        """Cancel every live and submitted sequence now (engine thread): their KV is freed."""
        with self._cond:
            new, self._incoming = self._incoming, []
        for h in new:
            self._live[h.seq_id] = h
        for h in list(self._live.values()):
            self._finish(h, FinishReason.CANCELLED)
            self._count(cancelled=1)
        self._set_kv()

    def serve(self, stop: threading.Event, idle_wait_s: float = 0.05) -> None:
        """The engine thread's loop: step while there is work, else ``hooks.idle()`` and wait
        for a submission (or ``stop``)."""
        while not stop.is_set():
            if self.has_work and not self.step().decision.idle:
                continue
            self.hooks.idle()
            with self._cond:
                if not self._incoming and not self._cancel:
                    self._cond.wait(idle_wait_s)

    # -- internals ------------------------------------------------------------------------------

    def _take_new(self) -> None:
        with self._cond:
            new, self._incoming = self._incoming, []
            cancel, self._cancel = self._cancel, set()
        for h in new:
            self._live[h.seq_id] = h
        for sid in cancel:
            gone = self._live.get(sid)
            if gone is not None:
                self._finish(gone, FinishReason.CANCELLED)
                self._count(cancelled=1)

    def _snapshot(self) -> StepSnapshot:
        seqs = tuple(
            SeqSnapshot(
                seq_id=h.seq_id,
                prompt_tokens=h.prompt_tokens,
                generated_tokens=len(h.view.token_ids) - h.prompt_tokens,
                max_tokens=h.view.params.max_tokens,
                cached_tokens=h.view.cached_tokens,
                priority=h.priority,
                arrival_ms=h.submitted_s * 1000.0,
                in_last_step=h.in_last_step,
            )
            for h in self._live.values()
        )
        return StepSnapshot(seqs, self.clock() * 1000.0, self._kv_cap)

    def _plan(self) -> StepDecision:
        """The policy's decision, with a KV limit the grant hook accepted (re-planned under
        the limit held when a grow is refused)."""
        decision = plan_step(self._snapshot(), self.config)
        if decision.kv_limit_bytes > self._kv_limit and self.kv_grant is not None:
            if self.kv_grant(decision.kv_limit_bytes):
                self._kv_limit = decision.kv_limit_bytes
            else:
                self._kv_cap = self._kv_limit
                decision = plan_step(self._snapshot(), self.config)
        elif decision.kv_limit_bytes > self._kv_limit:
            self._kv_limit = decision.kv_limit_bytes
        return decision

    def _set_kv(self) -> None:
        """Count the KV held; shrink the limit by steps when it is no longer needed."""
        bpt = self.spec.kv_bytes_per_token
        kv = sum(h.view.cached_tokens for h in self._live.values()) * bpt
        running = sum(1 for h in self._live.values() if h.view.cached_tokens > 0)
        want = kv_limit(kv, self.config.kv)
        if want < self._kv_limit:
            if self.kv_grant is not None:
                self.kv_grant(want)  # a shrink is always granted
            self._kv_limit = want
        with self._cond:
            self._c = replace(
                self._c,
                running=running,
                waiting=len(self._live) - running,
                kv_bytes=kv,
                kv_limit_bytes=self._kv_limit,
            )

    def _call(self, fn: Callable[[], Any], views: list[SeqView], report: StepReport) -> Any:
        """The handler's call; when it raises, its sequences fail (never the engine)."""
        if not views:
            return []
        try:
            return fn()
        except Exception as e:
            msg = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
            for v in views:
                report.failed.append(v.seq_id)
                self._finish(self._live[v.seq_id], FinishReason.ERROR, error=msg)
            return []

    def _token(self, h: SequenceHandle, tok: int, now: float, report: StepReport) -> None:
        h.view.token_ids.append(tok)
        h.token_times_s.append(now)
        self._count(tokens_generated=1)
        reason: FinishReason | None = None
        if (
            self.spec.eos_token_id is not None
            and tok == self.spec.eos_token_id
            and not h.view.params.ignore_eos
        ):
            text, reason = "", FinishReason.STOP
        else:
            text, stopped = h.text.push(self.model.token_bytes(tok))
            if stopped:
                reason = FinishReason.STOP
        if reason is None and (
            len(h.generated) >= h.view.params.max_tokens
            or len(h.view.token_ids) >= self.spec.max_context_tokens
        ):
            reason = FinishReason.LENGTH
        if reason is None:
            h._emit(Chunk(h.seq_id, text, (tok,)))
        else:
            self._finish(h, reason, text=text, token=tok)
            report.finished.append(h.seq_id)

    def _finish(
        self,
        h: SequenceHandle,
        reason: FinishReason,
        *,
        text: str = "",
        token: int | None = None,
        error: str = "",
    ) -> None:
        self.model.free(h.seq_id)
        h.view.cached_tokens = 0
        self._live.pop(h.seq_id, None)
        self._kv_cap = None  # memory freed: a grow may be granted again
        if not error:
            text += h.text.flush()
        h.finished, h.finish_reason = True, reason
        self._count(finished=1)
        h._emit(
            Chunk(h.seq_id, text, () if token is None else (token,), reason, error, h.timings())
        )

    def _count(self, **add: float) -> None:
        with self._cond:
            self._c = replace(self._c, **{k: getattr(self._c, k) + v for k, v in add.items()})


__all__ = [
    "EngineCounters",
    "GenerationEngine",
    "NoHooks",
    "SequenceHandle",
    "StepHooks",
    "StepReport",
    "engine_config",
]
