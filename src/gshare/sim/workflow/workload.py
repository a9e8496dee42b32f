"""Request streams of ESG's evaluation (§4.1) and the Azure Functions 2021 replay.

§4.1: "one of the four DNN applications is randomly picked to get invoked in each time
interval. The length of a job arrival interval is selected randomly in ranges [10–16.8ms],
[20–33.6ms], and [40–67.2ms]" for the heavy, normal and light loads. ``uniform_intervals``
draws those intervals; ``pick_applications`` draws the application of every arrival, uniformly.

``azure2021_arrivals`` replays the shipped Azure Functions 2021 sample
(``gshare.sim.workload.azure2021``, 199 invocations over 20 minutes, very bursty), compressed
with ``scale_to_rate`` to the mean rate of a load level and repeated end to end (the next copy
starts one mean interval after the last arrival of the previous) until the duration is filled.

Every stream is a list of ``(arrival_ms, application)`` sorted by time; the random draws come
from generators seeded by the caller, so a seed gives the same stream to every scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gshare.sim.workload import azure2021, scale_to_rate
from gshare.workflows.catalogue import ARRIVAL_INTERVAL_MS, Load


def mean_rate_rps(load: Load) -> float:
    """Mean arrival rate of a load level: 1000 / the mean of its interval range."""
    lo, hi = ARRIVAL_INTERVAL_MS[load]
    return 1000.0 / ((lo + hi) / 2.0)


def uniform_intervals(
    lo_ms: float, hi_ms: float, duration_ms: float, rng: np.random.Generator, start_ms: float = 0.0
) -> np.ndarray:
    """Arrival times in ``[start_ms, start_ms + duration_ms)`` with intervals uniform in
    ``[lo_ms, hi_ms]`` (the first arrival one interval after ``start_ms``)."""
    if not 0 < lo_ms <= hi_ms:
        raise ValueError(f"need 0 < lo_ms <= hi_ms, got {lo_ms}, {hi_ms}")
    n = int(duration_ms / lo_ms) + 2
    t = start_ms + np.cumsum(rng.uniform(lo_ms, hi_ms, n))
    out: np.ndarray = t[t < start_ms + duration_ms]
    return out


def azure2021_arrivals(duration_ms: float, rate_rps: float) -> np.ndarray:
    """The Azure 2021 sample scaled to ``rate_rps`` and tiled over ``duration_ms`` (module doc)."""
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps}")
    base = scale_to_rate(azure2021(), rate_rps)
    gap = 1000.0 / rate_rps
    period = float(base[-1]) + gap
    copies = int(duration_ms // period) + 1
    t = np.concatenate([base + k * period for k in range(copies)])
    out: np.ndarray = t[t < duration_ms]
    return out


def pick_applications(
    times_ms: np.ndarray, applications: Sequence[str], rng: np.random.Generator
) -> list[tuple[float, str]]:
    """Pair every arrival with an application drawn uniformly."""
    if not applications:
        raise ValueError("no applications to pick from")
    idx = rng.integers(0, len(applications), len(times_ms))
    return [(float(t), applications[int(i)]) for t, i in zip(times_ms, idx, strict=True)]


def load_arrivals(
    load: Load,
    duration_ms: float,
    applications: Sequence[str],
    seed: int,
    *,
    trace: str = "uniform",
) -> list[tuple[float, str]]:
    """The request stream of one load level: ``trace="uniform"`` (§4.1) or ``"azure2021"``."""
    rng = np.random.default_rng([seed, 101])
    if trace == "uniform":
        lo, hi = ARRIVAL_INTERVAL_MS[load]
        times = uniform_intervals(lo, hi, duration_ms, rng)
    elif trace == "azure2021":
        times = azure2021_arrivals(duration_ms, mean_rate_rps(load))
    else:
        raise ValueError(f"unknown trace {trace!r} (known: uniform, azure2021)")
    return pick_applications(times, applications, np.random.default_rng([seed, 102]))
