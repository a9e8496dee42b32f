"""Generative functions: continuous batching vs request-level batching vs one request at a time
in process, on the built-in causal LM with the Azure LLM code trace's token counts; then the
live twin (a real ``gshare serve``: the trace segment run live and simulated).

Usage: ``python bench/generate.py [--quick] [--json PATH] [--model tiny|gpt2-small]
[--requests N] [--loads 0.1,0.2,0.35,0.5,0.75,1,2,3,4,6] [--reps R] [--ttft-slo-ms MS] [--no-live]
[--twin-rate RPS] [--twin-reps N] [--hi-tokens N] [--write-profile]``

``--quick``: 24 requests, loads 0.5 and 2, one repetition, one live twin run (about 30 s; a
smoke run, its ratios are noise). The full run: 96 requests, ten loads, three repetitions,
three live twin runs (several minutes on the shared 2-core VM, tiny).

The live twin (``_generate_live.live_twin``; ``--no-live`` skips it): the summary keys
``ttft_p50_ratio_sim_over_live`` and ``tpot_p50_ratio_sim_over_live`` (and p99), the module doc
of ``_generate_live`` says how they are measured.

What runs in process (one process, one torch thread, no gateway): the engine
(``runtime.instance.generative.engine``) over ``CausalLM`` (random weights), three ways, on the
same seeded requests and arrival times:

* **continuous** — Orca's iteration-level batching: sequences join and leave between steps,
  chunked prefill (``--prefill-chunk`` tokens per step), up to ``--max-batch`` sequences;
* **request** — request-level batching: a batch of up to ``--max-batch`` runs until all its
  sequences finish, arrivals wait for the next batch;
* **one** — one request at a time.

Requests: the first ``--requests`` rows of ``azure_llm_inference_2023_code.csv``; each prompt is
``ContextTokens / --ctx-scale`` (64) random bytes (at least 4, at most ``--max-prompt``), each asks
for ``GeneratedTokens`` tokens (at most ``--max-gen``) — greedy, so every mode generates the
same tokens (a sequence may stop early at the model's EOS: the same one in every mode). Arrival
times: the trace's inter-arrival gaps (bursty) rescaled so the rate is a load times what one request
at a time serves (measured first: every request served alone back to back, the calibration;
the fastest of three passes in a full run);
the arrivals are replayed on the real clock.

Figures per mode and load: tokens/s (generated tokens over the makespan), goodput (tokens/s of
the requests whose TTFT met the SLO), TTFT p50/p99, TPOT p50/p99 (each request's mean time per
output token after the first), SLO attainment. The TTFT SLO is ``--ttft-slo-ms`` (default: 5x
the mean time one request takes alone, from the calibration).

Throughput at the TTFT SLO (per mode): the highest tokens/s of a load (``--loads``, each run
``--reps`` times, the modes alternating; each figure the median of the repetitions) at which at
least ``--slo-attainment`` of the requests met the SLO; 0 when no load did.

Summary: ``tokens_per_s_ratio_continuous_vs_request`` (throughput at the TTFT SLO, continuous
over request-level; infinite, written as null, when request-level met it at no load),
``..._vs_one``, every mode's figures per load, the decode layout micro-benchmark (ms per decode
step of ``--max-batch`` sequences of 16 to 200 tokens: the persistent padded batch that
``CausalLM.decode`` keeps, the same batch rebuilt at every step, each sequence alone), and a
high-priority stream (priority 8, ``--hi-tokens`` 160) alone and beside 12 saturating
low-priority sequences, with FIKIT (fill 0) and with equal priorities, the three alternating
``--reps`` times with their gaps pooled: ``hi_tpot_p99_ratio_vs_alone`` (its
p99 time between tokens with FIKIT over alone) and ``hi_tpot_p99_ratio_equal_over_fikit``.
"""

from __future__ import annotations

import csv
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from _common import bench_parser, machine_load, percentile, print_table, write_json
from _generate_live import live_twin
from gshare.policy.generation import BatchingMode
from gshare.runtime.instance.generative.causal_lm import CausalLM
from gshare.runtime.instance.generative.contract import GenerationParams, PrefillWork, SeqView
from gshare.runtime.instance.generative.engine import GenerationEngine, engine_config

