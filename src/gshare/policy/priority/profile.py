"""The FIKIT measurement statistics of one task: per kernel ID, SK and SG over T runs.

Who calls it: the mechanism that measures a task in its measurement phase (the simulator's
kernel device, the live instance's preemption point) calls ``KernelProfile.add_run`` once per
measured run with the run's kernel spans in launch order; ``policy.priority.scheduler`` reads
``sk_ms`` / ``sg_ms`` in the sharing phase and ``runs`` to decide the phase. The live runtime
keeps a profile with its function in the state database (``to_records`` / ``from_records``).

NOTE — measurement statistics (FIKIT §3.2, "Data acquisition and statistical output during
the measurement phase"). Over T runs of a task, for every unique kernel ID j (the set S_UID):
SK_j = the mean duration of the kernels with ID j, and SG_j = the mean idle time after them,
from a kernel's end to the next kernel's start, counted only where a next kernel exists (a run
of N kernels has N - 1 gaps). Means are kept as running sums, so the profile grows one run at
a time; what must hold: SK_j and SG_j equal the paper's formulas over the runs added so far
(tested against a direct computation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gshare.policy.priority.kernel_id import KernelId


class ProfileError(ValueError):
    """A run or record that cannot be a measurement (negative or unordered times)."""


@dataclass(frozen=True, slots=True)
class KernelSpan:
    """One measured kernel of a run: when it started and ended on the device (ms)."""

    kernel: KernelId
    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True)
class KernelStats:
    """What the profile knows of one kernel ID (read-only copy)."""

    kernel: KernelId
    count: int
    """Measured launches of this ID over all runs."""
    mean_ms: float
    """SK: mean duration."""
    gap_count: int
    """Launches of this ID that were followed by another kernel of the same run."""
    gap_mean_ms: float
    """SG: mean idle time after it (0 when ``gap_count`` is 0)."""


@dataclass(slots=True)
class _Acc:
    count: int = 0
    total_ms: float = 0.0
    gap_count: int = 0
    gap_total_ms: float = 0.0


@dataclass(slots=True)
class KernelProfile:
    """Incremental SK / SG statistics of one task key (a function), one run at a time."""

    task_key: str
    runs: int = 0
    """Runs measured so far (T)."""
    _acc: dict[KernelId, _Acc] = field(default_factory=dict, repr=False)

    def add_run(self, spans: Sequence[KernelSpan]) -> None:
        """Add one measured run: its kernels in launch order with device start and end times.

        The gap after kernel i is ``spans[i+1].start_ms - spans[i].end_ms`` (0 if the next one
        started before this one ended, as with overlapping streams)."""
        for s in spans:
            if not (s.end_ms >= s.start_ms >= 0.0):
                raise ProfileError(f"{self.task_key}: bad kernel span {s}")
        for i, s in enumerate(spans):
            acc = self._acc.get(s.kernel)
            if acc is None:
                acc = self._acc[s.kernel] = _Acc()
            acc.count += 1
            acc.total_ms += s.end_ms - s.start_ms
            if i + 1 < len(spans):
                acc.gap_count += 1
                acc.gap_total_ms += max(0.0, spans[i + 1].start_ms - s.end_ms)
        self.runs += 1

    def sk_ms(self, kernel: KernelId) -> float | None:
        """SK of ``kernel``, None if it was never measured."""
        acc = self._acc.get(kernel)
        return acc.total_ms / acc.count if acc is not None and acc.count else None

    def sg_ms(self, kernel: KernelId) -> float | None:
        """SG of ``kernel``, None if it was never measured with a kernel after it."""
        acc = self._acc.get(kernel)
        return acc.gap_total_ms / acc.gap_count if acc is not None and acc.gap_count else None

    def stats(self, kernel: KernelId) -> KernelStats | None:
        acc = self._acc.get(kernel)
        if acc is None:
            return None
        return KernelStats(
            kernel,
            acc.count,
            acc.total_ms / acc.count,
            acc.gap_count,
            acc.gap_total_ms / acc.gap_count if acc.gap_count else 0.0,
        )

    def kernels(self) -> list[KernelStats]:
        """S_UID with its statistics, in first-measured order."""
        out = [self.stats(k) for k in self._acc]
        return [s for s in out if s is not None]

    def __len__(self) -> int:
        return len(self._acc)

    # -- persistence (plain data; the caller does the I/O) ------------------------------------

    def to_records(self) -> dict[str, Any]:
        """JSON-able sums and counts (so a restored profile keeps growing exactly)."""
        return {
            "task_key": self.task_key,
            "runs": self.runs,
            "kernels": [
                {
                    "kernel": k.to_record(),
                    "count": a.count,
                    "total_ms": a.total_ms,
                    "gap_count": a.gap_count,
                    "gap_total_ms": a.gap_total_ms,
                }
                for k, a in self._acc.items()
            ],
        }

    @classmethod
    def from_records(cls, data: Mapping[str, Any]) -> KernelProfile:
        """The inverse of ``to_records``."""
        try:
            p = cls(str(data["task_key"]), int(data["runs"]))
            for r in data["kernels"]:
                acc = _Acc(
                    int(r["count"]),
                    float(r["total_ms"]),
                    int(r["gap_count"]),
                    float(r["gap_total_ms"]),
                )
                if acc.count < 0 or acc.gap_count < 0 or acc.gap_count > acc.count:
                    raise ProfileError(f"bad counts in {r!r}")
                p._acc[KernelId.from_record(r["kernel"])] = acc
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"bad profile record: {e}") from None
        return p


def profile_from_runs(task_key: str, runs: Iterable[Sequence[KernelSpan]]) -> KernelProfile:
    """A profile of the given runs (a convenience for tests and offline measurement)."""
    p = KernelProfile(task_key)
    for run in runs:
        p.add_run(run)
    return p
