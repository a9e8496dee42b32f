"""Latency of model calls with the time-token protocol around them vs without, same process.

Usage: ``python bench/token_overhead.py [--quick] [--json PATH] [--mlp-pairs N] [--resnet-pairs N]
[--token-config JSON]``

What an instance pays for time sharing, measured for

* ``mlp`` -- a small torch MLP (1024-2048-2048-1000, ReLU, batch 8: a few ms a call, <= 10 ms);
* ``resnet50`` -- ``transformers``' ``ResNetForImageClassification`` built from ``ResNetConfig()``
  (the ResNet-50 architecture) with random weights, never downloaded; batch 1, 3x224x224.

Two protocols, both against the live runtime's token configuration
(``gshare.runtime.tokens.LIVE_TOKEN_CONFIG``, what the node agent uses: 40-ms windows,
dynamic quota, uncontended tokens of up to 40 ms; ``--token-config JSON`` overrides fields of
it, e.g. ``'{"idle_token_ms": 0}'``):

* ``per-burst`` (the old frontend) -- every call is ``acquire() -> model(x) -> release(busy)``;
  calls alternate with/without one by one (ABBA order, so machine drift hits both equally);
* ``reuse`` (the instance's pattern, ``gshare.runtime.instance.server``) -- while work is queued the
  instance runs batch after batch on one token (``start_burst`` reuses the held token while its
  rest fits the predicted burst, else releases it and acquires another; ``end_burst`` keeps it)
  and gives it back (``idle``) when the queue is empty. Measured as *blocks* of ``K``
  back-to-back calls (``--block``; MLP 10, ResNet 3) followed by ``idle()``, alternating ABBA
  with blocks of ``K`` plain calls.

The ``TokenServer`` runs in a separate process (the node agent's role), with this process as
its only client (100 % SMs, request = limit = 1: a lone client limited to the whole device never
owes debt, whatever its bursts' lengths). Both models run with ``torch.set_num_threads(1)`` (the
machine has 2 cores shared with other work: one intra-op thread leaves a core to the token
server) under ``torch.inference_mode``. Per model and protocol:

* ``overhead_pct`` -- median over pairs of ``(with - without)`` / median(without) x 100: the
  end-to-end estimate (noisy: it is the difference of two noisy calls or blocks);
* ``protocol_pct`` -- median(time inside the token calls) / median(without) x 100: the same cost
  measured directly inside the with-calls (steady).

Summary: ``overhead_pct`` = the larger of the two models' end-to-end figures with the runtime's
protocol (``reuse``; target <= 3); ``overhead_pct_<model>`` (reuse),
``overhead_pct_perburst_<model>`` (old protocol), ``protocol_pct_<model>``,
``protocol_pct_perburst_<model>``, ``tokens_per_call_<model>`` (reuse), ``protocol_us_p50``
(per-burst), ``call_ms_<model>``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from _common import (
    add_token_config_option,
    bench_parser,
    live_token_config,
    machine_load,
    percentile,
    print_table,
    write_json,
)
from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.runtime.tokens import TokenClient, TokenServer


def _serve(path: str, config: TokenConfig, conn: Connection) -> None:  # pragma: no cover
    """The node agent's part: a token server with one registered client, until told to stop."""
    server = TokenServer(path, config)
    server.add_client(ClientSpec("bench", 100.0, 1.0, 1.0))
    server.start()
    conn.send("ready")
    conn.recv()
    conn.send(server.stats())
    server.stop()


def _build_models(seed: int) -> dict[str, tuple[Callable[[], Any], str]]:
    import torch

    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 1000),
    ).eval()
    x_mlp = torch.randn(8, 1024)

    from transformers import ResNetConfig, ResNetForImageClassification

    resnet = ResNetForImageClassification(ResNetConfig()).eval()  # random weights, no download
    x_img = torch.randn(1, 3, 224, 224)
    return {
        "mlp": (lambda: mlp(x_mlp), "MLP 1024-2048-2048-1000, batch 8"),
        "resnet50": (lambda: resnet(pixel_values=x_img), "ResNet-50, batch 1, 224x224"),
    }


