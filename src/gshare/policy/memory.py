"""The memory reservations of one device: who holds how much, and whether a limit may grow.

Who calls it: the device's token server in the node agent (``runtime.tokens.server``), which
owns one ``DeviceMemory`` per device. The agent ``reserve``s an instance's starting limit before
the instance starts (a refusal fails the start with the ledger's message) and ``release``s it
when the instance stops; the instance asks for every change of its limit (``resize``: grow by
steps when a request needs more, back to ``init`` when idle) over its memory channel. The
controller sees the reservations in the node's status and does not place an instance on a
device whose free memory is below its starting limit.

What must hold: the sum of the reservations never exceeds ``capacity_mb``; shrinking is always
granted; a refused grow leaves the reservation unchanged. Instances without a memory limit
(``mem_mb`` 0) reserve nothing and are not governed here.

Pure data structure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class MemoryRefusal(StrEnum):
    """Why a reservation or a grow was refused."""

    DEVICE_FULL = "device memory full"
    UNKNOWN_OWNER = "no reservation of that instance"
    BAD_VALUE = "the size must be a finite number >= 0"


@dataclass(frozen=True, slots=True)
class MemoryGrant:
    """The answer to ``reserve`` / ``resize``: the reservation the owner holds afterwards."""

    limit_mb: float
    """The owner's reservation now (unchanged when refused)."""
    free_mb: float
    """The device's unreserved memory afterwards."""
    refusal: MemoryRefusal | None = None
    """None when granted."""

    @property
    def granted(self) -> bool:
        return self.refusal is None


@dataclass(frozen=True, slots=True)
class Reservation:
    """One owner's reservation and its history (a snapshot)."""

    limit_mb: float
    grows: int = 0
    """Granted increases (each one a kill the fixed limit would have caused)."""
    steps: int = 0
    """Sum of the steps of the granted increases, as the instance counted them."""
    refusals: int = 0
    """Increases refused (the request that needed them failed with a memory-limit error)."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """An instance's memory sizing, MiB: it starts with a limit of ``init_mb`` and grows it by
    ``step_mb`` up to ``max_mb``. ``step_mb`` 0: a fixed limit of ``init_mb``; ``init_mb`` and
    ``step_mb`` both 0: no limit; ``max_mb`` 0: as much as the device's ledger grants."""

    init_mb: float = 0.0
    step_mb: float = 0.0
    max_mb: float = 0.0

    @property
    def governed(self) -> bool:
        """True when the instance has a memory limit at all."""
        return self.init_mb > 0 or self.step_mb > 0

    @property
    def fixed(self) -> bool:
        """True when the limit never grows."""
        return self.step_mb <= 0

    @property
    def cap_mb(self) -> float:
        """The largest limit the plan allows (``max_mb``, or unbounded)."""
        if self.fixed:
            return self.init_mb
        return self.max_mb if self.max_mb > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Growth:
    """``grow_limit``'s answer: the limit to ask for and how many steps it adds, or
    ``limit_mb`` None when no limit up to ``max`` covers the need."""

    limit_mb: float | None
    steps: int = 0


# NOTE: BulkX §3 (a component scales up by its step when it needs more, per input).
def grow_limit(
    limit_mb: float, need_mb: float, init_mb: float, step_mb: float, max_mb: float
) -> Growth:
    """The smallest limit ``init + k·step`` (k integer) that covers ``need_mb`` and is above
    the current ``limit_mb``, capped at ``max_mb`` (which is offered when the next step would
    pass it but ``max`` still covers the need). ``Growth(None)`` when even ``max`` does not
    cover it. Requires ``step_mb > 0``."""
    if step_mb <= 0:
        raise ValueError(f"step_mb must be > 0, got {step_mb}")
    if need_mb > max_mb + 1e-9:
        return Growth(None)
    k = max(0, math.ceil((need_mb - init_mb) / step_mb - 1e-9))
    target = init_mb + k * step_mb
    if target <= limit_mb + 1e-9:  # covered by one more step than we have
        target = limit_mb + step_mb
    target = min(target, max_mb)
    if target <= limit_mb + 1e-9:
        return Growth(None)
    return Growth(target, max(1, math.ceil((target - limit_mb) / step_mb - 1e-9)))


