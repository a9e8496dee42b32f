"""The simulated gateway: routes each request of a function to one of its instances.

Routing is ``policy.routing.choose_instance`` (the live gateway's rule): join the shortest
queue among ready instances, ties by instance id for determinism (the instances are kept sorted
by id), or with ``rotate_ties`` round-robin as the live gateway spreads them; while a function
has only instances that are still starting, the request waits in the
queue of the least loaded of them (it is served after the cold start); while it has none at
all, the request waits at the gateway (``on_cold`` tells the controller at once) and is handed
to the first instance that is added. Nothing accepted is dropped: ``pending`` counts what is
still waiting.

Admission (``admission_slo_factor``, off by default; ``gshare simulate`` and the fidelity
harness turn it on with the live default): ``policy.admission.admit``, the live gateway's rule,
sheds a request of a function with an SLO whose predicted latency (its outstanding requests ×
the measured service interval, ``ServiceEstimate`` fed every answer) is over the factor × SLO.
A shed request is answered at once (the live 429) and logged as a miss (``SimRequest.shed``);
it does not count as outstanding.

Platform latency (``platform_ms``, samples in ms; empty by default): each answer (a shed one
too) reaches its client one sample later, drawn per request — the client's HTTP exchange and the
gateway → instance hop, which the profiles (the instance's busy time) do not hold. It adds to
the request's latency only: the instance is free at the burst's end as live. Measured per run by
the caller (``bench/_autoscale.py``: the warm-up requests' client latency minus their busy time).

Outstanding past the instance (``platform_outstanding_share``, 0 by default): the live gateway
counts a request outstanding from its admission until the instance's answer is back at the
gateway, so part of the platform latency (the hops to the instance and back) is inside that
window and the rest (the HTTP exchange with the client) is not. With a share s, an answer
leaves ``outstanding`` and feeds the service estimate s x its platform sample after the
instance finished it; the admission reads both. Measured per run by the caller
(``bench/fidelity.py``: the gateway's latency histogram against the client's latency).

Platform serial work (``platform_serial_ms``, 0 by default): each request first passes one FIFO
stage that is busy this long per request — the client's and the gateway's event loops, which
handle one request at a time — and is routed when the stage reaches it: a request of a burst
waits for the ones ahead of it (``experiments.fidelity.fifo_waits_ms`` gives the same waits in
closed form). The stage's own service time is in the platform samples; only the wait is added.

NOTE — the platform's serial stage. Bursts of k simultaneous requests to one warm instance took
2.8, 3.4, 4.8, 7.0, 8.6 and 11.0 ms (k = 1, 2, 4, 6, 8, 12; median platform latency beyond the
instance's timing headers, quiet 2-core machine, 2026-11-27): about 1.3 ms more per request
ahead in the burst, while the instance's own queue stayed under 1.3 ms. Drawn i.i.d., platform
samples put those delays on random requests, not on the bursts' later ones, and the LLM
segment's simulated p99 was 38 % under live. Fitted per run by the caller
(``experiments.fidelity.fit_serial_ms`` on ``bench/_autoscale.py``'s burst probe).

The admission's starting estimate (``admission_interval_ms``, per function; none by default):
the live gateway keeps a function's service estimate for as long as it serves (an update of the
function keeps it too), so a run on a server that served before starts with the estimate the
earlier runs left, where a simulated run would start with none and admit everything until it
has measured. Given, the estimate starts at that interval, weighted as one formed over
1 / ``EWMA_ALPHA`` answers. Read per run by the caller (``bench/fidelity.py``: the server's
``gshare_admission_interval_seconds`` before each live run).

NOTE — the admission's starting estimate. From no estimate, the simulated priority pair settled
either near the live interval (7.9 ms, shedding 50 of 719 high-class requests) or near half of
it (3.5-4.6 ms, shedding 1-24), by seed: early gaps decide which, and each state holds itself
(shedding at two outstanding keeps the backlogs, and so the gaps, short). The live gateway,
which came into each run with the calibration run's estimate, shed 56-71 in the same hour. Started
at 6 or 9 ms, every seed shed 33-62 (docs/journal/fidelity.md).

NOTE — admission in the simulator: without it, a burst over capacity queued every request (the
live gateway refuses most of them), so each later request of the burst waited behind requests
the live server never ran. Found on ``bench/fidelity.py``'s LLM-trace segment, where the live
server answered 24.5 % of the requests 429 (one run, load 3.3).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gshare.policy.admission import EWMA_ALPHA, Admit, ServiceEstimate, admit
from gshare.policy.routing import Candidate, choose_instance
from gshare.sim.engine import EventLoop
from gshare.sim.instance import SimInstance
from gshare.sim.priorities import PRIO_ARRIVAL
from gshare.sim.request import RequestLog, SimRequest


class Gateway:
    def __init__(
        self,
        loop: EventLoop,
        log: RequestLog | None = None,
        admission_slo_factor: float | None = None,
        platform_ms: Sequence[float] = (),
        rng: np.random.Generator | None = None,
        platform_serial_ms: float = 0.0,
        rotate_ties: bool = False,
        platform_outstanding_share: float = 0.0,
        admission_interval_ms: Mapping[str, float] | None = None,
    ) -> None:
        self.loop = loop
        self.rotate_ties = rotate_ties
        """Spread routing ties round-robin (a start that moves by one per request, as the live
        gateway's ``_pick``); False: ties go to the first instance (module doc)."""
        self._rr: dict[str, int] = {}
        self.platform_ms = tuple(float(x) for x in platform_ms)
        """Per-request platform latency samples (module doc); empty: none."""
        if any(not x >= 0 for x in self.platform_ms):
            raise ValueError("platform_ms must hold numbers >= 0")
        if not platform_serial_ms >= 0:
            raise ValueError(f"platform_serial_ms must be >= 0, got {platform_serial_ms}")
        self.platform_serial_ms = float(platform_serial_ms)
        """The platform's serial work per request (module doc); 0: none."""
        if not 0.0 <= platform_outstanding_share <= 1.0:
            raise ValueError(
                f"platform_outstanding_share must be in [0, 1], got {platform_outstanding_share}"
            )
        self.platform_outstanding_share = float(platform_outstanding_share)
        """The part of each platform sample during which an answered request still counts as
        outstanding (module doc); 0: it leaves when its instance finishes it."""
        self._serial_free_ms = -math.inf
        self._rng = rng if rng is not None else np.random.default_rng(0)
        self.log = log or RequestLog()
        self.admission_slo_factor = admission_slo_factor
        """Shed over this many SLOs (``policy.admission``); None: admit everything."""
        self._service: dict[str, ServiceEstimate] = {}
        for fn, ms in (admission_interval_ms or {}).items():
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"admission_interval_ms of {fn!r} must be > 0, got {ms}")
            # an estimate the live gateway had formed over earlier runs: fully weighted
            self._service[fn] = ServiceEstimate(
                interval_s=ms / 1000.0, samples=round(1.0 / EWMA_ALPHA)
            )
        self.shed: dict[str, int] = {}
        """Requests shed per function."""
        self.admission_gaps_ms: dict[str, list[float]] = {}
        """Per function, the gaps its service estimate counted, in order (the live gateway's
        ``gshare_admission_gap_seconds``); ``admission_interval_ms`` gives the estimate."""
        self._instances: dict[str, list[SimInstance]] = {}
        self._pending: dict[str, deque[SimRequest]] = {}
        self._slo_ms: dict[str, float | None] = {}
        self._next_id = 0
        self.arrivals: dict[str, int] = {}
        """Requests submitted per function (the controller's rate measurements read it)."""
        self.last_activity_ms: dict[str, float] = {}
        """Later of the last arrival and the last answer per function (keep-alive's clock)."""
        self.outstanding: dict[str, int] = {}
        """Requests submitted and not completed, per function."""
        self.on_complete_hooks: list[Callable[[SimRequest], None]] = []
        self.on_cold: Callable[[str], None] | None = None
        """Called when a request arrives for a function with no instance (a cold start)."""

    def register(self, function: str, slo_ms: float | None = None) -> None:
        self._instances.setdefault(function, [])
        self._pending.setdefault(function, deque())
        self._slo_ms[function] = slo_ms
        self.arrivals.setdefault(function, 0)
        self.outstanding.setdefault(function, 0)

    def instances(self, function: str) -> list[SimInstance]:
        return list(self._instances.get(function, []))

    def add_instance(self, inst: SimInstance) -> None:
        fn = inst.config.function
        if fn not in self._instances:
            self.register(fn)
        bisect.insort(self._instances[fn], inst, key=lambda i: i.instance_id)
        pending = self._pending[fn]
        while pending:
            inst.enqueue(pending.popleft())

    def remove_instance(self, inst: SimInstance) -> None:
        """Stop routing to ``inst`` and drain it (its queued requests still complete)."""
        fn = inst.config.function
        if inst in self._instances.get(fn, []):
            self._instances[fn].remove(inst)
        inst.drain()

    def pending(self, function: str) -> int:
        return len(self._pending.get(function, ()))

    def completed(self, req: SimRequest) -> None:
        """Instances call this for each finished request."""
        finished_ms = req.finish_ms
        self._add_platform(req)
        self.log.record(req)
        self.last_activity_ms[req.function] = self.loop.now_ms
        back_ms = self.platform_outstanding_share * (req.finish_ms - finished_ms)
        if back_ms > 0.0:
            self.loop.at(self.loop.now_ms + back_ms, lambda: self._departed(req.function))
        else:
            self._departed(req.function)
        for hook in self.on_complete_hooks:
            hook(req)

    def _departed(self, fn: str) -> None:
        """An answer is back at the gateway: it leaves ``outstanding`` and, as the live
        gateway's, feeds the function's service estimate."""
        self.outstanding[fn] -= 1
        if self.admission_slo_factor is not None:
            gap_s = self._service.setdefault(fn, ServiceEstimate()).observe(
                self.loop.now_ms / 1000.0, self.outstanding[fn] > 0
            )
            if gap_s is not None:
                self.admission_gaps_ms.setdefault(fn, []).append(gap_s * 1000.0)

    def admission_interval_ms(self, fn: str) -> float | None:
        """``fn``'s service estimate now (ms; None before it has one), as the live gateway's
        ``gshare_admission_interval_seconds``."""
        e = self._service.get(fn)
        return None if e is None or e.interval_s is None else e.interval_s * 1000.0

    def submit(self, function: str) -> SimRequest:
        """A request arrives now; route it (after the platform's serial stage, if any)."""
        if function not in self._instances:
            raise KeyError(f"unknown function {function!r}")
        self._next_id += 1
        req = SimRequest(self._next_id, function, self.loop.now_ms, self._slo_ms.get(function))
        self.arrivals[function] += 1  # demand, shed or not: the autoscaler sizes for it
        self.last_activity_ms[function] = self.loop.now_ms
        if self.platform_serial_ms > 0.0:
            now = self.loop.now_ms
            start = max(now, self._serial_free_ms)
            self._serial_free_ms = start + self.platform_serial_ms
            if start > now:
                self.loop.at(start, lambda: self._route(req), PRIO_ARRIVAL)
                return req
        self._route(req)
        return req

    def _route(self, req: SimRequest) -> None:
        """Admit (or shed) and route ``req`` (``submit``, after the serial stage)."""
        function = req.function
        if self.admission_slo_factor is not None and self._refused(req):
            return
        self.outstanding[function] += 1
        self.log.submitted += 1
        live = [i for i in self._instances[function] if not i.draining and not i.stopped]
        start = 0
        if self.rotate_ties and len(live) > 1:
            start = self._rr[function] = (self._rr.get(function, 0) + 1) % len(live)
        pick = choose_instance(
            [Candidate(i.outstanding, i.ready) for i in live], start, wait_at_starting=True
        )
        if pick is None:
            self._pending[function].append(req)
            if self.on_cold is not None:
                self.on_cold(function)
            return
        live[pick].enqueue(req)

    def _refused(self, req: SimRequest) -> bool:
        """``policy.admission.admit`` for ``req``; a shed request is answered now (a miss)."""
        fn = req.function
        assert self.admission_slo_factor is not None
        d = admit(
            self.outstanding[fn],
            self._service.setdefault(fn, ServiceEstimate()),
            req.slo_ms,
            self.admission_slo_factor,
        )
        if d.verdict is not Admit.SHED:
            return False
        req.shed = True
        req.start_ms = req.finish_ms = self.loop.now_ms
        self.shed[fn] = self.shed.get(fn, 0) + 1
        self.log.submitted += 1
        self._add_platform(req)
        self.log.record(req)
        for hook in self.on_complete_hooks:
            hook(req)
        return True

    def _add_platform(self, req: SimRequest) -> None:
        if self.platform_ms:
            req.finish_ms += self.platform_ms[int(self._rng.integers(len(self.platform_ms)))]