def interleave(
    with_tokens: Callable[[], tuple[float, float]],
    without: Callable[[], float],
    pairs: int,
    warmup: int,
    after_warmup: Callable[[], None] | None = None,
) -> tuple[list[float], list[float], list[float]]:
    """ABBA-interleaved runs (drift cancels): per pair the with-token time, the plain time and
    the protocol's share of the with-token time, after ``warmup`` unmeasured pairs."""
    for _ in range(warmup):
        with_tokens()
        without()
    if after_warmup is not None:
        after_warmup()
    w: list[float] = []
    wo: list[float] = []
    proto: list[float] = []
    for i in range(pairs):
        if i % 2 == 0:
            a, p = with_tokens()
            b = without()
        else:
            b = without()
            a, p = with_tokens()
        w.append(a)
        wo.append(b)
        proto.append(p)
    return w, wo, proto


def measure(
    call: Callable[[], Any], client: TokenClient, pairs: int, warmup: int
) -> dict[str, float]:
    """Interleaved with/without calls; returns the model's figures (see the module docstring)."""
    perf = time.perf_counter

    def with_tokens() -> tuple[float, float]:
        t0 = perf()
        client.acquire()
        t1 = perf()
        call()
        t2 = perf()
        client.release((t2 - t1) * 1000.0)
        t3 = perf()
        return t3 - t0, (t1 - t0) + (t3 - t2)

    def without() -> float:
        t0 = perf()
        call()
        return perf() - t0

    w, wo, proto = interleave(with_tokens, without, pairs, warmup)
    base = statistics.median(wo)
    return {
        "protocol": "per-burst",
        "pairs": pairs,
        "calls_per_pair": 1,
        "without_ms_p50": base * 1e3,
        "with_ms_p50": statistics.median(w) * 1e3,
        "overhead_pct": statistics.median(x - y for x, y in zip(w, wo, strict=True)) / base * 100,
        "protocol_us_p50": statistics.median(proto) * 1e6,
        "protocol_us_p99": percentile(proto, 99) * 1e6,
        "protocol_pct": statistics.median(proto) / base * 100,
        "tokens_per_call": 1.0,
    }


