"""Pure analyses of the kit's measurements (no I/O): the time-slice context-switch cost and the
kernel table.

**Switch cost** (FIKIT §2's "context switch" of default time-slicing; NOTE: NVIDIA publishes no
figure, so the kit measures it). Two processes each launch one single-thread kernel
(``probe spin``) that reads ``%globaltimer`` in a tight loop for a few hundred ms and records
every interruption: two consecutive reads further apart than a threshold (2 us) mean its
context was off the device. ``%globaltimer`` is one clock for the whole GPU, so the two
timelines merge: each process's *running* intervals are its kernel's span minus its
interruptions; sorted together, a hand-over is a running interval of one process followed by
one of the other, and the idle time between them — the first read of the incoming context
minus the last read of the outgoing one — is one context switch (an upper bound by the read
loop's period, well under a microsecond). If the intervals overlap instead, the device ran
both at once (MPS, or an idle SM each) and there is no switch to measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Interval = tuple[int, int]


@dataclass(frozen=True)
class SpinTimeline:
    """One ``probe spin`` kernel: its span and interruptions, globaltimer ns."""

    start_ns: int
    end_ns: int
    gaps: tuple[Interval, ...]

    def running(self) -> list[Interval]:
        """The kernel's span minus its interruptions."""
        out, t = [], self.start_ns
        for a, b in sorted(self.gaps):
            if a > t:
                out.append((t, a))
            t = max(t, b)
        if self.end_ns > t:
            out.append((t, self.end_ns))
        return out

    @classmethod
    def parse(cls, text: str) -> SpinTimeline:
        """The probe's file: ``start end n`` then ``from to`` per interruption; ``#`` comments.
        Raises ``ValueError`` naming what is malformed."""
        rows = [x.split() for x in text.splitlines() if x.strip() and not x.startswith("#")]
        if not rows or len(rows[0]) != 3:
            raise ValueError("a spin timeline starts with 'start end records'")
        start, end, n = (int(x) for x in rows[0])
        if end < start:
            raise ValueError(f"spin timeline ends ({end}) before it starts ({start})")
        gaps = tuple((int(a), int(b)) for a, b in rows[1:])
        if len(gaps) != n:
            raise ValueError(f"spin timeline says {n} interruptions, has {len(gaps)}")
        return cls(start, end, gaps)


@dataclass(frozen=True)
class SwitchCost:
    switches: int
    """Hand-overs between the two processes seen."""
    median_us: float
    p10_us: float
    p90_us: float
    slice_median_ms: float
    """Median running interval: the time slice a context gets."""
    overlap_ms: float
    """Time both ran at once (no time-slicing when this is large)."""


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics (numpy's default); NaN
    when empty. The kit's one percentile: parts, the workload process and this module."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def switch_cost(timelines: Mapping[str, SpinTimeline]) -> SwitchCost:
    """The hand-overs between the processes of ``timelines`` (at least two) and their cost."""
    if len(timelines) < 2:
        raise ValueError("the switch cost needs the timelines of two processes")
    ivs = sorted((a, b, who) for who, tl in timelines.items() for a, b in tl.running())
    costs: list[float] = []
    overlap = 0
    for (_a0, b0, w0), (a1, b1, w1) in zip(ivs, ivs[1:], strict=False):
        if w0 == w1:
            continue
        if a1 >= b0:
            costs.append((a1 - b0) / 1e3)
        else:
            overlap += min(b0, b1) - a1
    slices = [(b - a) / 1e6 for a, b, _ in ivs]
    return SwitchCost(
        switches=len(costs),
        median_us=percentile(costs, 50),
        p10_us=percentile(costs, 10),
        p90_us=percentile(costs, 90),
        slice_median_ms=percentile(slices, 50),
        overlap_ms=overlap / 1e6,
    )


ORION_COLUMNS = ("Name", "Profile", "Memory_footprint", "SM_usage", "Duration")
"""The columns of ``data/orion_v100_kernels`` (Duration in ns)."""

KERNEL_COLUMNS = ("model", "batch", *ORION_COLUMNS, "Gap", "Grid", "Block", "Count")
"""The kernel table: ``data/orion_v100_kernels``'s columns (Duration in ns; Profile,
Memory_footprint are not measured by the interposer and stay empty; SM_usage is the grid's
block count) plus the mean idle gap after the kernel (``Gap``, ns), its launch shape and how
many launches were measured, per kernel ID in first-launch order."""


def kernel_rows(model: str, batch: int, stats: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of the kernel table for one profile's ``KernelStats`` (``policy.priority``)."""
    rows = []
    for s in stats:
        k = s.kernel
        grid, block = k.grid or (1, 1, 1), k.block or (1, 1, 1)
        rows.append(
            {
                "model": model,
                "batch": batch,
                "Name": k.name,
                "Profile": "",
                "Memory_footprint": "",
                "SM_usage": grid[0] * grid[1] * grid[2],
                "Duration": round(s.mean_ms * 1e6),
                "Gap": round(s.gap_mean_ms * 1e6),
                "Grid": "x".join(map(str, grid)),
                "Block": "x".join(map(str, block)),
                "Count": s.count,
            }
        )
    return rows


TRACE_COLUMNS = ("model", "batch", *ORION_COLUMNS, "Gap")
"""The launch-order trace of one pass: Orion's columns (Duration in ns; Profile,
Memory_footprint and SM_usage are not measured by CUPTI's timestamps and stay empty) plus
``Gap``: the idle time (ns) from the kernel's end to the next kernel's start, empty after the
last — the host time between launches that the V100 data lack."""


def trace_rows(
    model: str, batch: int, spans: Sequence[tuple[float, float, str]]
) -> list[dict[str, Any]]:
    """Rows of the trace for one pass's kernels ``(start_ns, end_ns, name)`` in launch order;
    a negative gap (the next kernel started before this one ended: streams overlapped) is 0."""
    rows = []
    for i, (a, b, name) in enumerate(spans):
        gap = "" if i + 1 == len(spans) else round(max(0.0, spans[i + 1][0] - b))
        rows.append(
            {
                "model": model,
                "batch": batch,
                "Name": name,
                "Profile": "",
                "Memory_footprint": "",
                "SM_usage": "",
                "Duration": round(max(0.0, b - a)),
                "Gap": gap,
            }
        )
    return rows


__all__ = [
    "KERNEL_COLUMNS",
    "TRACE_COLUMNS",
    "SpinTimeline",
    "SwitchCost",
    "kernel_rows",
    "percentile",
    "switch_cost",
    "trace_rows",
]
