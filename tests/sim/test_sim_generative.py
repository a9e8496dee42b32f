"""The simulated generative instance (``sim.generative``): the live engine's policy
(``plan_step``) per step in virtual time, each step priced by the fitted step model. Checked:
token counts and times, continuous batching (a late request joins the running steps) against
request-level batching (it waits), priorities per step, refusals, the shipped profile."""

from __future__ import annotations

import math

import pytest

from gshare.policy.generation import BatchingMode
from gshare.policy.generation_cost import StepCostError, StepCostModel, StepFeatures
from gshare.sim.engine import EventLoop
from gshare.sim.generative import (
    SimGeneration,
    SimGenerativeInstance,
    instance_config,
    load_step_profile,
)

COST = StepCostModel("m", 1024, 512, base_ms=1.0, chunk_ms=1.0, prefill_token_ms=0.01,
                     decode_base_ms=0.5, decode_seq_ms=0.1)  # fmt: skip


def _run(
    reqs: list[tuple[float, int, int, int]], **overrides: object
) -> tuple[list[SimGeneration], SimGenerativeInstance]:
    """(arrival_ms, prompt, max_tokens, priority) each; every request's record, in order."""
    loop = EventLoop()
    done: list[SimGeneration] = []
    inst = SimGenerativeInstance(loop, "i0", instance_config(COST, 8, overrides), COST, done.append)
    gens = [SimGeneration(i, "gen", t, p, m, prio) for i, (t, p, m, prio) in enumerate(reqs)]
    for g in gens:
        loop.at(g.arrival_ms, lambda g=g: inst.enqueue(g))
    loop.run()
    assert len(done) == len(gens) and len({g.request_id for g in done}) == len(gens)
    return gens, inst


def test_a_request_alone_gets_its_tokens_one_step_each() -> None:
    (g,), inst = _run([(0.0, 100, 10, 0)])
    assert g.finish == "length" and g.generated == 10 and len(g.token_times_ms) == 10
    assert all(b > a for a, b in zip(g.token_times_ms, g.token_times_ms[1:], strict=False))
    # 100 prompt tokens in chunks of 64: two prefill steps, then 9 decodes
    assert inst.steps == 2 + 9
    prefill = COST.step_ms(StepFeatures(1, 64)) + COST.step_ms(StepFeatures(1, 36))
    assert g.ttft_ms == pytest.approx(prefill)
    decode = COST.step_ms(StepFeatures(decode_seqs=1, decode_context_tokens=101))
    assert g.tpot_ms is not None and g.tpot_ms > decode * 0.99


def test_continuous_batching_lets_a_late_request_join_while_request_level_waits() -> None:
    reqs = [(0.0, 20, 200, 0), (50.0, 20, 5, 0)]
    (long_c, short_c), cont = _run(reqs)
    assert cont.max_batch_seen == 2
    assert short_c.token_times_ms[-1] < long_c.token_times_ms[-1]  # it left first
    (long_r, short_r), _ = _run(reqs, mode=BatchingMode.REQUEST)
    assert short_r.token_times_ms[0] > long_r.token_times_ms[-1]  # after the whole batch
    assert short_c.ttft_ms is not None and short_r.ttft_ms is not None
    assert short_c.ttft_ms < short_r.ttft_ms


def test_a_high_priority_request_takes_the_steps_from_the_low_ones() -> None:
    reqs = [(0.0, 10, 100, 1), (0.0, 10, 100, 1), (20.0, 10, 20, 8)]
    (lo1, lo2, hi), inst = _run(reqs)
    start, end = hi.token_times_ms[0], hi.token_times_ms[-1]
    for lo in (lo1, lo2):  # fill_tokens 0: the low class waits while the high one runs
        assert not [t for t in lo.token_times_ms if start < t < end]
        assert lo.generated == 100
    assert inst.preemptions >= 2
    (lo1e, _, hie), _ = _run(reqs, fikit=False)
    assert [t for t in lo1e.token_times_ms if hie.token_times_ms[0] < t < hie.token_times_ms[-1]]


def test_a_request_past_the_context_is_refused_and_the_others_go_on() -> None:
    (bad, ok), _ = _run([(0.0, 500, 100, 0), (0.0, 10, 4, 0)])
    assert bad.finish == "refused" and "context" in bad.error and not bad.token_times_ms
    assert ok.finish == "length" and ok.generated == 4


def test_the_shipped_profile_of_the_tiny_model_loads() -> None:
    cost = load_step_profile("causal-lm-tiny")
    assert cost.kv_bytes_per_token == 1024 and cost.max_context_tokens == 512
    assert cost.measured_on and cost.fit and cost.fit["r2"] > 0.5
    one = cost.step_ms(StepFeatures(decode_seqs=1, decode_context_tokens=100))
    assert 0 < one < math.inf
    with pytest.raises(StepCostError, match="generate_fit.py --model nope"):
        load_step_profile("causal-lm-nope")
