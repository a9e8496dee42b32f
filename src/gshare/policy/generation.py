"""Iteration-level batching of a generative function: which sequences run in the next step.

Who calls it: the instance's generation engine (``runtime.instance.generative.engine``) before
every step, with a snapshot of its live sequences, the clock and the KV memory it may use; the
simulator's decode-step model will call it the same way. Pure: no torch, no clock, no I/O.

One step feeds every chosen sequence some of its *pending* tokens — those whose KV is not
cached yet — through the model: a decoding sequence feeds its last token (1), a sequence in
prefill feeds a chunk of its prompt (or, after its KV was dropped, of its prompt and generated
tokens: the recompute). A chunk that reaches the end of the pending tokens yields the next
token. The decision (``StepDecision``) lists the prefill chunks, the decodes, the sequences
preempted at this step boundary and those refused, and the KV limit the step needs.

The rule (``plan_step``):

1. **Refusals** (``RefuseReason``): a sequence whose prompt plus ``max_tokens`` exceeds the
   model's context, or whose KV at that length exceeds the plan's ``max_bytes`` (it could
   never fit, even alone), or that waited longer than ``max_wait_ms`` before its first step.
   A refusal ends one request with a clear message; the instance goes on.
2. **Order**: by priority class (higher first; FIKIT on) — with ``fikit`` off every sequence
   is in one class — then within a class the decodes before the prefills, each by arrival.
   ``BatchingMode.REQUEST`` (the baseline of request-level batching) instead runs the current
   batch to its end, admitting up to ``max_batch_seqs`` new sequences only when it is empty,
   each prefilled whole in one step.
3. **Budgets**: at most ``max_batch_seqs`` sequences and ``max_step_tokens`` tokens per step,
   of which at most ``max_prefill_tokens`` prefill tokens (chunked prefill: a long prompt takes
   several steps and never stalls the decodes of the others for more than one chunk). With
   FIKIT, while a higher class has a sequence in the step, lower classes may add at most
   ``fill_tokens`` tokens (0: they wait) — their steps fill the gaps the higher class leaves.
4. **KV memory** (BulkX steps): the bytes held after the step are the cached tokens of every
   sequence that keeps its KV plus the tokens fed now, times ``kv_bytes_per_token``; the limit
   the step asks for is the smallest ``init + k·step`` covering them, at most the cap (the
   plan's ``max_bytes``, or less when the node's memory ledger refused a grow). A sequence that
   would pass the cap first takes the KV of lower-ranked sequences that are not in the step
   (they are preempted, their KV dropped); when none is left, a decoding sequence is itself
   preempted with its KV dropped, a prefill waits — and when nothing else holds KV (nothing
   will free) it is refused (``KV_UNAVAILABLE``).
5. **Preemption** (``Preempt``) happens only at a step boundary: a sequence that ran in the
   last step and is not chosen now. Its KV is **kept** when it lost its place to priority or
   the budget (it resumes with a decode, no recompute, its cache counted in memory all along)
   and **dropped** only when memory is needed (``drop_kv``: it resumes by recomputing its
   prompt and generated tokens as a prefill). Either way its output is the same: greedy tokens
   do not depend on the batch, and sampled ones are seeded by position.

NOTE: Orca (Yu et al., OSDI '22) §3 — iteration-level scheduling: requests join and leave the
batch between iterations; chunked prefill bounds a step's prefill tokens.
NOTE: FIKIT §3.2 — priority classes: a higher class's work first; a lower class runs only in
the gaps it leaves (here: ``fill_tokens`` per step), preempted at a step (its kernel) boundary.
NOTE: BulkX §3 — memory grows by steps as the input needs it (here: the KV cache, per token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_MAX_BATCH_SEQS = 16
"""Sequences per step of a live instance (and its simulated twin) whose function's
``batching.max_batch`` is 1 (the default): one sequence at a time is what continuous batching
exists to avoid."""


class GenerationPolicyError(ValueError):
    """A bad parameter of the policy; the message names it."""


class BatchingMode(StrEnum):
    CONTINUOUS = "continuous"
    """Orca's iteration-level batching (module doc)."""
    REQUEST = "request"
    """The baseline: a batch runs until all its sequences finish; ``max_batch_seqs`` 1 is one
    request at a time."""