DEFAULT_LOADS = "0.1,0.2,0.35,0.5,0.75,1,2,3,4,6"
TRACE = Path(__file__).resolve().parent.parent / "src/gshare/data/azure_llm_inference_2023_code.csv"


@dataclass(frozen=True)
class Request:
    prompt: bytes
    max_tokens: int
    arrival_s: float


def load_requests(n: int, ctx_scale: float, max_prompt: int, max_gen: int, seed: int) -> list:
    with open(TRACE, newline="") as f:
        rows = [r for _, r in zip(range(n + 1), csv.DictReader(f), strict=False)]
    rng = random.Random(seed)
    out = []
    for r in rows[:n]:
        ctx = min(max_prompt, max(4, round(int(r["ContextTokens"]) / ctx_scale)))
        gen = min(max_gen, max(2, int(r["GeneratedTokens"])))
        prompt = bytes(rng.randrange(32, 127) for _ in range(ctx - 1))  # + BOS = ctx tokens
        out.append((prompt, gen, r["TIMESTAMP"]))
    return out


def arrivals(rows: list, rate_per_s: float) -> list[Request]:
    from datetime import datetime

    ts = [datetime.fromisoformat(r[2][:26]).timestamp() for r in rows]
    gaps = [max(0.0, b - a) for a, b in zip(ts, ts[1:], strict=False)]
    mean = statistics.fmean(gaps) if gaps else 1.0
    t, out = 0.0, []
    for i, (prompt, gen, _) in enumerate(rows):
        out.append(Request(prompt, gen, t))
        if i < len(gaps):
            t += gaps[i] / mean / rate_per_s
    return out


def replay(lm: CausalLM, reqs: list[Request], cfg: Any) -> dict[str, Any]:
    """Replay ``reqs`` on the real clock through an engine with ``cfg``; per-request timings."""
    eng = GenerationEngine(lm, cfg)
    handles = []
    t0 = time.perf_counter()
    i = 0
    while i < len(reqs) or eng.has_work:
        now = time.perf_counter() - t0
        while i < len(reqs) and reqs[i].arrival_s <= now:
            r = reqs[i]
            handles.append(eng.submit(r.prompt, GenerationParams(max_tokens=r.max_tokens)))
            i += 1
        if eng.has_work:
            eng.step()
        elif i < len(reqs):
            time.sleep(max(0.0, reqs[i].arrival_s - (time.perf_counter() - t0)))
    end = max(h.token_times_s[-1] for h in handles if h.token_times_s)
    return {"handles": handles, "makespan_s": end - t0, "steps": eng.counters().steps}


def figures(run: dict[str, Any], slo_s: float) -> dict[str, float]:
    hs = run["handles"]
    tim = [h.timings() for h in hs]
    ttft = [t.ttft_s for t in tim if t.ttft_s is not None]
    tpot = [t.tpot_s for t in tim if t.tpot_s is not None]
    tokens = sum(len(h.generated) for h in hs)
    good = sum(
        len(h.generated)
        for h, t in zip(hs, tim, strict=True)
        if t.ttft_s is not None and t.ttft_s <= slo_s
    )
    span = run["makespan_s"]
    return {
        "tokens": tokens,
        "tokens_per_s": tokens / span,
        "goodput_tokens_per_s": good / span,
        "slo_attainment": sum(1 for x in ttft if x <= slo_s) / len(hs),
        "ttft_ms_p50": percentile(ttft, 50) * 1e3,
        "ttft_ms_p99": percentile(ttft, 99) * 1e3,
        "tpot_ms_p50": percentile(tpot, 50) * 1e3,
        "tpot_ms_p99": percentile(tpot, 99) * 1e3,
        "steps": run["steps"],
        "makespan_s": span,
    }


