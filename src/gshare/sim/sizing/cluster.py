"""The cluster-level effect of sizing (BulkX Fig. 7): with the same total memory, how many
invocations per second does each policy sustain?

Capacity model (a loss system; deterministic for a seed):

* **Cluster**: ``servers`` nodes of ``server_mb`` each, one ``policy.memory.DeviceMemory``
  ledger per node — the ledger the live node agent keeps. Only memory is modelled (BulkX's
  Fig. 7 is memory utilisation); CPUs never limit.
* **Workload**: ``arrivals`` invocations; each picks an app with probability proportional to
  its invocations in the trace, draws its demand and execution time as ``sim.sizing.apps``
  does, and arrives at ``a_j / rate`` (``a_j`` the points of a unit-rate Poisson process). The
  same draws serve every policy and every rate (common random numbers).
* **Admission**: an invocation's first reservation (``Reservation.first_mb``: the fixed size,
  or ``init``) goes to the first node with that much free; if none has, it is **rejected**. A
  BulkX invocation then grows on its node at once (the grown size is held for its whole
  execution, as in the accounting); if that node cannot take the growth (the ledger refuses,
  ``DEVICE_FULL``) the invocation is moved — released and placed whole on the first node that
  fits (``moves``) — or rejected when none does. gshare has no remote memory: BulkX would place
  the extra memory on another server over RDMA instead. A p99 invocation that is killed
  releases its reservation after ``kill_fraction`` of its run and is retried at the app's
  maximum, placed like a new arrival (rejected if nothing fits). Memory is released at the
  end of the execution.
* **Sustained rate**: the highest rate whose rejected share of the arrivals after the first
  ``warmup_fraction`` stays at most ``max_reject``. It is found by bisection (geometric, on
  the same draws) between a rate that meets the target and one that does not, starting from
  the fluid bound ``total memory / mean reserved MB·s per invocation`` (Little's law with
  perfect packing, which the model reports beside it as ``fluid_rate_per_s``).

Durations are heavy-tailed (an app runs for 70 minutes); a run spans ``arrivals / rate``
seconds, so the longest executions never reach a steady state within it. The policies see the
same draws, so the comparison stands; absolute rates are indicative only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gshare.policy.memory import DeviceMemory
from gshare.sim.engine import EventLoop
from gshare.sim.priorities import PRIO_ARRIVAL, PRIO_FINISH
from gshare.sim.sizing.accounting import Reservation
from gshare.sim.sizing.apps import AppTrace


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One arrival of the capacity workload, before a policy is applied."""

    app: int
    """Index into the apps the stream was drawn from."""
    demand_mb: float
    exec_s: float
    arrival: float
    """Point of the unit-rate Poisson process: arrives at ``arrival / rate`` s."""


