"""A simulated instance of a generative function: the live engine's step loop in virtual time.

Who calls it: ``experiments.scenario_generate`` (``gshare simulate`` on a scenario with a
generative function) and the tests. ``enqueue`` a ``SimGeneration`` at its arrival; the
instance runs steps back to back while it has work, each decided by the SAME pure policy as the
live engine (``policy.generation.plan_step``: continuous batching, chunked prefill, priorities,
KV memory by steps, refusals) on a snapshot of its sequences, and each lasting the time the
fitted step model predicts (``policy.generation_cost.StepCostModel`` over the step's features,
times Gaussian noise ``1 + noise_sigma · N(0, 1)``). A chunk that ends a sequence's pending
tokens, and every decode, gives that sequence a token at the end of the step (as the live
engine emits them); a sequence ends at ``max_tokens`` or the model's context (the simulator
has no end-of-sequence token: its twin runs the live requests with ``ignore_eos``), or when the
policy refuses it. New sequences join at the next step boundary, as in the live engine.

What must hold: a step starts only when the previous one ended; a sequence's token times are
increasing and it gets exactly ``max_tokens`` tokens unless refused; ``on_done`` is called once
per sequence. Not modelled: the device's time tokens between functions (an instance runs its
steps alone on its device) and the node's memory ledger (the KV plan's cap is the only limit).

Step profiles (``load_step_profile``): ``gshare/data/generative_step_profile.json`` maps a
built-in's name to a ``StepCostModel`` document, fitted by ``bench/generate_fit.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gshare.policy.generation import (
    DEFAULT_MAX_BATCH_SEQS,
    Prefill,
    SeqSnapshot,
    StepConfig,
    StepSnapshot,
    plan_step,
)
from gshare.policy.generation_cost import StepCostError, StepCostModel, step_features
from gshare.sim.engine import EventLoop

STEP_PROFILE = Path(__file__).resolve().parent.parent / "data" / "generative_step_profile.json"


def load_step_profile(model: str, path: Path | None = None) -> StepCostModel:
    """The fitted step model of built-in ``model`` (module doc); ``StepCostError`` naming the
    file and what to run when it has none."""
    p = path or STEP_PROFILE
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise StepCostError(f"{p}: cannot read the step profiles: {e}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict) or model not in models:
        known = ", ".join(sorted(models or {}))
        raise StepCostError(
            f"{p}: no step profile for model {model!r} (profiled: {known or 'none'}); fit one "
            f"with `python bench/generate_fit.py --model {model.removeprefix('causal-lm-')}`"
        )
    try:
        return StepCostModel.from_doc(models[model])
    except StepCostError as e:
        raise StepCostError(f"{p}: models.{model}: {e}") from None


@dataclass(slots=True)
class SimGeneration:
    """One generation request travelling through a simulated generative instance."""

    request_id: int
    function: str
    arrival_ms: float
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    generated: int = 0
    cached: int = 0
    in_last_step: bool = False
    token_times_ms: list[float] = field(default_factory=list)
    finish: str = ""
    """``length`` (max_tokens or the context), ``refused`` (with ``error``), or empty."""
    error: str = ""
    instance_id: str = ""

    @property
    def seq_id(self) -> str:
        return str(self.request_id)

    def snapshot(self) -> SeqSnapshot:
        return SeqSnapshot(
            seq_id=self.seq_id,
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated,
            max_tokens=self.max_tokens,
            cached_tokens=self.cached,
            priority=self.priority,
            arrival_ms=self.arrival_ms,
            in_last_step=self.in_last_step,
        )

    @property
    def ttft_ms(self) -> float | None:
        """Arrival to the first token (engine side: no front end)."""
        return self.token_times_ms[0] - self.arrival_ms if self.token_times_ms else None

    @property
    def tpot_ms(self) -> float | None:
        """First to last token over the tokens between (the live ``SequenceTimings``' rule)."""
        t = self.token_times_ms
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


class SimGenerativeInstance:
    """One generative instance (module doc)."""

    def __init__(
        self,
        loop: EventLoop,
        instance_id: str,
        config: StepConfig,
        cost: StepCostModel,
        on_done: Callable[[SimGeneration], None],
        *,
        rng: np.random.Generator | None = None,
        noise_sigma: float = 0.0,
    ) -> None:
        config.check()
        self.loop = loop
        self.instance_id = instance_id
        self.config = config
        self.cost = cost
        self.on_done = on_done
        self.rng = rng or np.random.default_rng(0)
        self.noise_sigma = noise_sigma
        self.live: dict[str, SimGeneration] = {}
        self.busy = False
        self.steps = 0
        self.busy_ms = 0.0
        self.preemptions = 0
        self.max_batch_seen = 0
        self._last_decode: frozenset[str] = frozenset()

    @property
    def outstanding(self) -> int:
        return len(self.live)

    def enqueue(self, g: SimGeneration) -> None:
        """``g`` joins at the next step boundary (now, when the instance is idle)."""
        g.instance_id = self.instance_id
        self.live[g.seq_id] = g
        if not self.busy:
            self.busy = True
            self.loop.after(0.0, self._step)

    def _step(self) -> None:
        snaps = {sid: g.snapshot() for sid, g in self.live.items()}
        decision = plan_step(StepSnapshot(tuple(snaps.values()), self.loop.now_ms), self.config)
        for r in decision.refuse:
            g = self.live.pop(r.seq_id)
            g.finish, g.error = "refused", r.message
            self.on_done(g)
        for p in decision.preempt:
            g = self.live[p.seq_id]
            g.in_last_step = False
            self.preemptions += 1
            if p.drop_kv:
                g.cached = 0
        if decision.idle:
            self.busy = False
            self._last_decode = frozenset()
            return
        f = step_features(decision, snaps, self._last_decode)
        self._last_decode = frozenset(decision.decode)
        ms = self.cost.step_ms(f)
        if self.noise_sigma > 0:
            ms *= max(0.1, 1.0 + self.noise_sigma * float(self.rng.standard_normal()))
        self.steps += 1
        self.busy_ms += ms
        self.max_batch_seen = max(self.max_batch_seen, len(decision.decode))
        self.loop.after(ms, lambda: self._step_done(decision.prefill, decision.decode))

    def _step_done(self, prefill: tuple[Prefill, ...], decode: tuple[str, ...]) -> None:
        now = self.loop.now_ms
        for g in self.live.values():
            g.in_last_step = False
        ran: list[tuple[SimGeneration, bool]] = []
        for p in prefill:
            g = self.live[p.seq_id]
            g.cached += p.n_tokens
            ran.append((g, g.cached == g.prompt_tokens + g.generated))
        for sid in decode:
            g = self.live[sid]
            g.cached += 1
            ran.append((g, True))
        for g, token in ran:
            g.in_last_step = True
            if not token:
                continue
            g.generated += 1
            g.token_times_ms.append(now)
            if (
                g.generated >= g.max_tokens
                or g.prompt_tokens + g.generated >= self.config.max_context_tokens
            ):
                g.finish = "length"
                del self.live[g.seq_id]
                self.on_done(g)
        self._step()


def instance_config(
    cost: StepCostModel, max_batch: int, overrides: Mapping[str, object] | None = None
) -> StepConfig:
    """The live instance's batching configuration for a function with ``batching.max_batch``
    (``DEFAULT_MAX_BATCH_SEQS`` when it is 1, as ``serving.EngineHost`` does)."""
    return StepConfig(
        kv_bytes_per_token=cost.kv_bytes_per_token,
        max_context_tokens=cost.max_context_tokens,
        max_batch_seqs=max_batch if max_batch > 1 else DEFAULT_MAX_BATCH_SEQS,
        **dict(overrides or {}),  # type: ignore[arg-type]
    )


__all__ = [
    "STEP_PROFILE",
    "SimGenerativeInstance",
    "SimGeneration",
    "instance_config",
    "load_step_profile",
]
