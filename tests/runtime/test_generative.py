"""The generative engine and the built-in causal LM (tiny, random weights, CPU): greedy decode
equals the model's own ``generate``, batching does not change any sequence's tokens, sequences
join and leave between steps, stop strings and ``max_tokens``, preemption and resume, KV memory
by steps, refusals, cancel. Behaviour and invariants only, no wall-clock asserts."""

from __future__ import annotations

import threading

import pytest
import torch

from gshare.policy.generation import KvPlan
from gshare.runtime.instance.generative.causal_lm import CausalLM, TinyCausalLM
from gshare.runtime.instance.generative.contract import (
    Chunk,
    FinishReason,
    GenerationParams,
    StepwiseHandler,
    StreamingHandler,
)
from gshare.runtime.instance.generative.engine import GenerationEngine, engine_config
from gshare.runtime.instance.generative.tokenizer import EOS_ID, ByteTokenizer, TextStream
from gshare.runtime.instance.models import InputError

PROMPTS = ["hello world", "a", "the quick brown fox jumps over", "gshare serves tokens"]


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    torch.set_num_threads(1)
    m = TinyCausalLM()
    m.load(None, "cpu")
    return m


def run_alone(lm: CausalLM, prompt: str, **params) -> tuple[list[int], str, FinishReason | None]:
    eng = GenerationEngine(lm)
    h = eng.submit(prompt, GenerationParams(**params))
    eng.run_until_idle()
    chunks = h.drain()
    return h.generated, "".join(c.text for c in chunks), chunks[-1].finish_reason


def test_contracts_are_implemented(lm: CausalLM) -> None:
    assert isinstance(lm, StepwiseHandler) and isinstance(lm, StreamingHandler)
    spec = lm.generation_spec()
    assert spec.kv_bytes_per_token == 2 * 2 * 64 * 4 and spec.max_context_tokens == 512


def test_greedy_is_deterministic_and_equals_the_models_own_generate(lm: CausalLM) -> None:
    assert lm.module is not None
    for prompt in PROMPTS[:2]:
        ours, _, reason = run_alone(lm, prompt, max_tokens=40)
        assert run_alone(lm, prompt, max_tokens=40)[0] == ours
        ids = torch.tensor([lm.encode_prompt(prompt)])
        ref = lm.module.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=40,
            do_sample=False,
            pad_token_id=258,
        )
        theirs = ref[0, ids.shape[1] :].tolist()
        assert ours == theirs, prompt  # the EOS included when it came
        assert (reason is FinishReason.STOP) == (ours[-1] == EOS_ID)


def test_batched_decode_of_different_lengths_equals_each_alone(lm: CausalLM) -> None:
    alone = [run_alone(lm, p, max_tokens=24)[0] for p in PROMPTS]
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=8))
    hs = [eng.submit(p, GenerationParams(max_tokens=24)) for p in PROMPTS]
    widths = []
    while eng.has_work:
        widths.append(len(eng.step().decision.decode))
    assert max(widths) == len(PROMPTS)  # they really were decoded together
    assert [h.generated for h in hs] == alone


def test_sequences_join_and_leave_between_steps(lm: CausalLM) -> None:
    alone_a = run_alone(lm, PROMPTS[0], max_tokens=6)[0]
    alone_b = run_alone(lm, PROMPTS[2], max_tokens=20)[0]
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=8))
    a = eng.submit(PROMPTS[0], GenerationParams(max_tokens=6))
    eng.step()
    eng.step()
    b = eng.submit(PROMPTS[2], GenerationParams(max_tokens=20))  # joins a running batch
    r = eng.step()
    assert [p.seq_id for p in r.decision.prefill] == [b.seq_id]
    assert r.decision.decode == (a.seq_id,)
    both = 0
    while eng.has_work:
        a_done = a.finished
        d = eng.step().decision
        both += set(d.decode) == {a.seq_id, b.seq_id}
        if a_done:
            assert a.seq_id not in d.decode  # it left the batch; b goes on
    assert both >= 1 and a.generated == alone_a and b.generated == alone_b
    assert len(a.generated) == 6 and a.finish_reason is FinishReason.LENGTH


