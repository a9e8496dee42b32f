"""Fit the simulator's decode-step model on the real generation engine of a built-in causal LM.

Usage: ``python bench/generate_fit.py [--model tiny] [--out PATH]
[--quick] [--json PATH]``

What runs (one process, one torch thread): the engine (``runtime.instance.generative.engine``)
with the live instance's batching configuration (``max_batch_seqs`` 16, 64 prefill tokens and
256 tokens per step: ``serving.EngineHost``'s defaults) over requests whose prompt and generated
token counts are rows of the Azure LLM code trace (rows from ``--first-row``: not the rows the
twin of ``bench/generate.py`` replays), prompts ÷ 64 capped at 200 tokens, generations capped at
128, ``ignore_eos``. Three phases cover the features: bursts of N requests submitted together
(N = 1, 2, 4, 8, 16, 24: decode batches of every size, contexts of every length) in continuous
and in request-level batching (whole prompts in one step), each step timed around
``GenerationEngine.step`` (the planning and the handler's calls: what an engine thread spends
per step). A wrapper around the handler records what each step ran (prefill chunks and tokens,
decode batch and context, whether the decode set changed: ``policy.generation_cost``'s
features).

Fit: ``policy.generation_cost.fit_step_cost`` (non-negative least squares), its r² and mean
absolute percentage error printed; the document is written to ``--out`` under the built-in's
name (``causal-lm-tiny``), keeping the other models' entries, with ``measured_on`` naming the
machine, the load and this measurement. ``frontend_ms`` and ``step_overhead_ms`` (a live
server's extra time per request and per step) are kept from the existing entry unless
``--frontend-ms`` / ``--step-overhead-ms`` are given (``bench/generate.py --write-profile``
measures them and ``token_overhead_ms`` against the live server).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

import torch

from _common import bench_parser, machine_load, print_table, write_json
from gshare.policy.generation import BatchingMode
from gshare.policy.generation_cost import StepFeatures, fit_step_cost
from gshare.runtime.instance.generative.causal_lm import CausalLM
from gshare.runtime.instance.generative.contract import GenerationParams, PrefillWork, SeqView
from gshare.runtime.instance.generative.engine import GenerationEngine, engine_config

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "src/gshare/data/azure_llm_inference_2023_code.csv"
DEFAULT_OUT = REPO / "src/gshare/data/generative_step_profile.json"


class Recording:
    """A step-wise handler that records what each step runs (delegates everything)."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.current = StepFeatures()
        self._last_decode: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lm, name)

    def begin(self) -> None:
        self.current = StepFeatures()

    def prefill(self, work: list[PrefillWork]) -> list[int | None]:
        c = self.current
        self.current = StepFeatures(
            c.prefill_chunks + len(work),
            c.prefill_tokens + sum(w.n_tokens for w in work),
            c.decode_seqs,
            c.decode_context_tokens,
            c.rebuilt,
        )
        return self.lm.prefill(work)

    def decode(self, views: list[SeqView]) -> list[int]:
        ids = frozenset(v.seq_id for v in views)
        c = self.current
        self.current = StepFeatures(
            c.prefill_chunks,
            c.prefill_tokens,
            len(views),
            sum(len(v.token_ids) for v in views),
            ids != self._last_decode,
        )
        self._last_decode = ids
        return self.lm.decode(views)


def trace_requests(first: int, n: int, seed: int) -> list[tuple[bytes, int]]:
    with open(TRACE, newline="") as f:
        rows = list(csv.DictReader(f))[first : first + n]
    rng = random.Random(seed)
    out = []
    for r in rows:
        ctx = min(200, max(4, round(int(r["ContextTokens"]) / 64)))
        gen = min(128, max(2, int(r["GeneratedTokens"])))
        out.append((bytes(rng.randrange(32, 127) for _ in range(ctx - 1)), gen))
    return out


def measure(
    rec: Recording, reqs: list[tuple[bytes, int]], bursts: list[int], mode: BatchingMode
) -> tuple[list[StepFeatures], list[float]]:
    cfg = engine_config(
        rec.lm, max_batch_seqs=16, max_prefill_tokens=64, max_step_tokens=256, mode=mode
    )
    if mode is BatchingMode.REQUEST:
        cfg = engine_config(rec.lm, max_batch_seqs=16, max_step_tokens=1 << 20, mode=mode)
    feats: list[StepFeatures] = []
    times: list[float] = []
    i = 0
    for b in bursts:
        eng = GenerationEngine(rec, cfg)  # type: ignore[arg-type]
        for p, g in reqs[i : i + b]:
            eng.submit(p, GenerationParams(max_tokens=g, ignore_eos=True))
        i = (i + b) % max(1, len(reqs) - 32)
        while eng.has_work:
            rec.begin()
            t0 = time.perf_counter()
            rep = eng.step()
            dt = (time.perf_counter() - t0) * 1e3
            if not rep.decision.idle:
                feats.append(rec.current)
                times.append(dt)
    return feats, times


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--model", choices=["tiny", "gpt2-small"], default="tiny")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--first-row", type=int, default=1000)
    parser.add_argument("--frontend-ms", type=float, default=None)
    parser.add_argument("--step-overhead-ms", type=float, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = CausalLM(args.model)
    lm.load(None, "cpu")
    rec = Recording(lm)
    reqs = trace_requests(args.first_row, 400, args.seed)
    bursts = [1, 2, 4, 8, 16, 24] * (1 if args.quick else 3)
    load_before = machine_load()
    feats, times = measure(rec, reqs, bursts, BatchingMode.CONTINUOUS)
    f2, t2 = measure(rec, reqs[200:], [1, 4, 16] * (1 if args.quick else 2), BatchingMode.REQUEST)
    feats += f2
    times += t2
    load = machine_load()
    name = f"causal-lm-{args.model}"
    spec = lm.generation_spec()
    old: dict[str, Any] = {}
    if args.out.exists():
        old = json.loads(args.out.read_text())
    prev = (old.get("models") or {}).get(name, {})
    measured_on = (
        f"bench/generate_fit.py: {len(times)} steps of the in-process engine, {name}, one torch "
        f"thread, {platform.machine()} {os.cpu_count()} CPUs, load average "
        f"{load_before['loadavg_1m']:.1f} / {load['loadavg_1m']:.1f} (before / after), "
        f"{time.strftime('%Y-%m-%d')}"
    )
    model = fit_step_cost(
        feats,
        times,
        model=name,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        max_context_tokens=spec.max_context_tokens,
        measured_on=measured_on,
    )
    doc = model.to_doc()
    doc["frontend_ms"] = (
        args.frontend_ms if args.frontend_ms is not None else prev.get("frontend_ms", 0.0)
    )
    doc["step_overhead_ms"] = (
        args.step_overhead_ms
        if args.step_overhead_ms is not None
        else prev.get("step_overhead_ms", 0.0)
    )
    doc["token_overhead_ms"] = prev.get("token_overhead_ms", 0.0)
    print_table(
        f"{name}: step model fitted on {len(times)} steps",
        ["coefficient", "value"],
        [[k, v] for k, v in doc.items() if k.endswith(("_ms", "_1k"))] + list(doc["fit"].items()),
    )
    if not args.quick:
        out = {"models": {**(old.get("models") or {}), name: doc}}
        args.out.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    write_json(args.json, {**doc["fit"], **load, "model": name})


if __name__ == "__main__":
    main()
