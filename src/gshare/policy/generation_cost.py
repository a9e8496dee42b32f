"""The time of one generation step, as a function of what the step runs: the simulator's
decode-step model, fitted on the live engine's steps.

Also the busy time per generation the autoscaler sizes a generative function with
(``busy_ms_per_generation``).

Who calls it: ``sim.generative.SimGenerativeInstance`` prices every step ``plan_step`` decides
(``StepCostModel.step_ms`` over ``step_features``); ``bench/generate.py --fit-profile`` fits the
coefficients (``fit_step_cost``) on the steps of the real engine and writes them as a
``StepCostModel`` document (``gshare/data/generative_step_profile.json``, read by
``load_step_profile`` in ``sim.generative``). Pure: numpy only, no clock, no I/O.

The model, linear in the features of one step (``StepFeatures``)::

    step_ms = base + chunk · prefill chunks + prefill_token · prefill tokens
              + [decode] (decode_base + decode_seq · batch + decode_ctx · context / 1000)
              + [rebuilt] (rebuild_base + rebuild_ctx · context / 1000)

``prefill chunks`` counts the sequences that prefill in the step (each is its own forward in
the built-in), ``batch`` the decoding sequences, ``context`` their context tokens summed (the
attention and the KV read grow with it), ``rebuilt`` whether the set of decoding sequences
differs from the last step's (the built-in then restacks its padded KV batch). What must hold:
every coefficient is >= 0 (the fit is non-negative least squares), so a step never costs less
for running more.

NOTE: Orca (Yu et al., OSDI '22) §3 — the iteration is the unit of scheduling, so it is the
unit of time here: its latency is the prefill tokens it processes plus a decode cost growing with
the batch and the context its attention reads, the coefficients measured (not from FLOPs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from gshare.policy.generation import SeqSnapshot, StepDecision


class StepCostError(ValueError):
    """A profile document that cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """What one step runs (module doc)."""

    prefill_chunks: int = 0
    prefill_tokens: int = 0
    decode_seqs: int = 0
    decode_context_tokens: int = 0
    rebuilt: bool = False
    tokens_out: int = 0
    """Sequences that get a token at the end of the step (decodes, and prefill chunks that end
    their pending tokens): the chunks a live instance sends."""

    def row(self) -> list[float]:
        """The regressors, in ``COEFFICIENTS`` order."""
        d = 1.0 if self.decode_seqs else 0.0
        r = 1.0 if self.rebuilt and self.decode_seqs else 0.0
        ctx_k = self.decode_context_tokens / 1000.0
        return [
            1.0,
            float(self.prefill_chunks),
            float(self.prefill_tokens),
            d,
            float(self.decode_seqs),
            ctx_k,
            r,
            r * ctx_k,
        ]