def test_churning_batch_keeps_every_sequence_equal_to_it_alone(lm: CausalLM) -> None:
    """Sequences of random lengths join at random steps, the longest leave first or last, a
    high-priority arrival pauses the others: the persistent batch is rebuilt incrementally
    (rows kept as a block, shifted; joiners stacked in; freed rows dropped; paused rows cut
    back out), and no sequence's tokens change."""
    import random

    rng = random.Random(7)
    reqs = [
        (
            "".join(chr(rng.randrange(97, 123)) for _ in range(rng.randrange(1, 60))),
            rng.randrange(2, 30),
            8 if i % 7 == 6 else 1,
        )
        for i in range(18)
    ]
    alone = [run_alone(lm, p, max_tokens=n, ignore_eos=True)[0] for p, n, _ in reqs]
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=5, fikit=True, fill_tokens=0))
    pending, hs, widths = list(reqs), [], set()
    while pending or eng.has_work:
        for _ in range(rng.randrange(0, 3)):
            if pending:
                p, n, prio = pending.pop(0)
                hs.append(
                    eng.submit(p, GenerationParams(max_tokens=n, ignore_eos=True), priority=prio)
                )
        if eng.has_work:
            widths.add(len(eng.step().decision.decode))
    assert [h.generated for h in hs] == alone
    assert max(widths) == 5 and len(widths) >= 4  # the batch really grew and shrank
    assert lm._batch is None and not lm._kv  # every sequence freed: no cache is held


def test_stop_strings_and_max_tokens(lm: CausalLM) -> None:
    tokens, text, reason = run_alone(lm, PROMPTS[3], max_tokens=30)
    assert reason is FinishReason.LENGTH and len(tokens) == 30
    assert text == ByteTokenizer().decode(tokens)
    stop = text[6:8]
    cut = text.find(stop)
    _, stopped, reason = run_alone(lm, PROMPTS[3], max_tokens=30, stop=(stop, "\x00never"))
    assert reason is FinishReason.STOP and stopped == text[:cut]


def test_text_stream_holds_back_a_possible_stop_prefix() -> None:
    s = TextStream(["END"])
    assert s.push(b"abcE") == ("abc", False)
    assert s.push(b"N") == ("", False)
    assert s.push(b"x") == ("ENx", False)  # not a stop after all: released
    assert s.push("é".encode()[:1]) == ("", False)  # half a UTF-8 character waits
    assert s.push("é".encode()[1:] + b"EN") == ("é", False)
    assert s.push(b"D!") == ("", True) and s.flush() == ""


def test_sampled_decoding_is_reproducible_per_seed_and_batch_independent(lm: CausalLM) -> None:
    p = dict(max_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    one = run_alone(lm, PROMPTS[0], **p)[0]
    assert run_alone(lm, PROMPTS[0], **p)[0] == one
    assert run_alone(lm, PROMPTS[0], **{**p, "seed": 8})[0] != one
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=4))
    h = eng.submit(PROMPTS[0], GenerationParams(**p))
    for q in PROMPTS[1:]:
        eng.submit(q, GenerationParams(max_tokens=16, temperature=1.0, seed=1))
    eng.run_until_idle()
    assert h.generated == one


def test_priority_preemption_at_step_boundaries_and_resume(lm: CausalLM) -> None:
    lo_alone = run_alone(lm, PROMPTS[2], max_tokens=20)[0]
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=8, fikit=True, fill_tokens=0))
    lo = eng.submit(PROMPTS[2], GenerationParams(max_tokens=20), priority=1)
    for _ in range(4):
        eng.step()
    hi = eng.submit(PROMPTS[0], GenerationParams(max_tokens=5), priority=8)
    r = eng.step()
    assert [(p.seq_id, p.drop_kv) for p in r.decision.preempt] == [(lo.seq_id, False)]
    assert lm.kv_tokens(lo.seq_id) > 0  # kept while it waits
    while not hi.finished:
        assert lo.seq_id not in eng.step().decision.decode
    eng.run_until_idle()
    assert lo.generated == lo_alone and lo.timings().preemptions == 1


