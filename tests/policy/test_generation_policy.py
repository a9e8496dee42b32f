"""policy.generation: the per-step decision of iteration-level batching (table tests and
invariants; pure, the clock passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.generation import (
    BatchingMode,
    GenerationPolicyError,
    KvPlan,
    Preempt,
    PreemptReason,
    Prefill,
    RefuseReason,
    SeqSnapshot,
    StepConfig,
    StepSnapshot,
    kv_limit,
    plan_step,
)

BPT = 10  # KV bytes per token in these tables


def cfg(**kw) -> StepConfig:
    base = dict(
        kv_bytes_per_token=BPT,
        max_context_tokens=1000,
        max_batch_seqs=4,
        max_step_tokens=64,
        max_prefill_tokens=16,
    )
    base.update(kw)
    return StepConfig(**base)


def dec(sid: str, ctx: int = 10, **kw) -> SeqSnapshot:
    """A decoding sequence: prompt 5, ctx - 5 generated, all but the last token cached."""
    return SeqSnapshot(sid, 5, ctx - 5, kw.pop("max_tokens", 50), ctx - 1, in_last_step=True, **kw)


def new(sid: str, prompt: int = 5, **kw) -> SeqSnapshot:
    return SeqSnapshot(sid, prompt, 0, kw.pop("max_tokens", 20), 0, **kw)


def plan(seqs, now_ms=0.0, cap=None, **kw):
    return plan_step(StepSnapshot(tuple(seqs), now_ms, cap), cfg(**kw))


@pytest.mark.parametrize(
    ("seqs", "kw", "prefill", "decode"),
    [
        # nothing live: idle
        ([], {}, [], []),
        # a new prompt shorter than the chunk: prefilled whole
        ([new("a", 5)], {}, [("a", 5)], []),
        # a long prompt: one chunk per step (chunked prefill), decodes of others go first
        ([dec("d"), new("a", 40)], {}, [("a", 16)], ["d"]),
        # the prefill budget is shared: the second prompt gets what is left
        ([new("a", 10, arrival_ms=0), new("b", 10, arrival_ms=1)], {}, [("a", 10), ("b", 6)], []),
        # a half-prefilled prompt continues from its cache
        ([SeqSnapshot("a", 40, 0, 8, 32)], {}, [("a", 8)], []),
        # the sequence budget: 4 per step, by arrival
        ([dec(f"d{i}", arrival_ms=i) for i in range(6)], {}, [], ["d0", "d1", "d2", "d3"]),
        # the token budget bounds a step
        ([dec("d"), new("a", 40)], {"max_step_tokens": 5}, [("a", 4)], ["d"]),
        # FIKIT: a higher class first, the lower class waits (fill 0) ...
        ([dec("lo", priority=1), dec("hi", priority=8)], {}, [], ["hi"]),
        # ... or fills the gap with up to fill_tokens tokens
        ([dec("lo", priority=1), dec("hi", priority=8)], {"fill_tokens": 1}, [], ["hi", "lo"]),
        # FIKIT off: one class, by arrival
        (
            [dec("lo", priority=1, arrival_ms=0), dec("hi", priority=8, arrival_ms=1)],
            {"fikit": False, "max_batch_seqs": 1},
            [],
            ["lo"],
        ),
        # recompute after a dropped KV: prompt + generated tokens are prefilled
        ([SeqSnapshot("r", 5, 3, 20, 0)], {}, [("r", 8)], []),
    ],
)
def test_continuous_table(seqs, kw, prefill, decode) -> None:
    d = plan(seqs, **kw)
    assert [(p.seq_id, p.n_tokens) for p in d.prefill] == prefill
    assert list(d.decode) == decode


def test_request_mode_runs_its_batch_to_the_end_and_prefills_whole() -> None:
    # a batch is running (holds KV): a new arrival waits, however idle the batch is
    d = plan([dec("a"), new("b", 40)], mode=BatchingMode.REQUEST)
    assert d.decode == ("a",) and d.prefill == ()
    # no batch: up to max_batch_seqs new ones, each prompt whole in one step
    d = plan([new(f"n{i}", 40, arrival_ms=i) for i in range(6)], mode=BatchingMode.REQUEST)
    assert d.prefill == tuple(Prefill(f"n{i}", 40) for i in range(4))
    d = plan([new("a", 3), new("b", 3, arrival_ms=1)], mode=BatchingMode.REQUEST, max_batch_seqs=1)
    assert [p.seq_id for p in d.prefill] == ["a"]


@pytest.mark.parametrize(
    ("seq", "kw", "reason", "says"),
    [
        (new("a", 990, max_tokens=20), {}, RefuseReason.CONTEXT, "context of 1000 tokens"),
        (
            new("a", 50, max_tokens=60),
            {"kv": KvPlan(0, 100, 1000)},
            RefuseReason.KV_MAX,
            "needs 1100 bytes",
        ),
        (new("a", 5, arrival_ms=0.0), {"max_wait_ms": 50.0}, RefuseReason.WAITED, "waited 100 ms"),
    ],
)
def test_refusals_name_the_limit(seq, kw, reason, says) -> None:
    d = plan([seq, dec("ok")], now_ms=100.0, **kw)
    assert [r.reason for r in d.refuse] == [reason]
    assert d.refuse[0].seq_id == "a" and says in d.refuse[0].message
    assert d.decode == ("ok",)  # the others go on


def test_priority_preemption_keeps_the_kv() -> None:
    d = plan([dec("lo", priority=1), dec("hi", priority=8), new("hi2", 4, priority=8)])
    assert d.preempt == (Preempt("lo", False, PreemptReason.PRIORITY),)
    # the kept KV still counts: 9 cached tokens each + 1 decode + 4 prefill
    assert d.kv_bytes == (9 + 9 + 1 + 4) * BPT


def test_budget_preemption_is_reported_as_budget() -> None:
    d = plan([dec("a", arrival_ms=0), dec("b", arrival_ms=1)], max_batch_seqs=1)
    assert d.preempt == (Preempt("b", False, PreemptReason.BUDGET),)


def test_kv_grows_by_steps_and_memory_takes_the_lowest_ranked_kv() -> None:
    plan_ = KvPlan(init_bytes=50, step_bytes=40, max_bytes=1000)
    d = plan([dec("a", ctx=10)], kv=plan_)  # 9 cached + 1 = 100 bytes -> 50 + 2*40
    assert (d.kv_bytes, d.kv_limit_bytes) == (100, 130)
    # cap 200: hi (19 cached + 1) = 200 fits only once lo's 9 tokens are dropped
    seqs = [dec("hi", ctx=20, priority=8), dec("lo", ctx=10, priority=1)]
    d = plan(seqs, cap=200, kv=plan_, fill_tokens=4)
    assert d.decode == ("hi",)
    assert d.preempt == (Preempt("lo", True, PreemptReason.MEMORY),)
    assert d.kv_bytes == 200 and d.kv_limit_bytes == 200


def test_a_decode_that_cannot_grow_drops_its_own_kv_and_a_lone_one_is_refused() -> None:
    seqs = [dec("a", ctx=20, arrival_ms=0), dec("b", ctx=10, arrival_ms=1)]
    d = plan(seqs, cap=19 * BPT + 9 * BPT + 1 * BPT)  # a fits; b cannot grow (a ranks first)
    assert d.decode == ("a",)
    assert d.preempt == (Preempt("b", True, PreemptReason.MEMORY),)
    d = plan([dec("a", ctx=20)], cap=19 * BPT)  # alone and cannot grow: refused, clearly
    assert [r.reason for r in d.refuse] == [RefuseReason.KV_UNAVAILABLE]
    assert "cannot grow" in d.refuse[0].message and d.kv_bytes == 0


def test_a_prefill_that_does_not_fit_waits_while_others_hold_kv() -> None:
    d = plan([dec("a", ctx=20), new("b", 10, arrival_ms=1)], cap=25 * BPT)
    assert d.decode == ("a",) and d.prefill == () and d.refuse == ()


def test_kv_limit_rule() -> None:
    assert kv_limit(0, KvPlan(50, 40, 1000)) == 50
    assert kv_limit(51, KvPlan(50, 40, 1000)) == 90
    assert kv_limit(990, KvPlan(50, 40, 1000)) == 1000  # capped at max
    assert kv_limit(123, KvPlan()) == 123  # no plan: exactly the need


def test_bad_config_is_named() -> None:
    with pytest.raises(GenerationPolicyError, match="max_batch_seqs"):
        plan([], max_batch_seqs=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 60), st.integers(0, 20), st.booleans(), st.integers(0, 9)),
        max_size=10,
    ),
    st.integers(20, 2000),
    st.booleans(),
)
def test_invariants(specs, cap, fikit) -> None:
    seqs = []
    for i, (prompt, gen, started, prio) in enumerate(specs):
        cached = prompt + gen - 1 if started and gen else 0
        seqs.append(SeqSnapshot(f"s{i}", prompt, gen, 40, cached, prio, float(i), bool(cached)))
    c = cfg(kv=KvPlan(0, 16, 0), fikit=fikit)
    d = plan_step(StepSnapshot(tuple(seqs), 0.0, cap), c)
    ids = [p.seq_id for p in d.prefill] + list(d.decode)
    assert len(ids) == len(set(ids)) <= c.max_batch_seqs  # each at most once, within budget
    assert d.tokens <= c.max_step_tokens
    assert sum(p.n_tokens for p in d.prefill) <= c.max_prefill_tokens
    assert d.kv_bytes <= cap and d.kv_limit_bytes >= d.kv_bytes
    gone = {p.seq_id for p in d.preempt} | {r.seq_id for r in d.refuse}
    assert not gone & set(ids)  # nothing runs that is preempted or refused
    by_id = {s.seq_id: s for s in seqs}
    for p in d.prefill:
        assert 1 <= p.n_tokens <= by_id[p.seq_id].pending_tokens
    for sid in d.decode:
        assert by_id[sid].decoding
    if fikit and ids:  # fill 0: one class per step, the highest live one
        assert {by_id[i].priority for i in ids} == {max(s.priority for s in seqs)}
