"""Scoring a simulated figure against live runs of the same scenario (``bench/fidelity.py``).

Who calls it: ``bench/fidelity.py`` (one call of ``score`` per scenario and metric) and the
``--seeds`` summaries (``interval``: ``gshare simulate --seeds`` and ``gshare experiment run
--seeds`` through ``experiments.results.aggregate_summaries``). Pure arithmetic: no I/O.

A figure is within when its error is within its **bound** (``BOUNDS``: p50 within 15 %, p99
within 30 %, SLO hit rate and violations within 5 percentage points, mean instances within
10 %, achieved shares within 2 pp), or — only where the live run-to-run spread (the two live
runs' difference, in the bound's unit) is larger than the bound, so that the machine cannot
tell the simulator's error from its own noise at that resolution — when the live figure (the
runs' mean) lies inside the simulator's 90 % interval over seeds (the **interval** basis). What
must hold: every score says which basis it was judged on.

The platform's serial stage (``sim.gateway``): ``fit_serial_ms`` fits its service time from a
probe of simultaneous bursts, and ``fifo_waits_ms`` gives the waits it adds to given arrivals
(the harness takes them out of the platform samples it measured under load, which the simulator
adds back where its own bursts are). ``busy_factors_by_gap`` fits how a CPU instance's busy time
per request depends on the gap since the previous request's arrival (its NOTE).
``outstanding_share`` is the part of the platform latency inside the live gateway's outstanding
window (``sim.gateway``), from the gateway's and the client's mean latencies.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gshare.sim.instance import gap_class
from gshare.stats import percentile

Kind = Literal["rel", "pp"]


@dataclass(frozen=True, slots=True)
class Bound:
    """A metric's tolerance: ``rel`` — relative error (0.15 = 15 %); ``pp`` — absolute, in
    the figure's unit (percentage points for figures in %)."""

    kind: Kind
    tol: float


BOUNDS: Final[Mapping[str, Bound]] = {
    "p50_ms": Bound("rel", 0.15),
    "p99_ms": Bound("rel", 0.30),
    "slo_hit_rate_pct": Bound("pp", 5.0),
    "slo_violation_pct": Bound("pp", 5.0),
    "mean_instances": Bound("rel", 0.10),
    "share_pct": Bound("pp", 2.0),
}
"""Each metric the harness scores, by name (a figure named ``share_pct:share-a`` uses the part
before the colon)."""


def interval(values: Sequence[float]) -> dict[str, float]:
    """``median`` and the 90 % interval (``p05``, ``p95``: the 5th and 95th percentiles) of
    one figure over seeds. With few seeds the interval is the sample's range, nearly: 3 seeds
    give p05/p95 just inside min/max."""
    return {
        "median": percentile(values, 50),
        "p05": percentile(values, 5),
        "p95": percentile(values, 95),
    }


def _error(kind: Kind, sim: float, live: float) -> float:
    if kind == "pp":
        return sim - live
    return (sim - live) / live if live else math.inf if sim else 0.0


def score(
    metric: str,
    sim_by_seed: Sequence[float | None],
    live_runs: Sequence[float | None],
    *,
    sim_point: float | None = None,
) -> dict[str, Any]:
    """Score one figure (module doc). ``sim_by_seed``: the simulated figure per seed, the
    scenario's own seed first (the live runs' seed: ``sim``); ``live_runs``: the live figure
    of each run (at least one; two give the spread). ``sim_point``: the simulated figure to
    score instead of the first seed's, where the simulator's inputs were measured once per live
    run (``bench/fidelity.py``'s workflows: the mean of each calibration's figure at the
    scenario's seed, while ``sim_by_seed`` pools every calibration's seeds for the interval).

    Returns ``sim``, ``sim_median``, ``sim_p05``, ``sim_p95``, ``live`` (mean of the runs),
    ``live_runs``, ``live_spread`` (max − min, in the bound's unit: relative to ``live`` for a
    relative bound), ``error`` (same unit), ``bound``, ``basis`` (``"bound"``: judged on the
    bound; ``"interval"``: outside the bound, judged on the interval) and ``within``.
    None and non-finite inputs are dropped; a figure with no live or no
    simulated value is scored ``within`` None."""
    b = BOUNDS[metric.split(":", 1)[0]]
    sims = [float(x) for x in sim_by_seed if x is not None and math.isfinite(x)]
    lives = [float(x) for x in live_runs if x is not None and math.isfinite(x)]
    out: dict[str, Any] = {"metric": metric, "bound": b.tol, "bound_kind": b.kind}
    if not sims or not lives:
        return {**out, "sim": sims[0] if sims else None, "live": None, "within": None}
    live = statistics.fmean(lives)
    spread = max(lives) - min(lives)
    if b.kind == "rel":
        spread = spread / live if live else 0.0
    iv = interval(sims)
    point = sims[0] if sim_point is None or not math.isfinite(sim_point) else float(sim_point)
    err = _error(b.kind, point, live)
    if abs(err) <= b.tol:
        basis, within = "bound", True
    elif spread > b.tol:
        basis, within = "interval", iv["p05"] <= live <= iv["p95"]
    else:
        basis, within = "bound", False
    return {
        **out,
        "sim": point,
        "sim_median": iv["median"],
        "sim_p05": iv["p05"],
        "sim_p95": iv["p95"],
        "live": live,
        "live_runs": lives,
        "live_spread": spread,
        "error": err,
        "basis": basis,
        "within": bool(within),
    }


