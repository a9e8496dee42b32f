"""Admission control: accept a request, or shed it at once (429) because it would miss its SLO.

Who calls it: the live gateway (``runtime.gateway.router.Gateway.submit``) for every request of
a function, with the function's ``ServiceEstimate`` (kept by the gateway, fed the departures
it sees) and its backlog. Pure: the caller passes the clock.

Why: a deep queue (10,000 requests per function before) turns overload into latency for
everyone — every admitted request then waits seconds and misses its SLO, so the function's
goodput (answers within the SLO per second) falls towards zero while it is busiest. Shedding
the requests that cannot make it keeps the admitted ones fast.

What must hold: a function without ``slo_ms`` is never shed here (only by the queue cap); a
request is never shed while the function has fewer than two outstanding (none: no prediction is
needed to serve it at once; one: see ``admit``); without a measured service interval nothing is
shed (a cold function's first burst is queued, not refused on a guess).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_MAX_LATENCY_SLO_FACTOR = 0.75
"""Shed when the predicted latency exceeds this many SLOs (``gshare serve --max-wait-slo``).
Below 1 because the prediction counts service intervals only: the round trip through the
gateway and the instance's batching come on top (bench/overload.py: at 1.0 the admitted
requests' p99 was 2.2 x the SLO and goodput 62 % of capacity; at 0.75, 1.06 x and 103 %)."""
EWMA_ALPHA = 0.05
"""Weight of the newest inter-departure interval in the service estimate, once it has
1 / EWMA_ALPHA samples; before that every sample weighs the same (their mean), so the first one
(a cold instance's, a pause's) does not stand for the function's rate."""
MAX_GAP_S = 1.0
"""Departures further apart than this do not measure the service interval (idle in between)."""


class Admit(enum.Enum):
    ACCEPT = "accept"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    verdict: Admit
    predicted_ms: float | None
    """The predicted latency of the request (None without an estimate)."""


@dataclass(slots=True)
class ServiceEstimate:
    """The function's measured service interval while it is backlogged: the mean time between
    two departures (answers) when requests were still outstanding after the first one — so
    1 / the rate its ready instances serve at when saturated (batching included: a batch of
    8 answered together counts 8 departures over its duration).

    ``observe`` is called per answer with the answer's time and whether other requests were
    still outstanding; a departure after an idle period starts a new run of measurements. A gap
    counts when both of its answers left others outstanding, so with a shallow backlog it
    leans towards the intervals in which another request arrived, the longer ones: it predicts
    the wait behind a request in service rather than the mean interval, and
    ``DEFAULT_MAX_LATENCY_SLO_FACTOR`` was tuned with it (docs/journal/fidelity.md: counting
    every gap after a backlogged answer gave the mean interval, and 0.85-0.90 of capacity as
    goodput in ``bench/overload.py`` against 0.96-1.03)."""

    interval_s: float | None = None
    last_s: float | None = None
    samples: int = 0
    """Intervals measured so far (the first 1 / ``EWMA_ALPHA`` are averaged equally)."""

    def observe(self, now_s: float, backlogged: bool) -> float | None:
        """One answer at ``now_s``, with others still outstanding or not; returns the gap it
        counted (s; None when it counted none), which the live gateway exports as
        ``gshare_admission_gap_seconds``."""
        if not backlogged:
            self.last_s = None
            return None
        counted = None
        if self.last_s is not None:
            gap = now_s - self.last_s
            if 0.0 <= gap <= MAX_GAP_S:
                self.samples += 1
                alpha = max(EWMA_ALPHA, 1.0 / self.samples)
                old = gap if self.interval_s is None else self.interval_s
                self.interval_s = (1.0 - alpha) * old + alpha * gap
                counted = gap
        self.last_s = now_s
        return counted


# NOTE: SLO-aware admission (gshare's; Little's law on the measured service rate): a request
# joining `outstanding` others departs after about (outstanding + 1) service intervals. The
# second outstanding request is always admitted: the interval is measured only between answers
# given while others wait, so shedding at one outstanding would keep the estimate where it is for
# good, however fast the function became (one slow interval, or the estimate of one instance
# after a scale-out, held the function to one request at a time: docs/journal/fidelity.md).
def admit(
    outstanding: int,
    estimate: ServiceEstimate,
    slo_ms: float | None,
    max_latency_slo_factor: float = DEFAULT_MAX_LATENCY_SLO_FACTOR,
) -> AdmissionDecision:
    """Accept or shed one request of a function with ``outstanding`` requests accepted and not
    answered (queued at the gateway or in flight at its instances)."""
    if estimate.interval_s is None:
        return AdmissionDecision(Admit.ACCEPT, None)
    predicted_ms = (outstanding + 1) * estimate.interval_s * 1000.0
    if (
        slo_ms is None
        or slo_ms <= 0
        or max_latency_slo_factor <= 0
        or outstanding <= 1
        or predicted_ms <= max_latency_slo_factor * slo_ms
    ):
        return AdmissionDecision(Admit.ACCEPT, predicted_ms)
    return AdmissionDecision(Admit.SHED, predicted_ms)


__all__ = [
    "DEFAULT_MAX_LATENCY_SLO_FACTOR",
    "Admit",
    "AdmissionDecision",
    "ServiceEstimate",
    "admit",
]
