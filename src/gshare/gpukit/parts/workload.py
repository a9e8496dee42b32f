"""One model in one process: what the kit's parts measure (run by them, never by hand).

``python -m gshare.gpukit.parts.workload MODEL --mode MODE [--batch B] [--device cuda]``
builds MODEL from its ``transformers`` configuration with random weights (nothing is
downloaded), puts it on the device and prints one JSON line:

* ``latency``  ``--warmup W --iters N``: each forward pass timed to a synchronise;
  ``{"p50_ms", "p99_ms", "mean_ms", "iters"}``;
* ``saturate`` ``--seconds S [--wait-go]``: forward passes back to back (says ``ready`` and
  waits for a stdin line first with ``--wait-go``); ``{"iters", "seconds", "items_per_s"}``;
* ``kernels``  ``--iters N``: everything the process does on the device under
  ``torch.profiler`` (CUPTI), from before the model reaches it to the last synchronise:
  ``{"device_kernels", "memops", "top"}`` — what the interposer's launch count must equal;
* ``graph``    ``--iters N``: a small model captured as a CUDA graph and replayed N times:
  ``{"replays", "kernels_per_replay", "device_kernels"}``;
* ``trace``    ``--batches 1,4 --trace-csv PATH`` (MODEL may be ``all``): for each model and
  batch, after a warm-up, one pass under ``torch.profiler`` — its kernels in launch order with
  their device duration and the idle gap to the next kernel (CUPTI timestamps, no interposer
  in the process), written as rows of ``analysis.TRACE_COLUMNS``; ``{"passes": [...]}``.

Models: ``resnet50``, ``resnet101``, ``mobilenet_v2`` (images 3x224x224) and ``bert-base``
(128 tokens); ``--tiny`` shrinks each to a few layers (the dry run, on the CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gshare.gpukit.analysis import percentile

MODELS = ("resnet50", "resnet101", "mobilenet_v2", "bert-base")
SEQ_LEN = 128


def build(name: str, tiny: bool = False) -> Any:
    """The model, random weights, in eval mode (on the CPU)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg: Any
    model: Any
    if name in ("resnet50", "resnet101"):
        depths = [3, 4, 23, 3] if name == "resnet101" else [3, 4, 6, 3]
        cfg = tf.ResNetConfig(depths=[1, 1, 1, 1] if tiny else depths, layer_type="bottleneck")
        model = tf.ResNetForImageClassification(cfg)
    elif name == "mobilenet_v2":
        cfg = tf.MobileNetV2Config(depth_multiplier=0.35 if tiny else 1.0)
        model = tf.MobileNetV2ForImageClassification(cfg)
    elif name == "bert-base":
        cfg = tf.BertConfig(num_hidden_layers=1 if tiny else 12)
        cfg.num_labels = 2
        model = tf.BertForSequenceClassification(cfg)
    else:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    return model.eval()


def inputs(name: str, batch: int, device: str) -> Any:
    import torch

    if name == "bert-base":
        return {"input_ids": torch.randint(1000, 1100, (batch, SEQ_LEN), device=device)}
    return {"pixel_values": torch.randn(batch, 3, 224, 224, device=device)}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def device_kind(e: Any) -> str:
    """``kernel``, ``memop`` or ``other`` for a device-side profiler event (kineto's activity
    type: ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync`` ...), ``""`` for a host
    event."""
    if getattr(e.device_type, "name", "") != "CUDA":
        return ""
    act = str(getattr(e, "activity_type", "") or "").lower()
    if "memcpy" in act or "memset" in act or e.name.startswith(("Memcpy", "Memset")):
        return "memop"
    if act and "kernel" not in act:
        return "other"  # e.g. a synchronisation the device records: not a launch
    return "kernel"


def _count_kernels(prof: Any) -> tuple[int, int, list[tuple[str, int]]]:
    kernels: dict[str, int] = {}
    memops = 0
    for e in prof.events():
        kind = device_kind(e)
        if kind == "memop":
            memops += 1
        elif kind == "kernel":
            kernels[e.name] = kernels.get(e.name, 0) + 1
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
    return sum(kernels.values()), memops, [(n[:80], c) for n, c in top]