def within_all(scores: Sequence[Mapping[str, Any]]) -> bool:
    """True when every scored figure is within (figures without data count as not within)."""
    return bool(scores) and all(s.get("within") is True for s in scores)


def fifo_waits_ms(arrivals_ms: Sequence[float], service_ms: float) -> list[float]:
    """Each arrival's wait in one FIFO stage busy ``service_ms`` per request (Lindley's
    recursion; ``arrivals_ms`` in order): what ``sim.gateway``'s serial stage adds to it."""
    waits: list[float] = []
    free = -math.inf
    for t in arrivals_ms:
        start = max(float(t), free)
        waits.append(start - float(t))
        free = start + service_ms
    return waits


def fit_serial_ms(bursts: Sequence[tuple[int, float]]) -> float:
    """The serial stage's service time (ms) from a burst probe: ``bursts`` holds, per burst of
    ``k`` simultaneous requests, ``(k, mean platform latency of its requests in ms)``. In a FIFO
    stage a k-burst's requests wait 0, s, …, (k − 1) s, so the mean is ``a + s (k − 1) / 2``;
    ``s`` is the least-squares slope (≥ 0). Needs bursts of at least two sizes."""
    xs = [(k - 1) / 2.0 for k, _ in bursts]
    ys = [float(m) for _, m in bursts]
    if len(set(xs)) < 2:
        raise ValueError("fit_serial_ms needs bursts of at least two sizes")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return max(0.0, sxy / sxx)


GAP_BOUNDS_MS: Final[tuple[float, ...]] = (1.0, 3.0, 10.0, 30.0, 100.0, math.inf)
"""Upper bounds of the gap classes ``busy_factors_by_gap`` fits a factor to."""
MIN_CLASS_REQUESTS: Final[int] = 20
"""The fewest requests a gap class's own factor is fitted on; a class with fewer is pooled with
the class below it (``busy_factors_by_gap``'s NOTE)."""


def _pooled_classes(counts: Sequence[int], min_requests: int) -> list[list[int]]:
    """Adjacent classes grouped so that each group holds at least ``min_requests`` requests
    (where there are that many in all): from the top, a group with fewer joins the group below
    it; the lowest group, if it still has fewer, joins the one above it."""
    groups = [[i] for i in range(len(counts))]
    size = list(counts)
    i = len(groups) - 1
    while i > 0:
        if size[i] < min_requests:
            groups[i - 1] += groups.pop(i)
            size[i - 1] += size.pop(i)
        i -= 1
    if len(groups) > 1 and size[0] < min_requests:
        groups[0] = groups.pop(0) + groups[0]
    return groups


def busy_factors_by_gap(
    arrivals_ms: Sequence[float],
    busy_ms: Sequence[float],
    bounds_ms: Sequence[float] = GAP_BOUNDS_MS,
    min_requests: int = MIN_CLASS_REQUESTS,
) -> tuple[tuple[float, float], ...]:
    """(bound ms, factor) rows for ``sim.instance.InstanceConfig.busy_gap_factors``: each
    request's busy time, classed by the gap since the previous request's arrival (the first
    one: the last class), averaged per class over the mean of all. A class with fewer than
    ``min_requests`` requests (none, with ``min_requests`` 1) is pooled with the class below it
    (the lowest with the one above it), and the pooled classes share their requests' mean.
    ``arrivals_ms`` and ``busy_ms``: one per answered request, in any order.

    NOTE — a CPU instance computes faster right after its last request. Under the LLM segment's
    load (one run, 1,025 requests) a request's compute time was 0.27 ms on average when the
    previous one had arrived under 1 ms before, 0.35 ms after 3-10 ms and 0.59-0.75 ms after
    10-300 ms; the warm-up's requests, 250 ms apart, took 0.75-1.4 ms. So spreading a load over
    more instances makes each slower, and the live controller's throughput estimate (the
    gateway's, ``policy.autoscale.measured``) falls with it: a second instance started for a
    burst then covers the demand alone on the next periods. Fitted on the function's own
    arrivals in the calibration window (most of it on one instance), used per instance. The
    calibration window has 8 requests 100 ms or more after the previous one; their mean
    (2.4-3.2 ms on 2026-11-28's slower machine, four calibrations) was the factor of every
    request of an instance idle that long, where the segment's 101 such requests took 1.9-2.5 ms
    and requests 30-100 ms after the previous one took 1.5-1.6 ms with three or four instances
    up as with one. In the segment's quiet minutes, which four instances share, the simulated
    controller then estimated 2.3-2.8 ms a request where live had 1.3-1.7, and held four
    instances where live held three: mean instances +11 % (run X). Pooled at 20 requests, the
    replays of five recorded runs are at -9 to +5 % (from -9 to +11 %)."""
    if len(arrivals_ms) != len(busy_ms):
        raise ValueError(f"{len(arrivals_ms)} arrivals but {len(busy_ms)} busy times")
    if not busy_ms:
        return ()
    if list(bounds_ms) != sorted(bounds_ms) or not bounds_ms:
        raise ValueError(f"bounds_ms must be ascending and not empty (got {list(bounds_ms)})")
    if min_requests < 1:
        raise ValueError(f"min_requests must be >= 1 (got {min_requests})")
    pairs = sorted(zip(arrivals_ms, busy_ms, strict=True))
    classes: list[list[float]] = [[] for _ in bounds_ms]
    previous: float | None = None
    for at, b in pairs:
        gap = math.inf if previous is None else at - previous
        previous = at
        classes[gap_class(bounds_ms, gap)].append(b)
    mean = statistics.fmean(busy_ms)
    if mean <= 0:
        return ()
    factors = [0.0] * len(bounds_ms)
    for group in _pooled_classes([len(c) for c in classes], min_requests):
        f = statistics.fmean([b for i in group for b in classes[i]]) / mean
        for i in group:
            factors[i] = f
    return tuple((float(bound), f) for bound, f in zip(bounds_ms, factors, strict=True))


