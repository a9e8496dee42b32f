"""Invokers (worker nodes), their function containers and the data-transfer model (ESG §3.2, §4).

An invoker has ``vcpus`` vCPUs (16) and one GPU cut into ``vgpus`` MIG slices (7). A running
task holds its configuration's vCPUs and vGPUs from its dispatch (cold start included) to its
end; the GPU is shared by giving each running task its own slices (``reserve``/``release``
never let the sum exceed the capacity — ``SimulationError`` otherwise).

Containers: each invoker keeps a *pool* per function — idle warm containers, busy ones and
ones being pre-warmed. A task takes an idle container (warm start), else adopts one being
pre-warmed (waits for the rest of its start-up), else starts a new one (cold start: the
function's Table 3 cold-start time). When the task ends its container goes idle and is evicted
after the keep-alive (``policy.prewarm.keep_alive_deadline_ms``). Idle and pre-warming
containers hold no vCPU/vGPU (as ``policy.workflow.dispatch.InvokerState`` assumes) and are not
charged (see ``gshare.sim.workflow.simulator``).

Data transfer (``TransferModel``): a stage's input is its predecessor's output, sized by the
consuming function's Table 3 input MB per job. On the same invoker it is read from the local
file system; across invokers it goes through remote storage (ESG §3.4). The constants are ours
(the paper gives none): remote = 20 ms + MB / (100 MB/s) — a write and a read through an
object store over a shared 1 Gb/s-class path (2.7 MB: 47 ms); local = 1 ms + MB / (1000 MB/s)
— the page cache of a local file system (2.7 MB: 3.7 ms). A batch's local and remote inputs
are fetched in parallel, each kind sequentially over its path. The first stage's input arrives
with the invocation (no transfer; the same for every scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gshare.policy.prewarm import IntervalEwma
from gshare.sim.engine import SimulationError

ContainerState = Literal["starting", "idle", "busy", "evicted"]


@dataclass(frozen=True, slots=True)
class TransferModel:
    """Time to move stage inputs (module doc). Invariants (checked): latencies >= 0,
    bandwidths > 0."""

    remote_latency_ms: float = 20.0
    remote_mb_per_s: float = 100.0
    local_latency_ms: float = 1.0
    local_mb_per_s: float = 1000.0

    def __post_init__(self) -> None:
        if self.remote_latency_ms < 0 or self.local_latency_ms < 0:
            raise ValueError("transfer latencies must be >= 0")
        if self.remote_mb_per_s <= 0 or self.local_mb_per_s <= 0:
            raise ValueError("transfer bandwidths must be > 0")

    def remote_ms(self, mb: float) -> float:
        """One remote transfer of ``mb`` MB."""
        return self.remote_latency_ms + mb / self.remote_mb_per_s * 1000.0

    def local_ms(self, mb: float) -> float:
        """One local transfer of ``mb`` MB."""
        return self.local_latency_ms + mb / self.local_mb_per_s * 1000.0

    def batch_ms(self, local_mb: float, local_n: int, remote_mb: float, remote_n: int) -> float:
        """A batch's input: ``local_n`` local inputs of ``local_mb`` MB in total and
        ``remote_n`` remote ones of ``remote_mb`` MB, the two kinds in parallel."""
        t_local = self.local_ms(local_mb) if local_n else 0.0
        t_remote = self.remote_ms(remote_mb) if remote_n else 0.0
        return max(t_local, t_remote)


@dataclass(slots=True, eq=False)
class Container:
    """One function container on one invoker."""

    container_id: int
    function: str
    invoker_id: int
    state: ContainerState
    ready_ms: float
    """When it is (or was) warm."""
    idle_since_ms: float = 0.0


@dataclass(slots=True)
class Pool:
    """The containers of one function on one invoker, and the pre-warming statistics."""

    function: str
    idle: list[Container] = field(default_factory=list)
    """Warm containers without a task; the last one idled is reused first."""
    starting: list[Container] = field(default_factory=list)
    """Containers being pre-warmed, earliest ready first."""
    busy: int = 0
    calls: IntervalEwma = field(default_factory=IntervalEwma)
    """EWMA of the intervals between task starts here (``policy.prewarm``)."""
    hold_ms: float | None = None
    """EWMA of how long a task holds a container here (transfer + execution)."""


@dataclass(slots=True)
class Invoker:
    """One worker node: capacity, free resources, function pools, peak use (for the tests)."""

    invoker_id: int
    vcpus: int
    vgpus: int
    free_vcpus: int = -1
    free_vgpus: int = -1
    pools: dict[str, Pool] = field(default_factory=dict)
    peak_vcpus: int = 0
    """Largest number of vCPUs ever held at once."""
    peak_vgpus: int = 0

    def __post_init__(self) -> None:
        if self.vcpus < 1 or self.vgpus < 1:
            raise ValueError(f"invoker {self.invoker_id}: capacity must be >= 1")
        if self.free_vcpus < 0:
            self.free_vcpus = self.vcpus
        if self.free_vgpus < 0:
            self.free_vgpus = self.vgpus

    def pool(self, function: str) -> Pool:
        p = self.pools.get(function)
        if p is None:
            p = self.pools[function] = Pool(function)
        return p

    def fits(self, vcpus: int, vgpus: int) -> bool:
        return vcpus <= self.free_vcpus and vgpus <= self.free_vgpus

    def reserve(self, vcpus: int, vgpus: int) -> None:
        """Hold resources for a task; ``SimulationError`` if they are not free."""
        if vcpus < 0 or vgpus < 0 or not self.fits(vcpus, vgpus):
            raise SimulationError(
                f"invoker {self.invoker_id}: cannot hold {vcpus} vCPUs / {vgpus} vGPUs with "
                f"{self.free_vcpus}/{self.vcpus} vCPUs and "
                f"{self.free_vgpus}/{self.vgpus} vGPUs free"
            )
        self.free_vcpus -= vcpus
        self.free_vgpus -= vgpus
        self.peak_vcpus = max(self.peak_vcpus, self.vcpus - self.free_vcpus)
        self.peak_vgpus = max(self.peak_vgpus, self.vgpus - self.free_vgpus)

    def release(self, vcpus: int, vgpus: int) -> None:
        """Give back a task's resources; ``SimulationError`` if more than held."""
        if self.free_vcpus + vcpus > self.vcpus or self.free_vgpus + vgpus > self.vgpus:
            raise SimulationError(f"invoker {self.invoker_id}: released more than it holds")
        self.free_vcpus += vcpus
        self.free_vgpus += vgpus

    def warm_counts(self) -> dict[str, int]:
        """Function -> idle warm containers (``InvokerState.warm``)."""
        return {fn: len(p.idle) for fn, p in self.pools.items() if p.idle}