def _trace(
    models: list[str], batches: list[int], dev: str, path: str, tiny: bool = False
) -> list[dict[str, Any]]:
    """One profiled pass per model and batch; writes the launch-order rows to ``path``."""
    import csv

    import torch
    from torch.profiler import ProfilerActivity, profile

    from gshare.gpukit.analysis import TRACE_COLUMNS, trace_rows

    rows: list[dict[str, Any]] = []
    passes = []
    for name in models:
        model = build(name, tiny).to(dev)
        for batch in batches:
            x = inputs(name, batch, dev)
            for _ in range(5):
                model(**x)
            _sync(dev)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                model(**x)
                _sync(dev)
            spans = sorted(
                (e.time_range.start, e.time_range.end, e.name)
                for e in prof.events()
                if device_kind(e) == "kernel"
            )
            r = trace_rows(name, batch, [(a * 1e3, b * 1e3, n) for a, b, n in spans])
            rows += r
            passes.append(
                {
                    "model": name,
                    "batch": batch,
                    "kernels": len(r),
                    "device_ms": sum(float(x["Duration"]) for x in r) / 1e6,
                    "gap_ms": sum(float(x["Gap"] or 0) for x in r) / 1e6,
                }
            )
        del model
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(TRACE_COLUMNS))
        w.writeheader()
        w.writerows(rows)
    return passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=(*MODELS, "all"))
    modes = ("latency", "saturate", "kernels", "graph", "trace")
    ap.add_argument("--mode", choices=modes, required=True)
    ap.add_argument("--batches", default="1,4", help="trace: batch sizes, comma-separated")
    ap.add_argument("--trace-csv", default="trace.csv", help="trace: where the rows go")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--wait-go", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()

    import torch

    torch.backends.cudnn.benchmark = False  # the same kernels in every run
    dev = a.device
    out: dict[str, Any] = {"model": a.model, "batch": a.batch, "device": dev}
    if a.model == "all" and a.mode != "trace":
        raise SystemExit("the model 'all' is for --mode trace")
    with torch.inference_mode():
        if a.mode == "trace":
            models = list(MODELS) if a.model == "all" else [a.model]
            batches = [int(b) for b in a.batches.split(",") if b.strip()]
            out["passes"] = _trace(models, batches, dev, a.trace_csv, a.tiny)
        elif a.mode == "kernels":
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU]
            if dev.startswith("cuda"):
                acts.append(ProfilerActivity.CUDA)
            with profile(activities=acts) as prof:
                model = build(a.model, a.tiny).to(dev)
                x = inputs(a.model, a.batch, dev)
                for _ in range(a.iters):
                    model(**x)
                _sync(dev)
            n, memops, top = _count_kernels(prof)
            out.update(device_kernels=n, memops=memops, top=top, iters=a.iters)
        elif a.mode == "graph":
            net = torch.nn.Sequential(
                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)
            ).to(dev)
            x = torch.randn(8, 256, device=dev)
            s: Any = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    net(x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                net(x)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(a.iters):
                    g.replay()
                _sync(dev)
            n, _memops, top = _count_kernels(prof)
            out.update(replays=a.iters, device_kernels=n, kernels_per_replay=n / a.iters, top=top)
        else:
            model = build(a.model, a.tiny).to(dev)
            x = inputs(a.model, a.batch, dev)
            for _ in range(a.warmup):
                model(**x)
            _sync(dev)
            if a.mode == "latency":
                times = []
                for _ in range(a.iters):
                    t0 = time.perf_counter()
                    model(**x)
                    _sync(dev)
                    times.append((time.perf_counter() - t0) * 1000.0)
                out.update(
                    iters=a.iters,
                    p50_ms=percentile(times, 50),
                    p99_ms=percentile(times, 99),
                    mean_ms=sum(times) / len(times),
                )
            else:
                if a.wait_go:
                    print("ready", flush=True)
                    sys.stdin.readline()
                n = 0
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < a.seconds:
                    model(**x)
                    _sync(dev)
                    n += 1
                dt = time.perf_counter() - t0
                out.update(iters=n, seconds=dt, items_per_s=n * a.batch / dt)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
