"""Shared helpers of the FaST experiments: one GPU with pods under a saturating load, and plots.

``run_saturated`` builds one ``SimGpu`` with a set of pods (``Pod``: an instance with a model and
a ``GpuShare``), keeps ``users_per_pod`` requests per pod outstanding (closed loop, zero think
time: one batch in service and one waiting, so a pod never idles for lack of work), discards a
warm-up and measures for ``measure_ms``:

* throughput — requests *finished* in the measured span ÷ its length;
* latency percentiles — over those same requests (queueing at the pod included) *plus* every
  request still outstanding at the end, counted with its age then (a lower bound of its
  latency). Without the censored ones a pod the token scheduler starves would simply drop out
  of the percentiles; ``starved_pods`` and ``stuck_requests`` make such starvation visible;
* ``utilisation`` — the GPU's share of time with at least one burst running (``GpuStats``);
* ``sm_occupancy`` — ``GpuStats.sm_occupancy``: time-weighted SM % *allocated* to the running
  bursts (their MPS partitions) ÷ 100;
* ``sm_effective`` — time-weighted SM % the running bursts can *keep busy* ÷ 100, where a burst of
  model m on a partition of p % SMs keeps ``effective_sm_pct(m, p)`` busy (see below).

NOTE — effective SM occupancy. The papers' "SM occupancy" is a hardware counter (DCGM: warps
resident on the SMs), not the partition size. A batch-1 ResNet-50 given 100 % of the SMs does not
fill them: the shipped V100 table shows it barely faster at 100 % than at 10 % (20.6 vs 21.0 ms).
``GpuStats.sm_occupancy`` would count such a pod as 100 % busy, and so rank time sharing (every
pod on all SMs) above spatial sharing, the opposite of what DCGM shows (FaST-GShare Fig. 10, 11).
We therefore also report an effective occupancy read off the solo profile: the SMs a model can use
on a p % partition is the smallest measured SM share s <= p at which it runs at most ``tol``
(5 %) slower than on p, i.e. the SMs beyond s add < 5 % speed and we count them as idle. The table
is noisy (±5 % between neighbouring points), so this is a coarse estimate, documented as such.

Who calls it: ``fast_spatial`` and ``fast_packing`` (one call per GPU and configuration).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gshare.policy.tokens import TokenConfig
from gshare.profiles import ProfileTable
from gshare.resources import GpuShare
from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.gpu import InterferenceModel, SimGpu
from gshare.sim.instance import InstanceConfig, SimInstance
from gshare.sim.request import SimRequest
from gshare.sim.workload import drive_closed_loop

EFFECTIVE_SM_TOLERANCE = 0.05
"""A partition's SMs beyond the effective share speed the model up by less than this."""


@dataclass(frozen=True, slots=True)
class Pod:
    """One function instance to put on the GPU."""

    instance_id: str
    function: str
    model: str
    """Model name in the profile table."""
    share: GpuShare
    max_batch: int = 1


@dataclass
class GpuRun:
    """What ``run_saturated`` measured on one GPU over the measured span."""

    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    utilisation: float
    """Fraction of time at least one burst ran."""
    sm_occupancy: float
    """Time-weighted allocated SM fraction of running bursts (``GpuStats.sm_occupancy``)."""
    sm_effective: float
    """Time-weighted effective SM fraction of running bursts (module NOTE)."""
    per_function: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{function: {"throughput_rps", "p99_ms", "requests"}}``."""
    busy_ms: dict[str, float] = field(default_factory=dict)
    """GPU time (ms with a burst running) of every pod in the measured span."""
    measured_ms: float = 0.0
    events: int = 0
    starved_pods: int = 0
    """Pods that never ran during the measured span."""
    stuck_requests: int = 0
    """Requests still outstanding at the end that arrived before the measured span began."""


def effective_sm_pct(
    profiles: ProfileTable,
    model: str,
    sm_pct: float,
    batch: int = 1,
    tol: float = EFFECTIVE_SM_TOLERANCE,
) -> float:
    """SM % a ``model`` burst keeps busy on a ``sm_pct`` partition (module NOTE).

    The smallest measured SM share ``s <= sm_pct`` (quota 100 %, this batch) whose latency is at
    most ``(1 + tol)`` times the latency at ``sm_pct``; ``sm_pct`` itself when none is measured.
    """
    lat_p = profiles.latency_ms(model, sm_pct, 100.0, batch)
    measured_b = batch if batch in profiles.batches(model) else 1
    for s in profiles.sm_values(model, measured_b, 100.0):
        if s > sm_pct + 1e-9:
            break
        if profiles.latency_ms(model, s, 100.0, batch) <= (1.0 + tol) * lat_p:
            return float(s)
    return float(sm_pct)


class MeteredGpu(SimGpu):
    """A ``SimGpu`` that also integrates each client's running time since ``reset_stats``.

    It hooks ``SimGpu._settle_metrics``, which the GPU calls just before every change of the set
    of running bursts (and when stats are read), so the per-client integrals are exact.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self.client_busy_ms: dict[str, float] = {}

    def _settle_metrics(self) -> None:
        dt = self.loop.now_ms - self._last_change
        if dt > 0:
            busy = self.client_busy_ms
            for cid in self._running:
                busy[cid] = busy.get(cid, 0.0) + dt
        super()._settle_metrics()

    def reset_stats(self) -> None:
        super().reset_stats()
        self.client_busy_ms = {}


