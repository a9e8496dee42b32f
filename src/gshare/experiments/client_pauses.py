"""The load generator's own garbage-collection pauses, recorded and kept out of its latencies.

A Python load generator stops every coroutine while its collector runs: each answer that
arrives during a full collection is timed late by the whole pause, and a burst in flight comes
back as a block of equal, inflated latencies that the server never produced. Who calls:
``scenario_load.run_load`` (``gshare load``) and the benches' replays (``bench/_autoscale``)
around the event loop that sends and times the requests.

``quiet_collector`` collects once and freezes what exists (``gc.freeze``: the objects the
generator built before it starts sending — modules, the scenario, earlier results — are never
scanned again), so a collection during the run scans only what the run itself allocates. The
collector stays on (a long run's reference cycles are still reclaimed). Every collection of at
least ``min_ms`` is recorded with its generation and start, so a report can show what pauses
were left.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MIN_PAUSE_MS = 0.5
"""Collections shorter than this are not recorded (a young collection takes microseconds)."""


@dataclass
class CollectorPauses:
    """Collections during a run: ``(start on time.perf_counter in s, generation, ms)`` each."""

    pauses: list[tuple[float, int, float]] = field(default_factory=list)
    frozen_objects: int = 0

    def since(self, t0_s: float) -> list[tuple[float, int, float]]:
        """The pauses as ``(ms after t0_s, generation, ms)`` (``t0_s`` on ``time.perf_counter``)."""
        return [(round((s - t0_s) * 1000.0, 3), g, round(ms, 3)) for s, g, ms in self.pauses]

    def summary(self) -> dict[str, Any]:
        """Count, total and longest pause (ms), and the objects frozen before the run."""
        ms = [p[2] for p in self.pauses]
        return {
            "pauses": len(ms),
            "total_ms": round(sum(ms), 3),
            "max_ms": round(max(ms), 3) if ms else 0.0,
            "frozen_objects": self.frozen_objects,
        }


@contextlib.contextmanager
def quiet_collector(
    *, freeze: bool = True, min_ms: float = MIN_PAUSE_MS
) -> Iterator[CollectorPauses]:
    """Record this process's collections of ``min_ms`` or more while the block runs; with
    ``freeze`` (the default), collect and freeze first and unfreeze after (module doc). Must
    hold: the callback is removed and the heap unfrozen whatever the block raises."""
    out = CollectorPauses()
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            t = started.pop()
            ms = (time.perf_counter() - t) * 1000.0
            if ms >= min_ms:
                out.pauses.append((t, int(info.get("generation", -1)), ms))

    if freeze:
        gc.collect()
        gc.freeze()
        out.frozen_objects = gc.get_freeze_count()
    gc.callbacks.append(on_gc)
    try:
        yield out
    finally:
        gc.callbacks.remove(on_gc)
        if freeze:
            gc.unfreeze()


__all__ = ["MIN_PAUSE_MS", "CollectorPauses", "quiet_collector"]
