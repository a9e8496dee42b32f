"""The decode-step cost model (``policy.generation_cost``): the fit recovers the coefficients
that generated the step times, never negative ones; the document round-trips and bad fields
are named; a step with more work never costs less; the busy time per generation the
autoscaler sizes a generative function with."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.policy.generation import Prefill, SeqSnapshot, StepDecision
from gshare.policy.generation_cost import (
    COEFFICIENTS,
    StepCostError,
    StepCostModel,
    StepFeatures,
    busy_ms_per_generation,
    fit_step_cost,
    step_features,
)

TRUE = StepCostModel("m", 1024, 512, 0.2, 0.5, 0.005, 0.25, 0.05, 0.15, 0.07, 0.6)


def _random_features(rng: np.random.Generator, n: int) -> list[StepFeatures]:
    out = []
    for _ in range(n):
        chunks = int(rng.integers(0, 3))
        dec = int(rng.integers(0, 17))
        out.append(
            StepFeatures(
                chunks,
                int(rng.integers(1, 65)) * chunks,
                dec,
                dec * int(rng.integers(4, 300)),
                bool(rng.integers(0, 2)),
            )
        )
    return out


def test_the_fit_recovers_the_coefficients_of_noiseless_steps() -> None:
    feats = _random_features(np.random.default_rng(1), 400)
    fitted = fit_step_cost(
        feats, [TRUE.step_ms(f) for f in feats], model="m", kv_bytes_per_token=1024,
        max_context_tokens=512,
    )  # fmt: skip
    assert fitted.coefficients() == pytest.approx(TRUE.coefficients(), abs=1e-6)
    assert fitted.fit is not None and fitted.fit["r2"] == pytest.approx(1.0)


def test_the_fit_never_gives_a_negative_coefficient() -> None:
    rng = np.random.default_rng(2)
    feats = _random_features(rng, 200)
    # step times that fall with the decode batch: least squares would go negative there
    times = [max(0.01, 3.0 - 0.1 * f.decode_seqs + rng.normal(0, 0.05)) for f in feats]
    fitted = fit_step_cost(feats, times, model="m", kv_bytes_per_token=1, max_context_tokens=8)
    assert all(c >= 0 for c in fitted.coefficients())


def test_too_few_steps_is_an_error() -> None:
    with pytest.raises(StepCostError, match="at least"):
        fit_step_cost([StepFeatures()], [1.0], model="m", kv_bytes_per_token=1,
                      max_context_tokens=8)  # fmt: skip


def test_more_work_in_a_step_never_costs_less() -> None:
    base = StepFeatures(1, 32, 4, 400, False)
    for more in (
        StepFeatures(2, 64, 4, 400, False),
        StepFeatures(1, 32, 8, 800, False),
        StepFeatures(1, 32, 4, 400, True),
    ):
        assert TRUE.step_ms(more) >= TRUE.step_ms(base)
    assert TRUE.step_ms(StepFeatures(decode_seqs=4, decode_context_tokens=400)) > TRUE.step_ms(
        StepFeatures(prefill_chunks=0)
    )


def test_the_document_round_trips_and_bad_fields_are_named() -> None:
    doc = TRUE.to_doc()
    assert StepCostModel.from_doc(doc) == StepCostModel.from_doc(doc)
    assert StepCostModel.from_doc(doc).coefficients() == TRUE.coefficients()
    with pytest.raises(StepCostError, match="decode_seq_ms"):
        StepCostModel.from_doc({**doc, "decode_seq_ms": -1.0})
    with pytest.raises(StepCostError, match="unknown field"):
        StepCostModel.from_doc({**doc, "typo_ms": 1.0})
    with pytest.raises(StepCostError, match="model: required"):
        StepCostModel.from_doc({k: v for k, v in doc.items() if k != "model"})
    assert set(COEFFICIENTS) <= set(doc)


def test_features_of_a_decision() -> None:
    seqs = {
        "a": SeqSnapshot("a", 10, 5, 20, cached_tokens=14),
        "b": SeqSnapshot("b", 30, 0, 20),
        "c": SeqSnapshot("c", 7, 2, 20, cached_tokens=8),
    }
    d = StepDecision(prefill=(Prefill("b", 30),), decode=("a", "c"))
    f = step_features(d, seqs, frozenset({"a", "c"}))
    assert f == StepFeatures(1, 30, 2, 15 + 9, False, tokens_out=3)
    assert step_features(d, seqs, frozenset({"a"})).rebuilt


def test_busy_per_generation_is_the_engines_busy_time_over_what_they_finished() -> None:
    assert busy_ms_per_generation([]) is None
    assert busy_ms_per_generation([{"busy_s": 2.0, "finished": 0}]) is None  # none yet
    two = [{"busy_s": 1.5, "finished": 10, "steps": 900}, {"busy_s": 0.5, "finished": 30}]
    assert busy_ms_per_generation(two) == pytest.approx(2000.0 / 40)
    # longer generations (more steps each) cost more per request: the autoscaler's throughput
    # (quota x 1000 / busy ms) falls with the tokens each request asks for
    short = busy_ms_per_generation([{"busy_s": 1.0, "finished": 100}])
    long = busy_ms_per_generation([{"busy_s": 4.0, "finished": 100}])
    assert short is not None and long is not None and long > short