def run_saturated(
    pods: Sequence[Pod],
    *,
    profiles: ProfileTable | None = None,
    interference: bool = True,
    warmup_ms: float = 1000.0,
    measure_ms: float = 5000.0,
    users_per_pod: int = 2,
    noise_sigma: float = 0.0,
    seed: int = 0,
    token_config: TokenConfig | None = None,
) -> GpuRun:
    """Simulate ``pods`` sharing one GPU under a saturating closed-loop load (module doc).

    Every pod registers with the GPU's token scheduler with its share (SM %, quota request,
    quota limit); the requests of one function are routed join-the-shortest-queue over its pods.
    """
    if not pods:
        raise ValueError("run_saturated needs at least one pod")
    profiles = profiles or ProfileTable.shipped_v100()
    loop = EventLoop()
    gpu = MeteredGpu(
        loop,
        token_config=token_config or TokenConfig(),
        interference=InterferenceModel(enabled=interference),
    )
    gateway = Gateway(loop)
    done: list[SimRequest] = []

    def on_complete(req: SimRequest) -> None:
        done.append(req)
        gateway.completed(req)

    users: dict[str, int] = {}
    effective: dict[str, float] = {}
    instances: list[SimInstance] = []
    for i, pod in enumerate(pods):
        cfg = InstanceConfig(
            function=pod.function,
            model=pod.model,
            share=pod.share,
            max_batch=pod.max_batch,
            noise_sigma=noise_sigma,
        )
        gateway.register(pod.function)
        inst = SimInstance(
            loop, gpu, pod.instance_id, cfg, profiles, np.random.default_rng([seed, i]), on_complete
        )
        gateway.add_instance(inst)
        instances.append(inst)
        users[pod.function] = users.get(pod.function, 0) + users_per_pod
        effective[pod.instance_id] = effective_sm_pct(
            profiles, pod.model, pod.share.sm_pct, pod.max_batch
        )
    end_ms = warmup_ms + measure_ms
    for fn, n in users.items():
        drive_closed_loop(loop, gateway, fn, n, until_ms=end_ms)
    loop.run(until_ms=warmup_ms)
    gpu.reset_stats()
    loop.run(until_ms=end_ms)
    stats = gpu.stats()
    measured = [r for r in done if warmup_ms < r.finish_ms <= end_ms]
    outstanding = [r for inst in instances for r in (*inst.queue, *inst.in_flight)]
    span_s = measure_ms / 1000.0
    per_function: dict[str, dict[str, float]] = {}
    for fn in users:
        n_fn = sum(1 for r in measured if r.function == fn)
        lat_fn = np.array(
            [r.latency_ms for r in measured if r.function == fn]
            + [end_ms - r.arrival_ms for r in outstanding if r.function == fn]
        )
        per_function[fn] = {
            "requests": float(n_fn),
            "throughput_rps": n_fn / span_s,
            "p99_ms": float(np.percentile(lat_fn, 99)) if len(lat_fn) else float("nan"),
        }
    lat = np.array([r.latency_ms for r in measured] + [end_ms - r.arrival_ms for r in outstanding])
    busy = {p.instance_id: gpu.client_busy_ms.get(p.instance_id, 0.0) for p in pods}
    eff_pct_ms = sum(busy[cid] * effective[cid] for cid in busy)
    return GpuRun(
        throughput_rps=len(measured) / span_s,
        p50_ms=float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        p99_ms=float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        mean_ms=float(lat.mean()) if len(lat) else float("nan"),
        utilisation=stats.utilisation,
        sm_occupancy=stats.sm_occupancy,
        sm_effective=eff_pct_ms / 100.0 / stats.elapsed_ms if stats.elapsed_ms > 0 else 0.0,
        per_function=per_function,
        busy_ms=busy,
        measured_ms=stats.elapsed_ms,
        events=loop.events_processed,
        starved_pods=sum(1 for v in busy.values() if v <= 0.0),
        stuck_requests=sum(1 for r in outstanding if r.arrival_ms <= warmup_ms),
    )


def line_plot(
    folder: Path,
    filename: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    x: str,
    y: str,
    series: Sequence[str],
    title: str,
    ylabel: str,
    logy: bool = False,
) -> Path:
    """One PNG: ``y`` against ``x``, one line per distinct value of the ``series`` columns.

    Series whose label ends with ``interference=False`` are dashed.
    """
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        label = ", ".join(f"{k}={r[k]}" for k in series)
        lines.setdefault(label, []).append((float(r[x]), float(r[y])))
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts in lines.items():
        pts.sort()
        style = "--" if label.endswith("interference=False") else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = folder / filename
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def bar_plot(
    folder: Path,
    filename: str,
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    ylabel: str,
) -> Path:
    """One PNG of grouped bars: ``groups[group][bar] = value``."""
    import matplotlib.pyplot as plt

    names = list(groups)
    bars: list[str] = []
    for g in groups.values():
        bars.extend(b for b in g if b not in bars)
    width = 0.8 / max(1, len(bars))
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, b in enumerate(bars):
        xs = [i + j * width for i in range(len(names))]
        ax.bar(xs, [groups[g].get(b, 0.0) for g in names], width, label=b)
    ax.set_xticks([i + width * (len(bars) - 1) / 2 for i in range(len(names))])
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = folder / filename
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