def draw_stream(
    apps: Sequence[AppTrace], arrivals: int, rng: np.random.Generator
) -> list[StreamItem]:
    """``arrivals`` invocations (module doc: the workload)."""
    weights = np.array([a.invocations for a in apps], dtype=np.float64)
    which = rng.choice(len(apps), size=arrivals, p=weights / weights.sum())
    u_mem = rng.uniform(0.0, 1.0, arrivals)
    u_dur = rng.uniform(0.0, 1.0, arrivals)
    times = np.cumsum(rng.exponential(1.0, arrivals))
    out = []
    for j in range(arrivals):
        a = apps[int(which[j])]
        out.append(
            StreamItem(
                int(which[j]),
                float(a.demand_mb(u_mem[j : j + 1])[0]),
                float(a.exec_s(u_dur[j : j + 1])[0]),
                float(times[j]),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run at one rate."""

    rate_per_s: float
    arrivals: int
    """Arrivals after the warm-up."""
    rejected: int
    """Of those, rejected (at arrival, at a move or at a retry)."""
    moves: int
    """BulkX growths that moved to another node."""

    @property
    def reject_share(self) -> float:
        return self.rejected / self.arrivals if self.arrivals else 0.0


@dataclass(frozen=True, slots=True)
class Capacity:
    """A policy's sustained rate (module doc)."""

    sustained_rate_per_s: float
    fluid_rate_per_s: float
    at_sustained: RunResult
    """The run at the sustained rate."""
    runs: int


class _Run:
    """One simulation at one rate: the event loop, the node ledgers, the counters."""

    def __init__(
        self,
        plans: Sequence[Reservation],
        stream: Sequence[StreamItem],
        servers: int,
        server_mb: float,
        rate_per_s: float,
        kill_fraction: float,
        warmup: int,
    ) -> None:
        self.loop = EventLoop()
        self.nodes = [DeviceMemory(server_mb) for _ in range(servers)]
        self.plans, self.stream = plans, stream
        self.rate = rate_per_s
        self.kill_fraction = kill_fraction
        self.warmup = warmup
        self.rejected = 0
        self.moves = 0

    def place(self, owner: str, mb: float) -> int | None:
        for k, node in enumerate(self.nodes):
            if node.free_mb + 1e-9 >= mb and node.reserve(owner, mb).granted:
                return k
        return None

    def run(self) -> RunResult:
        it = iter(range(len(self.stream)))

        def next_arrival() -> None:
            for j in it:
                self.loop.at(self.stream[j].arrival / self.rate * 1000.0, arrive(j), PRIO_ARRIVAL)
                return

        def arrive(j: int) -> Callable[[], None]:
            def fire() -> None:
                self.start(j)
                next_arrival()

            return fire

        next_arrival()
        self.loop.run()
        return RunResult(self.rate, len(self.stream) - self.warmup, self.rejected, self.moves)

    def reject(self, j: int) -> None:
        if j >= self.warmup:
            self.rejected += 1

    def release_at(self, node: int, owner: str, after_s: float, then: Callable[[], None]) -> None:
        def done() -> None:
            self.nodes[node].release(owner)
            then()

        self.loop.after(after_s * 1000.0, done, PRIO_FINISH)

    def start(self, j: int) -> None:
        plan, item, owner = self.plans[j], self.stream[j], str(j)
        node = self.place(owner, plan.first_mb)
        if node is None:
            self.reject(j)
            return
        if plan.killed:  # p99: killed part-way, retried at the maximum
            self.release_at(node, owner, item.exec_s * self.kill_fraction, lambda: self.retry(j))
            return
        if (
            plan.grown_mb > plan.first_mb
            and not self.nodes[node].resize(owner, plan.grown_mb, plan.steps).granted
        ):
            self.nodes[node].release(owner)
            moved = self.place(owner, plan.grown_mb)
            if moved is None:
                self.reject(j)
                return
            node = moved
            if j >= self.warmup:
                self.moves += 1
        self.release_at(node, owner, item.exec_s, lambda: None)

    def retry(self, j: int) -> None:
        owner = f"{j}r"
        node = self.place(owner, self.plans[j].retry_mb)
        if node is None:
            self.reject(j)
            return
        self.release_at(node, owner, self.stream[j].exec_s, lambda: None)


def simulate(
    plans: Sequence[Reservation],
    stream: Sequence[StreamItem],
    *,
    servers: int,
    server_mb: float,
    rate_per_s: float,
    kill_fraction: float,
    warmup_fraction: float,
) -> RunResult:
    """One run at ``rate_per_s``; ``plans[j]`` is the policy's ``Reservation`` of
    ``stream[j]``."""
    warmup = math.floor(warmup_fraction * len(stream))
    return _Run(plans, stream, servers, server_mb, rate_per_s, kill_fraction, warmup).run()


def sustained_rate(
    plans: Sequence[Reservation],
    stream: Sequence[StreamItem],
    *,
    servers: int,
    server_mb: float,
    kill_fraction: float,
    warmup_fraction: float,
    max_reject: float,
    iterations: int,
) -> Capacity:
    """The highest rate with at most ``max_reject`` rejected (module doc), by bisection."""
    mean_mbs = float(np.mean([p.reserved_mbs for p in plans]))
    fluid = servers * server_mb / mean_mbs if mean_mbs > 0 else math.inf

    def at(rate: float) -> RunResult:
        return simulate(
            plans,
            stream,
            servers=servers,
            server_mb=server_mb,
            rate_per_s=rate,
            kill_fraction=kill_fraction,
            warmup_fraction=warmup_fraction,
        )

    runs = 0
    lo, hi = 0.5 * fluid, 1.5 * fluid
    r_lo = at(lo)
    runs += 1
    while r_lo.reject_share > max_reject:  # not low enough yet
        hi, lo = lo, lo / 2
        r_lo = at(lo)
        runs += 1
    r_hi = at(hi)
    runs += 1
    while r_hi.reject_share <= max_reject:
        lo, r_lo, hi = hi, r_hi, hi * 2
        r_hi = at(hi)
        runs += 1
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        r = at(mid)
        runs += 1
        if r.reject_share <= max_reject:
            lo, r_lo = mid, r
        else:
            hi = mid
    return Capacity(lo, fluid, r_lo, runs)