COEFFICIENTS = (
    "base_ms",
    "chunk_ms",
    "prefill_token_ms",
    "decode_base_ms",
    "decode_seq_ms",
    "decode_ctx_ms_per_1k",
    "rebuild_base_ms",
    "rebuild_ctx_ms_per_1k",
)


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Fitted coefficients (ms) of one model on one machine, and how they were measured."""

    model: str
    kv_bytes_per_token: int
    max_context_tokens: int
    base_ms: float = 0.0
    chunk_ms: float = 0.0
    prefill_token_ms: float = 0.0
    decode_base_ms: float = 0.0
    decode_seq_ms: float = 0.0
    decode_ctx_ms_per_1k: float = 0.0
    rebuild_base_ms: float = 0.0
    rebuild_ctx_ms_per_1k: float = 0.0
    frontend_ms: float = 0.0
    """A request's time outside the engine's steps on a live server (the API exchange, the
    gateway and the instance's wire): added to its time to first token."""
    step_overhead_ms: float = 0.0
    """A live instance's time per step beyond the in-process engine's (the token gate, the
    step's frames): added to every step."""
    token_overhead_ms: float = 0.0
    """A live server's time per token sent beyond the in-process engine's (the chunk through
    the wire, the gateway and the stream, on the same CPUs): times ``tokens_out``."""
    measured_on: str = ""
    """The measurement the coefficients were fitted on (machine, threads, load)."""
    fit: Mapping[str, float] | None = None
    """The fit's quality (``r2``, ``mape``, ``steps``)."""

    def coefficients(self) -> list[float]:
        return [float(getattr(self, c)) for c in COEFFICIENTS]

    def step_ms(self, f: StepFeatures) -> float:
        """The predicted time of a step with features ``f`` (a live instance's: the in-process
        step plus ``step_overhead_ms`` and ``token_overhead_ms`` per token out)."""
        engine = float(np.dot(self.coefficients(), f.row()))
        return engine + self.step_overhead_ms + self.token_overhead_ms * f.tokens_out

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["fit"] = dict(self.fit or {})
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> StepCostModel:
        """``StepCostError`` naming the first bad field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise StepCostError(f"unknown field(s) {', '.join(unknown)} (known: {sorted(known)})")
        for req in ("model", "kv_bytes_per_token", "max_context_tokens"):
            if req not in doc:
                raise StepCostError(f"{req}: required")
        for c in (*COEFFICIENTS, "frontend_ms", "step_overhead_ms", "token_overhead_ms"):
            v = doc.get(c, 0.0)
            if not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
                raise StepCostError(f"{c}: must be a finite number >= 0 (ms), got {v!r}")
        return cls(**{k: v for k, v in doc.items()})


def step_features(
    decision: StepDecision,
    seqs: Mapping[str, SeqSnapshot],
    last_decode: frozenset[str],
) -> StepFeatures:
    """The features of ``decision`` over the snapshot's sequences (by id); ``last_decode``:
    the ids that decoded in the previous step (``rebuilt`` when the set changed)."""
    dec = decision.decode
    done = sum(1 for p in decision.prefill if seqs[p.seq_id].pending_tokens == p.n_tokens)
    return StepFeatures(
        prefill_chunks=len(decision.prefill),
        prefill_tokens=sum(p.n_tokens for p in decision.prefill),
        decode_seqs=len(dec),
        decode_context_tokens=sum(seqs[s].context_tokens for s in dec),
        rebuilt=bool(dec) and frozenset(dec) != last_decode,
        tokens_out=len(dec) + done,
    )


def fit_step_cost(
    features: Sequence[StepFeatures],
    step_ms: Sequence[float],
    *,
    model: str,
    kv_bytes_per_token: int,
    max_context_tokens: int,
    measured_on: str = "",
) -> StepCostModel:
    """Non-negative least squares of ``step_ms`` on the features (module doc); the fit's
    ``r2`` and mean absolute percentage error in ``fit``. At least ``len(COEFFICIENTS)``
    steps."""
    from scipy.optimize import nnls

    if len(features) != len(step_ms) or len(features) < len(COEFFICIENTS):
        raise StepCostError(
            f"need as many step times as features, at least {len(COEFFICIENTS)}: "
            f"{len(features)} features, {len(step_ms)} times"
        )
    x = np.array([f.row() for f in features], dtype=np.float64)
    y = np.asarray(step_ms, dtype=np.float64)
    coef, _ = nnls(x, y)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
    mape = float(np.mean(np.abs(pred - y) / np.maximum(y, 1e-9)))
    return StepCostModel(
        model=model,
        kv_bytes_per_token=kv_bytes_per_token,
        max_context_tokens=max_context_tokens,
        measured_on=measured_on,
        fit={"r2": 1.0 - ss_res / ss_tot, "mape": mape, "steps": float(len(y))},
        **{c: float(v) for c, v in zip(COEFFICIENTS, coef, strict=True)},
    )


def busy_ms_per_generation(engines: Sequence[Mapping[str, float]]) -> float | None:
    """A generative function's busy time per request, for the autoscaler: its engines' busy
    time over the sequences they finished (the engines' ``EngineCounters`` as the gateway last
    received them: ``busy_s``, ``finished``), in ms; None before any finished.

    Who calls it: ``runtime.control.loop`` at every period, in place of the gateway's compute
    time per item (a generation answers in chunks, not with one batch's compute time). A
    request then costs its share of the steps it ran in, which grows with its prompt and
    generated tokens, so the throughput the autoscaler divides the arrival rate by —
    ``quota × 1000 / busy ms`` — is in generations of the kind arriving: the instances are
    sized on token demand, at the batching the engines achieved."""
    finished = sum(float(e.get("finished", 0.0)) for e in engines)
    if finished <= 0:
        return None
    return 1000.0 * sum(float(e.get("busy_s", 0.0)) for e in engines) / finished


__all__ = [
    "COEFFICIENTS",
    "busy_ms_per_generation",
    "StepCostError",
    "StepCostModel",
    "StepFeatures",
    "fit_step_cost",
    "step_features",
]