def decode_layouts(lm: CausalLM, batch: int, iters: int, seed: int) -> dict[str, float]:
    """ms per decode step of ``batch`` sequences of different lengths: the persistent padded
    batch (what ``CausalLM.decode`` keeps while the batch does not change), the same batch
    rebuilt from per-sequence caches at every step (every row cut back out and stacked again),
    a batch that changes at every step (one sequence pauses, the one paused before resumes:
    the incremental rebuild a join or a leave costs), and each sequence decoded alone."""

    def fresh() -> list[SeqView]:  # the same sequences, prefilled again, for each layout
        rng = random.Random(seed)
        views = []
        for i in range(batch):
            n = rng.randrange(16, 200)
            v = SeqView(f"L{i}", [rng.randrange(256) for _ in range(n)], GenerationParams())
            tok = lm.prefill([PrefillWork(v, n)])[0]
            v.cached_tokens = n
            v.token_ids.append(int(tok or 0))
            views.append(v)
        return views

    def advance(vs: list[SeqView]) -> None:
        for v, tok in zip(vs, lm.decode(vs), strict=True):
            v.cached_tokens += 1
            v.token_ids.append(tok)

    def persistent(views: list[SeqView], _: int) -> None:
        advance(views)

    def rebuilt(views: list[SeqView], _: int) -> None:
        lm._unbatch()  # the next decode stacks every per-sequence cache again
        advance(views)

    def churn(views: list[SeqView], step: int) -> None:  # one pauses, the last one resumes
        advance([v for i, v in enumerate(views) if i != step % len(views)])

    def alone(views: list[SeqView], _: int) -> None:
        for v in views:
            advance([v])

    out = {}
    for name, fn in (
        ("persistent_ms", persistent),
        ("rebuilt_each_step_ms", rebuilt),
        ("churn_each_step_ms", churn),
        ("alone_ms", alone),
    ):
        views = fresh()  # every layout decodes the same contexts, grown by the same steps
        fn(views, 0)  # warm
        t = time.perf_counter()
        for step in range(1, iters + 1):
            fn(views, step)
        out[name] = (time.perf_counter() - t) / iters * 1e3
        for v in views:
            lm.free(v.seq_id)
    return out


def priority_streams(
    lm: CausalLM, n_low: int, hi_tokens: int, reps: int, seed: int
) -> dict[str, float]:
    """An interactive high-priority stream (priority 8) alone, then beside ``n_low`` saturating
    low-priority sequences (priority 1) with FIKIT (fill 0) and with equal priorities: its
    inter-token gaps (p50 / p99, ms) and the low sequences' tokens per second.

    The three cases alternate ``reps`` times and each case's gaps are pooled, so a stall of this
    shared machine falls on all three alike and a p99 is taken over ``reps * (hi_tokens - 1)``
    gaps, not decided by one stall among a few dozen."""
    rng = random.Random(seed)
    lo_prompts = [bytes(rng.randrange(32, 127) for _ in range(120)) for _ in range(n_low)]
    hi_prompt = b"def interactive(stream):"

    def run(with_low: bool, fikit: bool) -> tuple[list[float], float]:
        cfg = engine_config(
            lm,
            max_batch_seqs=n_low + 1,
            fikit=fikit,
            fill_tokens=0,
            max_prefill_tokens=64,
            max_step_tokens=64 + n_low + 1,
        )
        eng = GenerationEngine(lm, cfg)
        lows = []
        if with_low:
            lows = [
                eng.submit(p, GenerationParams(max_tokens=hi_tokens + 32), priority=1)
                for p in lo_prompts
            ]
            for _ in range(6):  # the low batch is running (prefilled, decoding)
                eng.step()
        low_before = sum(len(h.generated) for h in lows)
        t0 = time.perf_counter()
        hi = eng.submit(
            hi_prompt, GenerationParams(max_tokens=hi_tokens, ignore_eos=True), priority=8
        )
        while not hi.finished:
            eng.step()
        span = time.perf_counter() - t0
        low_tokens = sum(len(h.generated) for h in lows) - low_before
        eng.close()
        t = hi.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)], low_tokens / span

    gaps: dict[str, list[float]] = {"alone": [], "fikit": [], "equal": []}
    low_rate: dict[str, list[float]] = {"fikit": [], "equal": []}
    for _ in range(reps):
        for case, with_low, fikit in (
            ("alone", False, True),
            ("fikit", True, True),
            ("equal", True, False),
        ):
            g, rate = run(with_low, fikit)
            gaps[case] += g
            if with_low:
                low_rate[case].append(rate)
    p99 = {case: percentile(g, 99) for case, g in gaps.items()}
    return {
        "hi_tpot_gaps_per_case": len(gaps["alone"]),
        "hi_tpot_ms_p50_alone": percentile(gaps["alone"], 50) * 1e3,
        "hi_tpot_ms_p50_fikit": percentile(gaps["fikit"], 50) * 1e3,
        "hi_tpot_ms_p50_equal": percentile(gaps["equal"], 50) * 1e3,
        "hi_tpot_ms_p99_alone": p99["alone"] * 1e3,
        "hi_tpot_ms_p99_fikit": p99["fikit"] * 1e3,
        "hi_tpot_ms_p99_equal": p99["equal"] * 1e3,
        "low_tokens_per_s_fikit": statistics.median(low_rate["fikit"]),
        "low_tokens_per_s_equal": statistics.median(low_rate["equal"]),
        "hi_tpot_p99_ratio_vs_alone": p99["fikit"] / p99["alone"],
        "hi_tpot_p99_ratio_equal_over_fikit": p99["equal"] / p99["fikit"],
    }


