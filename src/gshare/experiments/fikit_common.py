"""Shared helpers of the ``fikit-*`` experiments (FIKIT §4): models, profiles, statistics.

Who calls it: ``experiments.fikit_pairs`` (``fikit-sharing``, ``fikit-preempt``),
``experiments.fikit_low`` (``fikit-exclusive``, ``fikit-stability``) and
``experiments.fikit_overhead``. Every experiment runs services on the kernel-level GPU model
(``sim.kernels``): calibrated launch streams of the shipped V100 kernel profiles on a
time-sliced device, in exclusive, default-sharing or FIKIT mode (the latter driving
``policy.priority.FikitScheduler``). FIKIT profiles are measured once per service by
``sim.kernels.scenario.measure_profile`` (the measurement phase, T runs alone) and loaded by
service name, as FIKIT loads a task's profile by its task key.

Naming: a *pair* is ``(high, low)`` — the high-priority service A (priority 9) and the
low-priority service B (priority 1), each one of the shipped passes (``sim.kernels.catalogue``).
Ratios follow the paper's figures: a *speedup* of A is JCT under default sharing ÷ JCT under
FIKIT (> 1: FIKIT is faster); ``low_jct_ratio_vs_sharing`` is B's JCT under sharing ÷ under
FIKIT (< 1: B is slower under FIKIT; the paper's Fig. 17 and 20 "speedup" of the low-priority
task); Fig. 18's ratio is B's JCT under exclusive mode ÷ under FIKIT.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gshare.policy.priority import FikitConfig, KernelProfile
from gshare.sim.kernels.catalogue import HostMode, TaskModel, measured_task_model, task_model
from gshare.sim.kernels.scenario import DeviceParams, ScenarioResult, measure_profile
from gshare.sim.kernels.stream import HookCosts, Jitter, TaskRecord

HIGH_PRIORITY = 9
LOW_PRIORITY = 1

INF = ("resnet50_4_fwd", "resnet101_4_fwd", "mobilenetv2_4_fwd")
"""The shipped inference passes (batch 4): the services of the experiments."""

COMMON_PARAMS: dict[str, Any] = {
    "timeslice_ms": 1.024,
    "switch_ms": 0.025,
    "measure_runs": 10,
    "gap_sigma": 0.5,
    "op_weights": True,
    "inference_host": "sync",
    "train_host_ms": 0.02,
    "kernel_sigma": 0.05,
    "host_sigma": 0.1,
    "intercept_ms": 0.002,
    "release_ms": 0.03,
    "measure_ms": 0.04,
    "min_gap_ms": 0.1,
    "gap_feedback_alpha": 0.0,
    "fill_overhead_ms": 0.0,
    "backlog_horizon_ms": 0.2,
    "kernel_trace": "",
}
"""Parameters every ``fikit-*`` experiment shares (their meaning and sources: ``sim.kernels``
and ``policy.priority.scheduler``). ``kernel_trace``: a launch-order trace measured on a GPU
(the GPU kit's ``kernel-trace.csv``); when set, the inference services run on it
(``catalogue.measured_task_model``) instead of the calibrated V100 passes, and ``switch_ms``
should be the kit's measured context-switch cost. The training passes stay V100's."""

PAPER = {
    "high_jct_speedup_vs_sharing": {"min": 1.32, "max": 16.41, "median_above": 3.4},
    "low_jct_ratio_vs_sharing_preempt": {"min": 0.86, "max": 1.0},
    "low_jct_cv": {"min": 0.095, "max": 0.164},
    "sharing_overhead_pct": {"min": 0.09, "max": 4.93},
    "measuring_overhead_pct": {"min": 34.52, "max": 71.78},
}


@dataclass
class Bench:
    """Calibrated models and measured FIKIT profiles of one experiment run (cached)."""

    params: Mapping[str, Any]
    seed: int
    _models: dict[str, TaskModel] = field(default_factory=dict)
    _profiles: dict[str, KernelProfile] = field(default_factory=dict)

    def model(self, name: str) -> TaskModel:
        m = self._models.get(name)
        if m is None:
            p = self.params
            inf = HostMode(str(p["inference_host"]))
            trace = str(p.get("kernel_trace") or "")
            if trace and name.endswith("_fwd"):
                try:
                    text = Path(trace).read_text()
                except OSError as e:
                    raise ValueError(f"kernel_trace: cannot read {trace}: {e.strerror}") from None
                m = measured_task_model(text, name)
                self._models[name] = m
                return m
            m = task_model(
                name,
                host_mode=inf if name.endswith("_fwd") else None,
                gap_sigma=float(p["gap_sigma"]),
                op_weights=bool(p["op_weights"]),
                train_host_ms=float(p["train_host_ms"]),
            )
            self._models[name] = m
        return m

    def profile(self, name: str) -> KernelProfile:
        """FIKIT's measurement phase of ``name`` alone (T runs), once per experiment run."""
        prof = self._profiles.get(name)
        if prof is None:
            prof, _ = measure_profile(
                name,
                self.model(name),
                int(self.params["measure_runs"]),
                seed=self.seed,
                device=self.device(),
                hooks=self.hooks(),
                jitter=self.jitter(),
            )
            self._profiles[name] = prof
        return prof

    def device(self, switch_ms: float | None = None) -> DeviceParams:
        p = self.params
        sw = float(p["switch_ms"]) if switch_ms is None else switch_ms
        return DeviceParams(float(p["timeslice_ms"]), sw)

    def hooks(self) -> HookCosts:
        p = self.params
        return HookCosts(float(p["intercept_ms"]), float(p["release_ms"]), float(p["measure_ms"]))

    def jitter(self) -> Jitter:
        return Jitter(float(self.params["kernel_sigma"]), float(self.params["host_sigma"]))

    def fikit(self) -> FikitConfig:
        p = self.params
        return FikitConfig(
            min_gap_ms=float(p["min_gap_ms"]),
            measure_runs=int(p["measure_runs"]),
            gap_feedback_alpha=float(p["gap_feedback_alpha"]),
            fill_overhead_ms=float(p["fill_overhead_ms"]),
            backlog_horizon_ms=float(p["backlog_horizon_ms"]),
        )

    def run_kwargs(self, switch_ms: float | None = None) -> dict[str, Any]:
        """Keyword arguments of ``run_scenario`` shared by every run of the experiment."""
        return {
            "seed": self.seed,
            "device": self.device(switch_ms),
            "hooks": self.hooks(),
            "jitter": self.jitter(),
            "fikit": self.fikit(),
        }


def pair_label(high: str, low: str) -> str:
    return f"{short(high)} > {short(low)}"


def short(name: str) -> str:
    """``resnet50_4_fwd`` -> ``resnet50/4``; ``bert_8_fb1`` -> ``bert/8 train``."""
    model, batch, tag = name.rsplit("_", 2)
    return f"{model}/{batch}" + ("" if tag == "fwd" else " train")


def jct_ms(result: ScenarioResult, service: str) -> tuple[float, int, int]:
    """Mean JCT of ``service``'s tasks (measured-phase tasks excluded), the number completed,
    and the number still running at the horizon. A task still running counts with its age at
    the horizon (a lower bound of its JCT) when that age is above the mean of the completed ones
    or none completed — so a starved service is not dropped, and the partial last task of a
    closed loop does not pull the mean down."""
    recs: list[TaskRecord] = [r for r in result.records[service] if not r.measured]
    done = [r.jct_ms for r in recs if r.done]
    open_ = [result.horizon_ms - r.arrival_ms for r in recs if not r.done]
    mean_done = float(np.mean(done)) if done else 0.0
    vals = done + [a for a in open_ if not done or a > mean_done]
    return (float(np.mean(vals)) if vals else float("nan"), len(done), len(open_))


def spread(values: Iterable[float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` of the finite values (NaN when there are none)."""
    v = [x for x in values if np.isfinite(x)]
    if not v:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {"min": float(min(v)), "median": float(np.median(v)), "max": float(max(v))}


def bar_plot(
    folder: Path,
    filename: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    logy: bool = False,
    hline: float | None = None,
    hline_label: str = "",
) -> Path:
    """One PNG of grouped bars: one group per label, one bar per series."""
    import matplotlib.pyplot as plt

    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(labels) + 2), 4.2))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + (i - (n - 1) / 2) * width, vals, width, label=name)
    if hline is not None:
        ax.axhline(hline, color="k", ls="--", lw=0.8, label=hline_label or None)
    if logy:
        ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = folder / filename
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