class RefuseReason(StrEnum):
    CONTEXT = "context"
    KV_MAX = "kv_max"
    KV_UNAVAILABLE = "kv_unavailable"
    WAITED = "waited"


class PreemptReason(StrEnum):
    PRIORITY = "priority"
    """A higher class took the step (KV kept)."""
    BUDGET = "budget"
    """The step's sequence or token budget was spent before it (KV kept)."""
    MEMORY = "memory"
    """Its KV was taken for a higher-ranked sequence (KV dropped)."""


@dataclass(frozen=True, slots=True)
class KvPlan:
    """The KV cache's memory plan, bytes: starts at ``init_bytes``, grows by ``step_bytes``
    up to ``max_bytes`` (0: unbounded; ``step_bytes`` 0: one step per token's bytes)."""

    init_bytes: int = 0
    step_bytes: int = 0
    max_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StepConfig:
    """The engine's batching parameters and its model's sizes."""

    kv_bytes_per_token: int
    max_context_tokens: int
    kv: KvPlan = KvPlan()
    mode: BatchingMode = BatchingMode.CONTINUOUS
    max_batch_seqs: int = 16
    max_step_tokens: int = 256
    max_prefill_tokens: int = 64
    fikit: bool = True
    fill_tokens: int = 0
    max_wait_ms: float | None = None

    def check(self) -> None:
        """``GenerationPolicyError`` naming the first bad value."""
        if self.kv_bytes_per_token < 1:
            raise GenerationPolicyError(
                f"kv_bytes_per_token must be >= 1: {self.kv_bytes_per_token}"
            )
        if self.max_context_tokens < 2:
            raise GenerationPolicyError(
                f"max_context_tokens must be >= 2: {self.max_context_tokens}"
            )
        if min(self.max_batch_seqs, self.max_step_tokens, self.max_prefill_tokens) < 1:
            raise GenerationPolicyError("max_batch_seqs, max_step_tokens, max_prefill_tokens >= 1")
        if (
            self.fill_tokens < 0
            or min(self.kv.init_bytes, self.kv.step_bytes, self.kv.max_bytes) < 0
        ):
            raise GenerationPolicyError("fill_tokens and the KV plan's sizes must be >= 0")
        if self.kv.max_bytes and self.kv.init_bytes > self.kv.max_bytes:
            raise GenerationPolicyError("the KV plan's init_bytes exceeds its max_bytes")


@dataclass(frozen=True, slots=True)
class SeqSnapshot:
    """One live sequence as the engine sees it before a step."""

    seq_id: str
    prompt_tokens: int
    generated_tokens: int
    max_tokens: int
    cached_tokens: int = 0
    """Tokens whose KV the model holds (0: none: never started, or dropped)."""
    priority: int = 0
    """Higher runs first (gshare's classes: 9 highest)."""
    arrival_ms: float = 0.0
    in_last_step: bool = False

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    @property
    def pending_tokens(self) -> int:
        return self.context_tokens - self.cached_tokens

    @property
    def decoding(self) -> bool:
        return self.cached_tokens > 0 and self.pending_tokens == 1


@dataclass(frozen=True, slots=True)
class StepSnapshot:
    seqs: tuple[SeqSnapshot, ...]
    now_ms: float
    kv_cap_bytes: int | None = None
    """The most KV the instance may hold now: None for the plan's ``max_bytes``; less after
    the node's memory ledger refused a grow."""


@dataclass(frozen=True, slots=True)
class Prefill:
    seq_id: str
    n_tokens: int


@dataclass(frozen=True, slots=True)
class Preempt:
    seq_id: str
    drop_kv: bool
    reason: PreemptReason


@dataclass(frozen=True, slots=True)
class Refuse:
    seq_id: str
    reason: RefuseReason
    message: str