def modes_cfg(lm: CausalLM, args: Any) -> dict[str, Any]:
    return {
        "continuous": engine_config(
            lm,
            max_batch_seqs=args.max_batch,
            max_prefill_tokens=args.prefill_chunk,
            max_step_tokens=args.prefill_chunk + args.max_batch,
        ),
        "request": engine_config(
            lm, mode=BatchingMode.REQUEST, max_batch_seqs=args.max_batch, max_step_tokens=1 << 20
        ),
        "one": engine_config(
            lm, mode=BatchingMode.REQUEST, max_batch_seqs=1, max_step_tokens=1 << 20
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument("--model", choices=["tiny", "gpt2-small"], default="tiny")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--loads", default=None, help=f"comma-separated (default {DEFAULT_LOADS})")
    parser.add_argument("--ttft-slo-ms", type=float, default=None)
    parser.add_argument("--slo-attainment", type=float, default=0.9)
    parser.add_argument("--reps", type=int, default=None, help="runs per load (default 3)")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--prefill-chunk", type=int, default=128)
    parser.add_argument("--ctx-scale", type=float, default=64.0)
    parser.add_argument("--max-prompt", type=int, default=200)
    parser.add_argument("--max-gen", type=int, default=128)
    parser.add_argument("--hi-tokens", type=int, default=160,
                        help="the high-priority stream's tokens (full run)")  # fmt: skip
    parser.add_argument("--no-live", action="store_true", help="skip the live server and twin")
    parser.add_argument("--twin-rate", type=float, default=20.0, help="the trace's mean rps")
    parser.add_argument("--twin-reps", type=int, default=None, help="live runs (default 3; 1)")
    parser.add_argument("--write-profile", action="store_true",
                        help="store the live constants in the shipped step profile")  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n = args.requests or (24 if args.quick else 96)
    loads = [
        float(x) for x in (args.loads or ("0.5,2" if args.quick else DEFAULT_LOADS)).split(",")
    ]
    args.reps = args.reps or (1 if args.quick else 3)

    lm = CausalLM(args.model)
    lm.load(None, "cpu")
    rows = load_requests(n, args.ctx_scale, args.max_prompt, args.max_gen, args.seed)
    modes = modes_cfg(lm, args)

    # calibration: every request alone, back to back (one at a time, all arrived at 0)
    # (three passes, the fastest: a stall of this shared machine during one pass would
    # otherwise stretch the service time, and with it the SLO and every load's rate)
    service_s = min(
        replay(lm, [Request(p, g, 0.0) for p, g, _ in rows], modes["one"])["makespan_s"] / n
        for _ in range(1 if args.quick else 3)
    )
    slo_s = (args.ttft_slo_ms / 1e3) if args.ttft_slo_ms else 5 * service_s

    results: dict[str, dict[float, dict[str, float]]] = {m: {} for m in modes}
    for load in loads:
        reqs = arrivals(rows, load / service_s)
        reps: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for _ in range(args.reps):  # the modes alternate, so machine noise falls on all alike
            for m, cfg in modes.items():
                reps[m].append(figures(replay(lm, reqs, cfg), slo_s))
        for m, runs in reps.items():  # each figure's median over the repetitions
            results[m][load] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        tokens = {r[load]["tokens"] for r in results.values()}
        assert len(tokens) == 1, f"the modes generated different tokens: {tokens}"

    print_table(
        f"{args.model}: {n} requests, one alone takes {service_s * 1e3:.0f} ms; TTFT SLO "
        f"{slo_s * 1e3:.0f} ms",
        [
            "mode",
            "load",
            "tokens/s",
            "SLO met",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TPOT p50 ms",
            "TPOT p99 ms",
            "steps",
        ],
        [
            [
                m,
                load,
                r["tokens_per_s"],
                r["slo_attainment"],
                r["ttft_ms_p50"],
                r["ttft_ms_p99"],
                r["tpot_ms_p50"],
                r["tpot_ms_p99"],
                r["steps"],
            ]
            for m, by_load in results.items()
            for load, r in by_load.items()
        ],
    )
    # throughput at the SLO: the highest tokens/s of a load at which the mode met the TTFT SLO
    # for at least --slo-attainment of its requests (0 when it met it at no load)
    at_slo = {
        m: max(
            (
                r["tokens_per_s"]
                for r in by_load.values()
                if r["slo_attainment"] >= args.slo_attainment
            ),
            default=0.0,
        )
        for m, by_load in results.items()
    }
    layouts = decode_layouts(
        lm, 8 if args.quick else args.max_batch, 5 if args.quick else 20, args.seed
    )
    print_table(
        "decode step, sequences of different lengths",
        ["layout", "ms/step"],
        [[k, v] for k, v in layouts.items()],
    )
    prio = priority_streams(
        lm,
        4 if args.quick else 12,
        16 if args.quick else args.hi_tokens,
        1 if args.quick else args.reps,
        args.seed,
    )
    print_table(
        "priority: a high-priority stream beside low-priority batch generation",
        ["figure", "value"],
        [[k, v] for k, v in prio.items()],
    )

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("inf")

    summary: dict[str, Any] = {
        "model": args.model,
        "requests": n,
        "service_ms_alone": service_s * 1e3,
        "ttft_slo_ms": slo_s * 1e3,
        "tokens_per_s_ratio_continuous_vs_request": ratio(at_slo["continuous"], at_slo["request"]),
        "tokens_per_s_ratio_continuous_vs_one": ratio(at_slo["continuous"], at_slo["one"]),
        **{f"{m}_tokens_per_s_at_slo": v for m, v in at_slo.items()},
        **{
            f"{m}_load{load:g}_{k}": v
            for m, by_load in results.items()
            for load, r in by_load.items()
            for k, v in r.items()
        },
        **{f"decode_{k}": v for k, v in layouts.items()},
        **prio,
    }
    if not args.no_live:
        twin = live_twin(
            args.twin_rate,
            args.twin_reps or (1 if args.quick else 3),
            {"ttft_ms": 500.0, "tpot_ms": 10.0},
            quick=args.quick,
            write_profile=args.write_profile,
        )
        print_table(
            "twin: the LLM trace segment live (gshare load) and simulated (gshare simulate)",
            ["figure", "value"],
            [[k, v] for k, v in twin.items()],
        )
        summary.update(twin)
    summary.update(machine_load())
    print(
        {
            k: round(v, 3) if isinstance(v, float) else v
            for k, v in summary.items()
            if k.startswith(("tokens_per_s_ratio", "hi_tpot_p99", "ttft_p", "tpot_p"))
            or k.endswith("_at_slo")
        }
    )
    write_json(
        args.json,
        summary,
        rows=[
            {"mode": m, "load": load, **r}
            for m, by_load in results.items()
            for load, r in by_load.items()
        ],
    )
    return summary


if __name__ == "__main__":
    main()
