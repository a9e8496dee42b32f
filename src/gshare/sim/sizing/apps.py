"""The 990 Azure Functions 2019 apps the ``bulkx-sizing`` experiment sizes, and how one app's
invocations are drawn.

Data (shipped in ``gshare/data``, attribution in ``NOTICE``; from vhive-serverless/invitro's
``10-1000-10`` sample of the Azure Functions Trace 2019, Shahrad et al., ATC 2020):

* ``azure2019_990_memory.csv`` — per app: ``AverageAllocatedMb`` percentiles 1, 5, 25, 50, 75,
  95, 99, 100 (MB);
* ``azure2019_990_durations.csv`` — per function: execution-time percentiles 0, 1, 25, 50, 75,
  99, 100 (ms);
* ``azure2019_990_invocations.csv.gz`` — per function: invocations in each of the day's 1,440
  minutes.

How they join: each of the 990 apps has exactly one function in this sample (``HashFunction ==
HashApp`` in the durations and invocations files) and the three files hold the same 990
``HashApp`` values in different orders, so rows are joined on ``HashApp`` (checked on load: a
missing or duplicated app is an error).

How an invocation is drawn (``AppTrace``):

* its **memory demand** by inverse-CDF interpolation between the given percentiles: ``u ~ U[0,
  1)``, demand = the piecewise-linear interpolation of (0.01, p1), (0.05, p5), ..., (1.0, p100)
  at ``u``; below the first percentile the demand is p1 (1 % of the mass sits at p1). Every
  demand therefore lies in [p1, p100], and exactly 1 % lies above p99 when p99 < p100;
* its **execution time** likewise from (0, p0), (0.01, p1), ..., (1.0, p100) of the durations,
  independently of its memory (the trace has no joint distribution);
* its **start time** from the app's per-minute counts, uniformly within its minute.

The memory percentiles describe the app's allocated memory sampled over the day, not strictly
per invocation; the issue (and BulkX Fig. 6, "memory usage distribution of Azure dataset") use
them as the per-invocation distribution, and so do we.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

MEMORY_FILE = "azure2019_990_memory.csv"
DURATIONS_FILE = "azure2019_990_durations.csv"
INVOCATIONS_FILE = "azure2019_990_invocations.csv.gz"

MEM_QUANTILES = np.array([0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99, 1.00])
MEM_COLUMNS = tuple(f"AverageAllocatedMb_pct{q}" for q in (1, 5, 25, 50, 75, 95, 99, 100))
DUR_QUANTILES = np.array([0.0, 0.01, 0.25, 0.50, 0.75, 0.99, 1.00])
DUR_COLUMNS = tuple(f"percentile_Average_{q}" for q in (0, 1, 25, 50, 75, 99, 100))
MINUTES = 1440


class TraceError(ValueError):
    """The shipped (or given) files do not join or parse; the message names the problem."""


@dataclass(frozen=True)
class AppTrace:
    """One app: its memory and duration percentiles and its invocations per minute."""

    app: str
    """HashApp."""
    mem_mb: npt.NDArray[np.float64]
    """Memory at ``MEM_QUANTILES`` (non-decreasing), MB."""
    dur_ms: npt.NDArray[np.float64]
    """Execution time at ``DUR_QUANTILES`` (non-decreasing), ms."""
    per_minute: npt.NDArray[np.int64]
    """Invocations in each minute of the day."""

    @property
    def invocations(self) -> int:
        return int(self.per_minute.sum())

    @property
    def p99_mb(self) -> float:
        return float(self.mem_mb[-2])

    @property
    def max_mb(self) -> float:
        return float(self.mem_mb[-1])

    def demand_mb(self, u: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Memory demands at uniform draws ``u`` (module doc: inverse CDF)."""
        return np.interp(u, MEM_QUANTILES, self.mem_mb)

    def exec_s(self, u: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Execution times (s) at uniform draws ``u``."""
        out: npt.NDArray[np.float64] = np.interp(u, DUR_QUANTILES, self.dur_ms) / 1000.0
        return out

    def start_times_s(self, cap: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        """Start times (s, sorted) of ``min(cap, invocations)`` of the app's invocations: all
        of them, or ``cap`` evenly spaced in the day's order (each then stands for
        ``invocations / cap`` real ones)."""
        n = self.invocations
        k = min(cap, n)
        if k == 0:
            return np.empty(0)
        idx = np.floor((np.arange(k) + 0.5) * n / k).astype(np.int64)
        minute = np.searchsorted(np.cumsum(self.per_minute), idx, side="right")
        out: npt.NDArray[np.float64] = np.sort(minute * 60.0 + rng.uniform(0.0, 60.0, k))
        return out


def _data_path(name: str) -> Path:
    return Path(str(resources.files("gshare").joinpath("data", name)))


@cache
def load_apps(folder: str | None = None) -> tuple[AppTrace, ...]:
    """The 990 apps, sorted by ``HashApp`` (module doc: the join). ``folder`` reads the three
    files from elsewhere (same names)."""

    def path(name: str) -> Path:
        return Path(folder) / name if folder else _data_path(name)

    with open(path(MEMORY_FILE), newline="") as f:
        mem = {r["HashApp"]: r for r in csv.DictReader(f)}
    with open(path(DURATIONS_FILE), newline="") as f:
        dur = {r["HashApp"]: r for r in csv.DictReader(f)}
    with gzip.open(path(INVOCATIONS_FILE), "rt", newline="") as f:
        inv = {r["HashApp"]: r for r in csv.DictReader(f)}
    if not (set(mem) == set(dur) == set(inv)):
        raise TraceError("memory, durations and invocations files hold different apps")
    apps = []
    for app in sorted(mem):
        if dur[app]["HashFunction"] != app or inv[app]["HashFunction"] != app:
            raise TraceError(f"app {app[:12]}... has a function of another hash")
        m = np.maximum.accumulate(np.array([float(mem[app][c]) for c in MEM_COLUMNS]))
        d = np.maximum.accumulate(np.array([float(dur[app][c]) for c in DUR_COLUMNS]))
        counts = np.array([int(inv[app][f"minute_{i}"]) for i in range(1, MINUTES + 1)])
        apps.append(AppTrace(app, m, d, counts.astype(np.int64)))
    return tuple(apps)


def pick_apps(apps: tuple[AppTrace, ...], n: int | None) -> tuple[AppTrace, ...]:
    """``n`` apps evenly spaced in ``HashApp`` order (all when ``n`` is None or too large):
    a deterministic, unbiased subset for ``--quick``."""
    if n is None or n >= len(apps):
        return apps
    idx = np.floor((np.arange(n) + 0.5) * len(apps) / n).astype(np.int64)
    return tuple(apps[int(i)] for i in idx)