def outstanding_share(client_ms: float, gateway_ms: float, platform_ms: float) -> float:
    """The part of a request's platform latency during which the live gateway counts it
    outstanding (``ClusterConfig.platform_outstanding_share``), from means over the same answered
    requests: the client's latency, the gateway's (``gshare_request_latency_seconds``: from its
    admission until the answer is back from the instance) and the platform share (the client's
    latency beyond the instance's timing headers). The rest of the platform share is the HTTP
    exchange outside the gateway's window: ``client - gateway``. Clipped to [0, 1] (the two
    clocks' means come from separate samples); 0 without a platform share."""
    for name, v in (
        ("client_ms", client_ms),
        ("gateway_ms", gateway_ms),
        ("platform_ms", platform_ms),
    ):
        if not (v >= 0.0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    if platform_ms <= 0.0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - (client_ms - gateway_ms) / platform_ms))


def idle_arrival_queue_ms(rows: Sequence[Mapping[str, Any]], function: str) -> list[float]:
    """The instance's queue time (``queue_ms``) of ``function``'s answered requests in a live
    run's ``rows`` (``gshare load``'s) that reached an idle instance: each sent (``arrival_ms``
    + ``late_ms``) after the client had the answers to all the function's requests sent
    before it, so nothing of the function was queued or running anywhere. What such a request
    waits at its instance is the hand-over from the instance's IO thread to its batching
    thread, which the simulator draws as ``ClusterConfig.instance_wakeup_ms``. Rows without
    ``queue_ms`` (a server without timing headers) give nothing."""
    ok = sorted(
        (
            float(r["arrival_ms"]) + float(r.get("late_ms") or 0.0),
            float(r["latency_ms"]),
            r.get("queue_ms"),
        )
        for r in rows
        if r.get("name") == function and r.get("status") == "ok" and r.get("latency_ms") is not None
    )
    out: list[float] = []
    answered_ms = -math.inf
    for sent_ms, latency_ms, queue_ms in ok:
        if sent_ms > answered_ms and queue_ms is not None and math.isfinite(float(queue_ms)):
            out.append(max(0.0, float(queue_ms)))
        answered_ms = max(answered_ms, sent_ms + latency_ms)
    return out


def token_release_ms(held_ms: float, used_ms: float, tokens: int, grant_ms: float) -> float:
    """The simulator's release delay (``ClusterConfig.token_release_ms``) from a live run's
    token counts (the control API's ``token_held_ms``, ``token_used_ms`` and ``tokens``, their
    growth over the run, summed over instances): the time a token was held beyond its busy
    time, per token, less the grant's round trip the simulator already holds it for
    (``grant_ms``); 0 without tokens."""
    for name, v in (("held_ms", held_ms), ("used_ms", used_ms), ("grant_ms", grant_ms)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v}")
    if tokens <= 0:
        return 0.0
    return max(0.0, (held_ms - used_ms) / tokens - grant_ms)


__all__ = [
    "BOUNDS",
    "GAP_BOUNDS_MS",
    "MIN_CLASS_REQUESTS",
    "Bound",
    "busy_factors_by_gap",
    "idle_arrival_queue_ms",
    "fifo_waits_ms",
    "fit_serial_ms",
    "interval",
    "outstanding_share",
    "score",
    "token_release_ms",
    "within_all",
]