def test_kv_grows_by_steps_and_a_refused_grow_preempts_then_recomputes(lm: CausalLM) -> None:
    bpt = lm.generation_spec().kv_bytes_per_token
    alone = [run_alone(lm, p, max_tokens=20)[0] for p in PROMPTS[:2]]
    asked: list[int] = []
    ceiling = 40 * bpt  # the node grants at most this much

    def grant(limit: int) -> bool:
        asked.append(limit)
        return limit <= ceiling

    plan = KvPlan(init_bytes=8 * bpt, step_bytes=8 * bpt, max_bytes=64 * bpt)
    eng = GenerationEngine(lm, engine_config(lm, kv=plan, max_batch_seqs=4), kv_grant=grant)
    hs = [
        eng.submit(p, GenerationParams(max_tokens=20), seq_id=f"s{i}")
        for i, p in enumerate(PROMPTS[:2])
    ]
    while eng.has_work:
        eng.step()
        c = eng.counters()
        assert c.kv_bytes <= c.kv_limit_bytes <= ceiling
        assert (c.kv_limit_bytes - plan.init_bytes) % plan.step_bytes == 0
    grows = [x for x in asked if x > plan.init_bytes]
    assert grows and all((x - plan.init_bytes) % plan.step_bytes == 0 for x in grows)
    assert eng.counters().preemptions >= 1  # the later sequence gave its KV back ...
    assert [h.generated for h in hs] == alone  # ... and recomputed it: the same tokens
    assert eng.counters().kv_bytes == 0 and eng.counters().kv_limit_bytes == plan.init_bytes


def test_a_request_that_can_never_fit_is_refused_and_the_others_go_on(lm: CausalLM) -> None:
    bpt = lm.generation_spec().kv_bytes_per_token
    eng = GenerationEngine(lm, engine_config(lm, kv=KvPlan(0, 16 * bpt, 64 * bpt)))
    big = eng.submit("x" * 60, GenerationParams(max_tokens=10))
    small = eng.submit("hi", GenerationParams(max_tokens=5))
    ctx = eng.submit("y" * 500, GenerationParams(max_tokens=100))
    eng.run_until_idle()
    last = big.drain()[-1]
    assert last.finish_reason is FinishReason.REFUSED and "at most" in last.error
    assert "context" in ctx.drain()[-1].error
    assert small.finish_reason is FinishReason.LENGTH and len(small.generated) == 5
    assert eng.counters().refused == 2


def test_cancel_frees_its_memory(lm: CausalLM) -> None:
    eng = GenerationEngine(lm)
    h = eng.submit(PROMPTS[2], GenerationParams(max_tokens=100))
    other = eng.submit(PROMPTS[0], GenerationParams(max_tokens=100))
    for _ in range(3):
        eng.step()
    assert lm.kv_tokens(h.seq_id) > 0
    eng.cancel(h.seq_id)
    eng.step()
    assert h.finish_reason is FinishReason.CANCELLED and lm.kv_tokens(h.seq_id) == 0
    c = eng.counters()
    assert c.cancelled == 1 and c.running == 1
    assert c.kv_bytes == lm.kv_tokens(other.seq_id) * lm.generation_spec().kv_bytes_per_token
    eng.cancel(other.seq_id)
    eng.step()
    assert eng.counters().kv_bytes == 0 and not eng.has_work


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def before_step(self) -> None:
        self.calls.append(("before", True))

    def after_step(self, busy_s: float, ok: bool) -> None:
        assert busy_s >= 0
        self.calls.append(("after", ok))

    def idle(self) -> None:
        self.calls.append(("idle", True))


def test_each_step_is_one_burst_and_a_failing_handler_fails_only_its_sequences(lm) -> None:
    hooks = Hooks()
    eng = GenerationEngine(lm, hooks=hooks)
    eng.submit("abc", GenerationParams(max_tokens=3))
    steps = eng.run_until_idle()
    assert hooks.calls == [("before", True), ("after", True)] * steps

    class Broken(TinyCausalLM):
        def decode(self, seqs):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    bad = Broken()
    bad.load(None, "cpu")
    hooks = Hooks()
    eng = GenerationEngine(bad, hooks=hooks)
    h = eng.submit("abc", GenerationParams(max_tokens=3))
    eng.run_until_idle()
    last = h.drain()[-1]
    assert last.finish_reason is FinishReason.ERROR and "boom" in last.error
    assert ("after", False) in hooks.calls and bad.kv_tokens(h.seq_id) == 0