def idle_limit(used_mb: float, init_mb: float, step_mb: float, max_mb: float) -> float:
    """The limit an idle instance goes back to: ``init``, or the smallest ``init + k·step``
    (at most ``max``) that covers the memory it still uses."""
    if used_mb <= init_mb or step_mb <= 0:
        return init_mb
    k = math.ceil((used_mb - init_mb) / step_mb - 1e-9)
    return min(max_mb, init_mb + k * step_mb)


class DeviceMemory:
    """A device's memory ledger (see the module doc). Not thread-safe: the token server calls
    it under its lock."""

    def __init__(self, capacity_mb: float) -> None:
        if not (math.isfinite(capacity_mb) and capacity_mb > 0):
            raise ValueError(f"capacity_mb must be a finite number > 0, got {capacity_mb}")
        self.capacity_mb = float(capacity_mb)
        self._held: dict[str, Reservation] = {}
        self._reserved_mb = 0.0

    @property
    def reserved_mb(self) -> float:
        return self._reserved_mb

    @property
    def free_mb(self) -> float:
        return max(0.0, self.capacity_mb - self._reserved_mb)

    def holds(self, owner: str) -> bool:
        return owner in self._held

    def reserve(self, owner: str, limit_mb: float) -> MemoryGrant:
        """A new reservation of ``limit_mb`` (an existing one of ``owner`` is replaced)."""
        if not (math.isfinite(limit_mb) and limit_mb >= 0):
            return MemoryGrant(0.0, self.free_mb, MemoryRefusal.BAD_VALUE)
        old = self._held.get(owner)
        have = old.limit_mb if old else 0.0
        if limit_mb - have > self.free_mb + 1e-9:
            return MemoryGrant(have, self.free_mb, MemoryRefusal.DEVICE_FULL)
        self._reserved_mb += limit_mb - have
        self._held[owner] = Reservation(limit_mb)
        return MemoryGrant(limit_mb, self.free_mb)

    def resize(self, owner: str, limit_mb: float, steps: int = 0) -> MemoryGrant:
        """Change ``owner``'s reservation to ``limit_mb``: a decrease is always granted, an
        increase when the device has that much free (``steps``: how many steps it is, for the
        counters)."""
        old = self._held.get(owner)
        if old is None:
            return MemoryGrant(0.0, self.free_mb, MemoryRefusal.UNKNOWN_OWNER)
        if not (math.isfinite(limit_mb) and limit_mb >= 0):
            return MemoryGrant(old.limit_mb, self.free_mb, MemoryRefusal.BAD_VALUE)
        delta = limit_mb - old.limit_mb
        if delta > self.free_mb + 1e-9:
            self._held[owner] = Reservation(old.limit_mb, old.grows, old.steps, old.refusals + 1)
            return MemoryGrant(old.limit_mb, self.free_mb, MemoryRefusal.DEVICE_FULL)
        grew = delta > 0
        self._held[owner] = Reservation(
            limit_mb,
            old.grows + int(grew),
            old.steps + (max(1, steps) if grew else 0),
            old.refusals,
        )
        self._reserved_mb += delta
        return MemoryGrant(limit_mb, self.free_mb)

    def refused(self, owner: str) -> None:
        """Count a grow the owner could not even ask for (over its own ``max``)."""
        old = self._held.get(owner)
        if old is not None:
            self._held[owner] = Reservation(old.limit_mb, old.grows, old.steps, old.refusals + 1)

    def release(self, owner: str) -> None:
        """Drop ``owner``'s reservation (no-op when it has none)."""
        old = self._held.pop(owner, None)
        if old is not None:
            self._reserved_mb = max(0.0, self._reserved_mb - old.limit_mb)

    def snapshot(self) -> dict[str, Reservation]:
        return dict(self._held)


__all__ = [
    "DeviceMemory",
    "Growth",
    "MemoryGrant",
    "MemoryPlan",
    "MemoryRefusal",
    "Reservation",
    "grow_limit",
    "idle_limit",
]