def measure_reuse(
    call: Callable[[], Any], client: TokenClient, pairs: int, block: int, warmup: int
) -> dict[str, float]:
    """Blocks of ``block`` back-to-back calls on reused tokens, then ``idle()``, alternating
    ABBA with blocks of plain calls; figures per block (see the module docstring)."""
    perf = time.perf_counter
    acquired = [0]

    def with_tokens() -> tuple[float, float]:
        proto = 0.0
        t0 = perf()
        for _ in range(block):
            a = perf()
            r0 = client.reused
            client.start_burst()
            acquired[0] += client.reused == r0
            b = perf()
            call()
            c = perf()
            client.end_burst()
            proto += (b - a) + (perf() - c)
        a = perf()
        client.idle()
        t1 = perf()
        return t1 - t0, proto + (t1 - a)

    def without() -> float:
        t0 = perf()
        for _ in range(block):
            call()
        return perf() - t0

    w, wo, proto = interleave(
        with_tokens, without, pairs, warmup, after_warmup=lambda: acquired.__setitem__(0, 0)
    )
    base = statistics.median(wo)
    return {
        "protocol": "reuse",
        "pairs": pairs,
        "calls_per_pair": block,
        "without_ms_p50": base * 1e3 / block,
        "with_ms_p50": statistics.median(w) * 1e3 / block,
        "overhead_pct": statistics.median(x - y for x, y in zip(w, wo, strict=True)) / base * 100,
        "protocol_us_p50": statistics.median(proto) * 1e6 / block,
        "protocol_us_p99": percentile(proto, 99) * 1e6 / block,
        "protocol_pct": statistics.median(proto) / base * 100,
        "tokens_per_call": acquired[0] / (pairs * block),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--mlp-pairs", type=int, default=None, help="with/without pairs (2000; quick 400)"
    )
    parser.add_argument("--resnet-pairs", type=int, default=None, help="pairs (60; quick 12)")
    parser.add_argument(
        "--block", type=int, default=None, help="calls per reuse block (MLP 10, ResNet 3)"
    )
    add_token_config_option(parser)
    args = parser.parse_args()
    load = machine_load()  # before our own load
    pairs = {
        "mlp": args.mlp_pairs or (400 if args.quick else 2000),
        "resnet50": args.resnet_pairs or (12 if args.quick else 60),
    }
    block = {"mlp": args.block or 10, "resnet50": args.block or 3}
    warmup = {"mlp": 20, "resnet50": 2}
    config = live_token_config(args)

    import torch

    torch.set_num_threads(1)
    models = _build_models(args.seed)

    tmp = tempfile.mkdtemp(prefix="gs-ovh-", dir="/tmp")
    path = os.path.join(tmp, "dev0.sock")
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(path, config, there), daemon=True)
    proc.start()
    if not here.poll(60) or here.recv() != "ready":
        sys.exit("token server process did not start")
    rows: list[dict[str, Any]] = []
    try:
        client = TokenClient(path, "bench", timeout_s=60)
        with torch.inference_mode():
            for name, (call, what) in models.items():
                r = measure(call, client, pairs[name], warmup[name])
                rows.append({"model": name, "what": what, **r})
                n = max(1, pairs[name] // block[name])
                r = measure_reuse(call, client, n, block[name], warmup[name])
                rows.append({"model": name, "what": what, **r})
        client.close()
        here.send("stop")
        stats = here.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        os.rmdir(tmp)
    if stats["errors"] or stats["malformed"] or stats["undelivered_grants"]:
        sys.exit(f"token server counters are off: {stats}")

    new = [r for r in rows if r["protocol"] == "reuse"]
    old = [r for r in rows if r["protocol"] == "per-burst"]
    summary: dict[str, Any] = {
        "overhead_pct": max(r["overhead_pct"] for r in new),
        "overhead_pct_perburst": max(r["overhead_pct"] for r in old),
        "idle_token_ms": config.idle_token_ms,
        "token_config": asdict(config),
    }
    for r in new:
        m = r["model"]
        summary[f"overhead_pct_{m}"] = r["overhead_pct"]
        summary[f"protocol_pct_{m}"] = r["protocol_pct"]
        summary[f"tokens_per_call_{m}"] = r["tokens_per_call"]
        summary[f"call_ms_{m}"] = r["without_ms_p50"]
    for r in old:
        m = r["model"]
        summary[f"overhead_pct_perburst_{m}"] = r["overhead_pct"]
        summary[f"protocol_pct_perburst_{m}"] = r["protocol_pct"]
    summary["protocol_us_p50"] = statistics.median(r["protocol_us_p50"] for r in old)
    print_table(
        "token protocol overhead per call (interleaved with/without, same process)",
        [
            "model",
            "protocol",
            "pairs",
            "calls/pair",
            "without ms",
            "with ms",
            "overhead %",
            "protocol us p50",
            "protocol us p99",
            "protocol %",
            "tokens/call",
        ],
        [
            [
                r["model"],
                r["protocol"],
                r["pairs"],
                r["calls_per_pair"],
                r["without_ms_p50"],
                r["with_ms_p50"],
                r["overhead_pct"],
                r["protocol_us_p50"],
                r["protocol_us_p99"],
                r["protocol_pct"],
                r["tokens_per_call"],
            ]
            for r in rows
        ],
    )
    print(
        f"overhead_pct = {summary['overhead_pct']:.2f} (target <= 3; reuse protocol, larger of "
        f"the two models; per-burst protocol: {summary['overhead_pct_perburst']:.2f}); "
        + ", ".join(
            f"{r['model']} {r['protocol']}: {r['overhead_pct']:.2f} % end-to-end, "
            f"{r['protocol_pct']:.3f} % protocol"
            for r in rows
        )
    )
    load_end = machine_load()  # other work that started during the run shows here
    summary.update(load)
    summary.update({f"{k}_end": v for k, v in load_end.items() if k != "cpus"})
    print(f"machine load at start: {load}; at the end: {load_end}")
    write_json(args.json, summary, rows=rows)


if __name__ == "__main__":
    main()