def test_bad_requests_raise_input_error(lm: CausalLM) -> None:
    for bad in (
        {"max_tokens": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"stop": [1]},
        {"max_tokens": "x"},
    ):
        with pytest.raises(InputError):
            GenerationParams.parse(bad)
    eng = GenerationEngine(lm)
    with pytest.raises(InputError):
        eng.submit(3.5)
    with pytest.raises(InputError):
        eng.submit([999])


def test_serve_thread_streams_chunks_and_takes_joins_from_other_threads(lm: CausalLM) -> None:
    eng = GenerationEngine(lm)
    stop = threading.Event()
    t = threading.Thread(target=eng.serve, args=(stop, 0.01), daemon=True)
    t.start()
    got: dict[str, list[Chunk]] = {}
    done = threading.Event()

    def on_chunk(c: Chunk) -> None:
        got.setdefault(c.seq_id, []).append(c)
        if c.last and len([x for x in got.values() if x[-1].last]) == 2:
            done.set()

    eng.submit(PROMPTS[0], GenerationParams(max_tokens=8), on_chunk=on_chunk, seq_id="a")
    eng.submit(PROMPTS[1], GenerationParams(max_tokens=8), on_chunk=on_chunk, seq_id="b")
    assert done.wait(60)
    stop.set()
    t.join(10)
    for chunks in got.values():
        assert sum(c.last for c in chunks) == 1 and chunks[-1].last
        assert chunks[-1].timings is not None and chunks[-1].timings.ttft_s is not None


def test_predict_and_generate_of_the_builtin(lm: CausalLM) -> None:
    out = lm.predict(["hello", {"prompt": "abc"}], [{"max_tokens": 4}, {"max_tokens": 3}])
    assert [o["tokens"] for o in out] == [4, 3]
    streamed = "".join(lm.generate("hello", {"max_tokens": 4}))
    assert streamed == out[0]["text"]


def test_close_cancels_everything_and_engines_may_share_a_handler(lm: CausalLM) -> None:
    first = GenerationEngine(lm)
    left = first.submit(PROMPTS[0], GenerationParams(max_tokens=50))
    first.step()
    second = GenerationEngine(lm)  # its ids never collide with the first engine's caches
    h = second.submit(PROMPTS[0], GenerationParams(max_tokens=5))
    second.run_until_idle()
    assert h.finish_reason is FinishReason.LENGTH and h.seq_id != left.seq_id
    first.close()
    assert left.finish_reason is FinishReason.CANCELLED and lm.kv_tokens(left.seq_id) == 0


def test_the_builtin_loads_shared_weights_without_copying_them(lm: CausalLM) -> None:
    from gshare.runtime.instance.loading import handler_class
    from gshare.runtime.instance.models import shares_weights

    cls = handler_class("gshare.runtime.instance.generative.causal_lm:TinyCausalLM")
    shared = cls().initial_weights()  # what the node's model store would hold
    h = cls()
    h.load(shared, "cpu")
    assert h.module is not None and shares_weights(h.module, shared)
    assert h.predict(["hello"], parameters=[{"max_tokens": 8}]) == lm.predict(
        ["hello"], parameters=[{"max_tokens": 8}]
    )


def test_ignore_eos_generates_max_tokens_past_the_end_of_sequence(lm: CausalLM) -> None:
    prompts = [bytes([32 + (7 * i + j) % 90 for j in range(5 + i)]) for i in range(24)]
    eng = GenerationEngine(lm, engine_config(lm, max_batch_seqs=24))
    plain = [eng.submit(p, GenerationParams(max_tokens=96)) for p in prompts]
    eng.run_until_idle()
    stopped = [h for h in plain if h.finish_reason is FinishReason.STOP]
    assert stopped, "no prompt reached the end-of-sequence token: the test is vacuous"
    assert all(h.generated[-1] == EOS_ID for h in stopped)
    with pytest.raises(InputError, match="ignore_eos"):
        GenerationParams.parse({"ignore_eos": "yes"})
    params = GenerationParams.parse({"max_tokens": 96, "ignore_eos": True})
    forced = [eng.submit(p, params) for p in prompts]
    eng.run_until_idle()
    for a, b in zip(plain, forced, strict=True):
        assert b.finish_reason is FinishReason.LENGTH and len(b.generated) == 96
        assert b.generated[: len(a.generated)] == a.generated  # the same tokens, then more