@dataclass(frozen=True, slots=True)
class StepDecision:
    prefill: tuple[Prefill, ...] = ()
    decode: tuple[str, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    refuse: tuple[Refuse, ...] = ()
    kv_bytes: int = 0
    """KV held after the step (every sequence that keeps its cache)."""
    kv_limit_bytes: int = 0
    """The limit the step needs: ``init + k·step`` covering ``kv_bytes``, at most the cap."""

    @property
    def idle(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(p.n_tokens for p in self.prefill)


def kv_limit(need_bytes: int, plan: KvPlan) -> int:
    """The smallest ``init + k·step`` (k >= 0) covering ``need_bytes``, at most ``max_bytes``
    when it is set (``step_bytes`` 0: exactly the need)."""
    if need_bytes <= plan.init_bytes:
        return plan.init_bytes
    if plan.step_bytes <= 0:
        limit = need_bytes
    else:
        limit = (
            plan.init_bytes
            + math.ceil((need_bytes - plan.init_bytes) / plan.step_bytes) * plan.step_bytes
        )
    return min(limit, plan.max_bytes) if plan.max_bytes else limit


def _refusal(s: SeqSnapshot, cfg: StepConfig, now_ms: float) -> Refuse | None:
    final = s.prompt_tokens + s.max_tokens
    if final > cfg.max_context_tokens:
        return Refuse(
            s.seq_id,
            RefuseReason.CONTEXT,
            (
                f"the prompt ({s.prompt_tokens} tokens) plus max_tokens ({s.max_tokens}) "
                f"exceeds the model's context of {cfg.max_context_tokens} tokens"
            ),
        )
    need = final * cfg.kv_bytes_per_token
    if cfg.kv.max_bytes and need > cfg.kv.max_bytes:
        return Refuse(
            s.seq_id,
            RefuseReason.KV_MAX,
            (
                f"the prompt ({s.prompt_tokens} tokens) plus max_tokens ({s.max_tokens}) needs "
                f"{need} bytes of KV cache ({final} tokens x "
                f"{cfg.kv_bytes_per_token} bytes) but the function's KV memory is at most "
                f"{cfg.kv.max_bytes} bytes"
            ),
        )
    if (
        cfg.max_wait_ms is not None
        and s.cached_tokens == 0
        and s.generated_tokens == 0
        and now_ms - s.arrival_ms > cfg.max_wait_ms
    ):
        return Refuse(
            s.seq_id,
            RefuseReason.WAITED,
            (
                f"the request waited {now_ms - s.arrival_ms:.0f} ms for its first step, more than "
                f"max_wait_ms {cfg.max_wait_ms:.0f}"
            ),
        )
    return None


def plan_step(snap: StepSnapshot, cfg: StepConfig) -> StepDecision:
    """The next step's decision (module doc)."""
    cfg.check()
    bpt = cfg.kv_bytes_per_token
    cap = math.inf if not cfg.kv.max_bytes else float(cfg.kv.max_bytes)
    if snap.kv_cap_bytes is not None:
        cap = min(cap, float(snap.kv_cap_bytes))
    refused: list[Refuse] = []
    live: list[SeqSnapshot] = []
    for s in snap.seqs:
        r = _refusal(s, cfg, snap.now_ms)
        if r is None:
            live.append(s)
        else:
            refused.append(r)

    def rank(s: SeqSnapshot) -> tuple[int, float, str]:
        return (-s.priority if cfg.fikit else 0, s.arrival_ms, s.seq_id)

    ranked = sorted(live, key=rank)
    position = {s.seq_id: i for i, s in enumerate(ranked)}
    if cfg.mode is BatchingMode.REQUEST:
        batch = [s for s in ranked if s.cached_tokens > 0 or s.in_last_step]
        candidates = batch or ranked[: cfg.max_batch_seqs]
    else:  # per class: decodes first, then prefills (each by rank)
        candidates = sorted(ranked, key=lambda s: (rank(s)[0], not s.decoding, position[s.seq_id]))

    held = {s.seq_id: s.cached_tokens for s in live if s.cached_tokens > 0}
    kv_tokens = sum(held.values())
    top = max((s.priority for s in candidates), default=0)
    slots, budget, prefill_left, fill_left = (
        cfg.max_batch_seqs,
        cfg.max_step_tokens,
        cfg.max_prefill_tokens,
        cfg.fill_tokens,
    )
    chosen: dict[str, int] = {}
    dropped: dict[str, SeqSnapshot] = {}
    decodes: list[str] = []
    prefills: list[Prefill] = []
    for s in candidates:
        if slots == 0 or budget == 0:
            break
        if s.seq_id in dropped:  # its KV went to a higher-ranked sequence this step
            continue
        lower = cfg.fikit and s.priority < top
        if s.decoding:
            n = 1
        elif cfg.mode is BatchingMode.REQUEST:
            n = s.pending_tokens
        else:
            n = min(s.pending_tokens, prefill_left, budget)
        if lower:
            n = min(n, fill_left)
        if n <= 0:
            continue
        while (kv_tokens + n) * bpt > cap:
            victims = [
                v
                for v in ranked[position[s.seq_id] + 1 :]
                if v.seq_id in held and v.seq_id not in chosen and v.seq_id not in dropped
            ]
            if not victims:
                break
            v = victims[-1]
            dropped[v.seq_id] = v
            kv_tokens -= held[v.seq_id]
        if (kv_tokens + n) * bpt > cap:
            others = any(h != s.seq_id and h not in dropped for h in held)
            if not others:
                refused.append(
                    Refuse(
                        s.seq_id,
                        RefuseReason.KV_UNAVAILABLE,
                        (
                            f"the request's KV cache cannot grow to {(kv_tokens + n) * bpt} "
                            f"bytes: the instance may hold {int(cap)} bytes now "
                            "(the node's memory is taken)"
                        ),
                    )
                )
                if s.seq_id in held:
                    kv_tokens -= held[s.seq_id]
                    dropped.pop(s.seq_id, None)
            elif s.seq_id in held:  # cannot grow: give its KV back, recompute it later
                dropped[s.seq_id] = s
                kv_tokens -= held[s.seq_id]
            continue
        chosen[s.seq_id] = n
        kv_tokens += n
        slots -= 1
        budget -= n
        if lower:
            fill_left -= n
        if s.decoding:
            decodes.append(s.seq_id)
        else:
            prefill_left -= n if cfg.mode is BatchingMode.CONTINUOUS else 0
            prefills.append(Prefill(s.seq_id, n))

    refused_ids = {r.seq_id for r in refused}
    preempts = [
        Preempt(v.seq_id, True, PreemptReason.MEMORY)
        for v in dropped.values()
        if v.seq_id not in refused_ids
    ]
    chosen_top = max((s.priority for s in live if s.seq_id in chosen), default=None)
    for s in ranked:
        if (
            s.in_last_step
            and s.seq_id not in chosen
            and s.seq_id not in dropped
            and s.seq_id not in refused_ids
        ):
            by_priority = cfg.fikit and chosen_top is not None and s.priority < chosen_top
            preempts.append(
                Preempt(
                    s.seq_id, False, PreemptReason.PRIORITY if by_priority else PreemptReason.BUDGET
                )
            )
    kv_bytes = kv_tokens * bpt
    return StepDecision(
        prefill=tuple(prefills),
        decode=tuple(decodes),
        preempt=tuple(preempts),
        refuse=tuple(refused),
        kv_bytes=kv_bytes,
        kv_limit_bytes=int(min(kv_limit(kv_bytes, cfg.kv), max(cap, kv_bytes))),
    )


def plan_of(decision: StepDecision) -> Sequence[str]:
    """The ids that run in the step, prefills first (for logs and tests)."""
    return [p.seq_id for p in decision.prefill] + list(decision.decode)


__all__ = [
    "DEFAULT_MAX_BATCH_SEQS",
    "BatchingMode",
    "GenerationPolicyError",
    "KvPlan",
    "Preempt",
    "PreemptReason",
    "Prefill",
    "Refuse",
    "RefuseReason",
    "SeqSnapshot",
    "StepConfig",
    "StepDecision",
    "StepSnapshot",
    "kv_limit",
    "plan_of",
    "plan_step",
]
