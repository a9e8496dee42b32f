"""Kernel-level task models: the shipped V100 kernel profiles, calibrated to the V100 table.

A *task* (one inference pass, one training step) is a launch stream: kernels in launch order,
each preceded by a host segment (the host's work before it launches the kernel). This module
loads the kernels of a pass from ``gshare/data/orion_v100_kernels/`` (Orion's Nsight
measurements on a V100; see ``NOTICE``) and chooses the host segments.

Who calls it: ``sim.kernels.scenario`` (the experiments build their services from
``task_model``); ``tests/sim/test_kernels_model.py`` checks the calibration,
``test_kernels_measured.py`` the measured passes.

NOTE — calibration (gshare's; the data give kernel durations but no host times). An inference
pass alone must take the V100 table's full-quota latency L of the same model and batch (SM 100 %,
quota 100 %: resnet50 b4 21.1 ms, resnet101 b4 32.5 ms, mobilenet_v2 b4 14.0 ms), while its
kernels add up to D = 6.5 / 11.6 / 2.3 ms: the rest is host time. Assumptions, stated:

* **shape** — host time goes with the op being launched: the segment before kernel i is
  ``w(op_i) x j_i x scale``. ``w`` is 3 for a library call (a cuDNN convolution, a cuBLAS GEMM:
  descriptor set-up, algorithm lookup), 2 for a normalisation (cuDNN batch norm), 1 for an
  ATen native kernel (element-wise, pooling, reductions) — the order of PyTorch's per-op host
  costs, not a measurement; ``j_i`` is lognormal (median 1, ``gap_sigma`` = 0.5), drawn once
  per pass from a seed derived from its name (Python work between ops; a property of the model,
  the same in every run — per-run jitter is the scenario's). The data say nothing about how host
  time is spread over the launches, and it matters: FIKIT fills only gaps of 0.1 ms and more,
  predicted per kernel ID, so a gap must follow its kernel's ID. With this shape the gap after a
  ReLU is the set-up of the convolution that follows it, as in a ResNet block. Equal segments
  (``op_weights=False, gap_sigma=0``) and i.i.d. lognormal segments are reported beside it in
  docs/journal/priority.md.
* **host mode** — ``HostMode.SYNC`` (inference, the default): each launch waits for the previous
  kernel to complete, so the gap after kernel i is host segment i + 1 and
  ``L = sum(host) + D``: the scale is ``(L - D) / sum(w)``. This is FIKIT's own task model
  (FIKIT §3.2: the gap is the time from a kernel's end to the next kernel's start, measured
  alone and reused under sharing, which holds when the host's next launch follows the kernel's
  completion). ``HostMode.ASYNC``: launches run ahead of the device (the host waits only at the
  end of the pass and when ``queue_depth`` kernels are outstanding); the scale is found by
  bisection so that the simulated solo pass takes L. Training passes are ASYNC by default.
* **training passes** (Orion's ``*_fb1``: forward + backward of one training step; the
  ``*_fb0`` files list the same kernels with placeholder durations of 7 ns and are not shipped)
  have no V100-table latency: their host segments have the same shape with mean
  ``train_host_ms`` (20 µs, PyTorch's eager per-op dispatch cost in order of magnitude), i.e.
  they are device-bound, as large-batch training is.
* **measured passes** (``measured_task_model``) — with a launch-order trace measured on a real
  GPU (the GPU kit's ``kernel-trace.csv``: each kernel's duration and the idle gap after it,
  taken alone), nothing is assumed: the kernels and their durations are the trace's and the
  host segment before kernel i + 1 is the measured gap after kernel i (``HostMode.SYNC``,
  FIKIT's own model: gaps measured alone and reused under sharing). ``target_ms`` is then the
  measured pass's solo latency.
* **kernel identity** — the profiles record no grid or block, only Orion's ``SM_usage`` (the SMs
  a kernel needs, derived from its blocks): the simulator's ``KernelId`` is the kernel name with
  grid ``(SM_usage, 1, 1)`` and block ``(1, 1, 1)``. Launches of one ID differ in duration (Conv
  at SM_usage 98 appears 17 times in resnet50 with different lengths), as the paper's Fig. 5
  warns; SK and SG are means over them.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from dataclasses import dataclass
from enum import Enum
from functools import cache
from importlib import resources

import numpy as np

from gshare.policy.priority import KernelId
from gshare.profiles import ProfileTable

KERNEL_DIR = "orion_v100_kernels"
DEFAULT_GAP_SIGMA = 0.5
DEFAULT_TRAIN_HOST_MS = 0.02
DEFAULT_QUEUE_DEPTH = 1024
"""Kernels an ASYNC host may have outstanding before its launch blocks (CUDA's launch queue)."""

TABLE_MODEL = {"resnet50": "resnet50", "resnet101": "resnet101", "mobilenetv2": "mobilenet_v2"}
"""Kernel-profile model name -> V100 table model name (the models that can be calibrated)."""

INFERENCE_PASSES = ("resnet50_4_fwd", "resnet101_4_fwd", "mobilenetv2_4_fwd")
TRAINING_PASSES = (
    "resnet50_32_fb1",
    "resnet101_32_fb1",
    "mobilenetv2_32_fb1",
    "bert_8_fb1",
    "transformer_xl_8_fb1",
)
SHIPPED_PASSES = INFERENCE_PASSES + TRAINING_PASSES


class CatalogueError(LookupError):
    """An unknown pass or one that cannot be calibrated."""


class PassKind(Enum):
    INFERENCE = "inference"
    TRAINING = "training"


class HostMode(Enum):
    """How a task's host issues its launches (module NOTE)."""

    SYNC = "sync"
    """Each launch waits for the previous kernel to complete (FIKIT's task model)."""
    ASYNC = "async"
    """Launches run ahead of the device; the host waits at the end of the pass."""


@dataclass(frozen=True, slots=True)
class KernelSpec:
    kernel: KernelId
    duration_ms: float
    """Solo duration on the V100 (Nsight)."""


@dataclass(frozen=True, slots=True)
class PassKernels:
    """The kernels of one shipped pass, in launch order."""

    name: str
    """File stem, e.g. ``resnet50_4_fwd``."""
    model: str
    batch: int
    kind: PassKind
    kernels: tuple[KernelSpec, ...]

    @property
    def device_ms(self) -> float:
        return sum(k.duration_ms for k in self.kernels)


@dataclass(frozen=True, slots=True)
class TaskModel:
    """A calibrated launch stream: ``host_ms[i]`` of host work precede ``kernels[i]``."""

    name: str
    kind: PassKind
    kernels: tuple[KernelSpec, ...]
    host_ms: tuple[float, ...]
    host_mode: HostMode
    target_ms: float | None
    """The V100 table latency the pass was calibrated to (None: training, not calibrated)."""
    queue_depth: int = DEFAULT_QUEUE_DEPTH

    @property
    def device_ms(self) -> float:
        return sum(k.duration_ms for k in self.kernels)

    @property
    def solo_ms(self) -> float:
        """Latency of one pass alone on the device (no switches, no jitter)."""
        return solo_latency_ms(self.kernels, self.host_ms, self.host_mode, self.queue_depth)


@cache
def load_pass(name: str) -> PassKernels:
    """The kernels of a shipped pass (``SHIPPED_PASSES``)."""
    if name not in SHIPPED_PASSES:
        raise CatalogueError(f"unknown pass {name!r} (shipped: {', '.join(SHIPPED_PASSES)})")
    ref = resources.files("gshare").joinpath("data", KERNEL_DIR, f"{name}.csv.gz")
    text = gzip.decompress(ref.read_bytes()).decode()
    kernels = []
    for row in csv.DictReader(io.StringIO(text)):
        sm = max(1, int(row["SM_usage"]))
        kid = KernelId.gpu(row["Name"], (sm, 1, 1), (1, 1, 1))
        kernels.append(KernelSpec(kid, float(row["Duration"]) / 1e6))
    model, batch, tag = name.rsplit("_", 2)
    kind = PassKind.INFERENCE if tag == "fwd" else PassKind.TRAINING
    return PassKernels(name, model, int(batch), kind, tuple(kernels))


def solo_latency_ms(
    kernels: tuple[KernelSpec, ...],
    host_ms: tuple[float, ...],
    mode: HostMode,
    queue_depth: int = DEFAULT_QUEUE_DEPTH,
) -> float:
    """End of the last kernel of one pass alone, host starting at 0 (no switches, no jitter)."""
    if mode is HostMode.SYNC:
        return sum(host_ms) + sum(k.duration_ms for k in kernels)
    ends: list[float] = []
    host = 0.0
    dev = 0.0
    for i, (k, h) in enumerate(zip(kernels, host_ms, strict=True)):
        host += h
        if i >= queue_depth:  # the launch blocks until the kernel queue_depth back completed
            host = max(host, ends[i - queue_depth])
        dev = max(dev, host) + k.duration_ms
        ends.append(dev)
    return dev


def op_weight(kernel_name: str) -> float:
    """Relative host cost of launching a kernel of this name (module NOTE, "shape")."""
    if kernel_name == "Conv" or "gemm" in kernel_name or "splitKreduce" in kernel_name:
        return 3.0
    if "Norm" in kernel_name:
        return 2.0
    return 1.0


def _shape(p: PassKernels, sigma: float, op_weights: bool) -> np.ndarray:
    n = len(p.kernels)
    rng = np.random.default_rng(zlib.crc32(p.name.encode()))
    jit = np.asarray(rng.lognormal(0.0, sigma, n)) if sigma > 0 else np.ones(n)
    if not op_weights:
        return jit
    return np.asarray(jit * np.array([op_weight(k.kernel.name) for k in p.kernels]))


def task_model(
    name: str,
    *,
    host_mode: HostMode | None = None,
    gap_sigma: float = DEFAULT_GAP_SIGMA,
    op_weights: bool = True,
    train_host_ms: float = DEFAULT_TRAIN_HOST_MS,
    table: ProfileTable | None = None,
    queue_depth: int = DEFAULT_QUEUE_DEPTH,
) -> TaskModel:
    """The calibrated launch stream of a shipped pass (module NOTE). Inference passes default to
    ``HostMode.SYNC`` and are calibrated to the V100 table; training passes to ``ASYNC``."""
    p = load_pass(name)
    mode = host_mode or (HostMode.SYNC if p.kind is PassKind.INFERENCE else HostMode.ASYNC)
    w = _shape(p, gap_sigma, op_weights)
    if p.kind is PassKind.TRAINING:
        host = tuple(float(x) for x in w / w.mean() * train_host_ms)
        return TaskModel(name, p.kind, p.kernels, host, mode, None, queue_depth)
    tname = TABLE_MODEL.get(p.model)
    if tname is None:
        raise CatalogueError(f"pass {name!r}: model {p.model!r} is not in the V100 table")
    target = (table or ProfileTable.shipped_v100()).latency_ms(tname, 100.0, 100.0, p.batch)
    d = p.device_ms
    if target <= d:
        raise CatalogueError(f"{name}: table latency {target} ms <= kernel time {d} ms")
    if mode is HostMode.SYNC:
        scale = (target - d) / float(w.sum())
    else:
        scale = _bisect_scale(p.kernels, w, target, queue_depth)
    host = tuple(float(x) for x in w * scale)
    return TaskModel(name, p.kind, p.kernels, host, mode, target, queue_depth)


TRACE_MODEL = {"resnet50": "resnet50", "resnet101": "resnet101", "mobilenetv2": "mobilenet_v2"}
"""Shipped pass model -> the model name in a measured trace (the GPU kit's workload names)."""


def measured_task_model(
    trace_csv: str, name: str, queue_depth: int = DEFAULT_QUEUE_DEPTH
) -> TaskModel:
    """The launch stream of the shipped inference pass ``name``'s model and batch as a trace
    measured it (module NOTE, "measured passes"). ``trace_csv``: the text of a trace with the
    columns ``model, batch, Name, SM_usage, Duration, Gap`` (ns; ``gshare.gpukit.analysis.
    TRACE_COLUMNS``), one row per kernel in launch order. Raises ``CatalogueError`` naming the
    pass when the trace does not hold it, or a row is malformed."""
    p = load_pass(name)
    if p.kind is not PassKind.INFERENCE:
        raise CatalogueError(f"pass {name!r}: only inference passes are measured by the kit")
    model = TRACE_MODEL.get(p.model, p.model)
    kernels: list[KernelSpec] = []
    gaps: list[float] = []
    for i, row in enumerate(csv.DictReader(io.StringIO(trace_csv)), start=2):
        try:
            if row["model"] != model or int(row["batch"]) != p.batch:
                continue
            sm = max(1, int(row.get("SM_usage") or 1))
            kid = KernelId.gpu(row["Name"] or "kernel", (sm, 1, 1), (1, 1, 1))
            kernels.append(KernelSpec(kid, float(row["Duration"]) / 1e6))
            gaps.append(float(row["Gap"] or 0.0) / 1e6)
        except (KeyError, TypeError, ValueError) as e:
            raise CatalogueError(f"trace line {i}: {type(e).__name__}: {e}") from None
    if not kernels:
        raise CatalogueError(f"pass {name!r}: the trace has no {model} at batch {p.batch}")
    host = (0.0, *gaps[:-1])
    solo = sum(host) + sum(k.duration_ms for k in kernels)
    return TaskModel(name, p.kind, tuple(kernels), host, HostMode.SYNC, solo, queue_depth)


def _bisect_scale(
    kernels: tuple[KernelSpec, ...], w: np.ndarray, target: float, depth: int
) -> float:
    lo, hi = 0.0, target / float(w.sum())  # hi: the host alone takes the target
    while solo_latency_ms(kernels, tuple(float(x) for x in w * hi), HostMode.ASYNC, depth) < target:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lat = solo_latency_ms(kernels, tuple(float(x) for x in w * mid), HostMode.ASYNC, depth)
        if lat < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
