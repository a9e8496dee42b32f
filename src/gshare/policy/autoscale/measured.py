"""A config's throughput from the busy time its instances measure.

Who calls it: the live gateway (``runtime.gateway.router``) folds every answered request's
batch busy time into its route's estimate with ``next_busy_ms_per_request``; the live controller
(``runtime.control.configs.config_at``) turns the estimate into the config the autoscaler sees,
every period, for a function that was not profiled; the simulator (``sim.cluster``, a
``SimFunction`` with ``throughput_from_busy``) does both with its simulated batches, so the
simulated autoscaler sees the estimate the live one sees, noise included.

What must hold: the estimate is an exponentially weighted mean over answered requests (each
its batch's busy time per request, weight ``BUSY_EWMA_WEIGHT``); the throughput is
``quota × 1000 / busy ms`` (the instance is guaranteed ``quota`` of every window, and spends
``busy ms`` of it per request), and the batch latency ``batch × 1000 / throughput``.

NOTE — why the simulator follows the estimate, not the mean. On the LLM-trace segment of
``bench/fidelity.py`` the per-request busy time of a CPU instance is 0.17 / 0.40 / 0.75 ms at
its 10th / 50th / 90th percentile, and the estimate over ~10 requests moves the throughput
between 150 and 430 requests/s (5th-95th percentile) around the 226 of its mean. A burst whose
demand falls between the two is served by one instance in a simulator that uses the mean, and by
two for the next minute live, whenever the estimate dips at a control period.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from gshare.policy.autoscale.core import Instance, ScaleConfig

BUSY_EWMA_WEIGHT: Final[float] = 0.1
"""Weight of the newest answer in the busy-time estimate (about the last ten count)."""
MIN_BUSY_MS: Final[float] = 1e-3
"""Floor of the busy time per request a throughput is computed from (no division by 0)."""


def next_busy_ms_per_request(
    previous_ms: float | None, batch_busy_ms: float, batch_size: int
) -> float:
    """The estimate after one answered request of a batch of ``batch_size`` requests that kept
    its instance busy ``batch_busy_ms``; ``previous_ms`` None: the first answer. Raises
    ``ValueError`` for an empty batch or a negative busy time."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    if batch_busy_ms < 0:
        raise ValueError(f"batch_busy_ms must be >= 0 (got {batch_busy_ms})")
    per = batch_busy_ms / batch_size
    if previous_ms is None:
        return per
    return (1.0 - BUSY_EWMA_WEIGHT) * previous_ms + BUSY_EWMA_WEIGHT * per


def config_from_busy(
    sm_pct: float, quota_pct: float, batch: int, busy_ms_per_request: float
) -> ScaleConfig:
    """The config at (``sm_pct``, ``quota_pct``, ``batch``) whose instances spend
    ``busy_ms_per_request`` per request (module doc)."""
    throughput = (quota_pct / 100.0) * 1000.0 / max(busy_ms_per_request, MIN_BUSY_MS)
    return ScaleConfig(sm_pct, quota_pct, batch, throughput, batch * 1000.0 / throughput)


def at_current_configs(
    running: Sequence[Instance], configs: Sequence[ScaleConfig]
) -> list[Instance]:
    """``running`` with each instance's config replaced by the candidate of the same (SM %,
    quota %, batch), whose throughput is the current estimate; an instance whose config is no
    longer a candidate keeps its own. Both controllers call it before the autoscaler, so that
    the fleet's capacity and the candidates are estimated alike."""
    by_key = {(c.sm_pct, c.quota_pct, c.batch): c for c in configs}
    return [
        replace(
            i, config=by_key.get((i.config.sm_pct, i.config.quota_pct, i.config.batch), i.config)
        )
        for i in running
    ]


__all__ = [
    "BUSY_EWMA_WEIGHT",
    "MIN_BUSY_MS",
    "at_current_configs",
    "config_from_busy",
    "next_busy_ms_per_request",
]
