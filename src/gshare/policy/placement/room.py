"""``"mra-room"`` — ``"mra-defrag"`` plus making room at arrival, under a migration budget
(gshare's extension, not in FaST-GShare).

When no in-use GPU has a free rectangle that fits an arriving instance (``"mra"`` would open a
new GPU), it looks for a spot on a fairly empty in-use GPU that at most ``room_max_moves``
small instances block, moves those to other GPUs with MRA's best-area fit and places the new
instance there. Drains are ``"mra-defrag"``'s. Every cross-GPU move, for room or for a drain,
counts against ``max_migrations_per_release``. The NOTE in ``RoomDefragPlacer`` states the
rule; measurements are in ``docs/journal/placement.md``.
"""

from __future__ import annotations

import math
from itertools import islice
from typing import ClassVar, Final

from gshare.policy.placement.base import Binding
from gshare.policy.placement.defrag import DEFAULT_DEFRAG_MARGIN_PCT, DefragMaxRectsPlacer
from gshare.policy.placement.geometry import Box, _area, _cut, _maximal_free, _overlap, _snap
from gshare.policy.placement.mra import DEFAULT_REPACK_THRESHOLD
from gshare.resources import GEOM_EPS, GPU_HEIGHT, GPU_WIDTH

DEFAULT_ROOM_SPARSE_PCT: Final[float] = 47.0
"""``"mra-room"``'s drain threshold (``"mra-defrag"``'s ``sparse_pct``): a little lower than
``"mra-defrag"``'s 50 %, so that drains and room-making together stay near 0.3 migrations per
departure on ``packing-scale`` (``docs/journal/placement.md``)."""
DEFAULT_ROOM_MAX_MOVES: Final[int] = 2
"""At most this many instances are moved away to make room for one arrival."""
DEFAULT_ROOM_GPUS: Final[int] = 64
"""Room is looked for on at most this many in-use GPUs, least-loaded first."""
DEFAULT_ROOM_TRIES: Final[int] = 32
"""At most this many candidate spots are planned (cheapest first) per arrival."""
DEFAULT_MAX_MIGRATIONS_PER_RELEASE: Final[float] = 0.3
"""Migration budget: cross-GPU moves so far <= this x releases so far + ``migration_burst``,
after every call."""
DEFAULT_MIGRATION_BURST: Final[float] = 20.0
"""Migrations allowed before any release has earned them (a token bucket's initial fill): with
none, the early arrivals, which open most GPUs, find the budget empty. Over a run of ~3,000
departures it adds <= 0.007 per departure (``docs/journal/placement.md``)."""


class RoomDefragPlacer(DefragMaxRectsPlacer):
    """``"mra-room"`` — ``"mra-defrag"`` plus making room at arrival (see the NOTE), with every
    cross-GPU move under one budget. gshare's extension, not in FaST-GShare.

    Who calls it: like every placer, the controller (``place`` / ``release``, then
    ``take_moves``). A ``place`` may now return moves too: instances moved away to make room
    (``Move.is_cross_gpu``), applied before the new instance starts where they were.

    What holds, besides the placer invariants: ``migrations <= max_migrations_per_release x
    releases + migration_burst`` after every call (``None``: no budget); making room never
    opens a GPU; when nothing is ever moved, placement is exactly ``"mra"``'s.

    Parameters: those of ``DefragMaxRectsPlacer`` (``sparse_pct`` defaults to
    ``DEFAULT_ROOM_SPARSE_PCT``), ``room_max_moves``, ``room_gpus``, ``room_tries`` and
    ``max_migrations_per_release``, ``migration_burst`` (defaults: the ``DEFAULT_ROOM_*``,
    ``DEFAULT_MAX_MIGRATIONS_PER_RELEASE`` and ``DEFAULT_MIGRATION_BURST`` constants).
    Counters: those of ``"mra-defrag"``, plus ``rooms`` (arrivals placed by making room) and
    ``releases``.
    """

    name: ClassVar[str] = "mra-room"

    def __init__(
        self,
        max_gpus: int,
        repack_threshold: int = DEFAULT_REPACK_THRESHOLD,
        merge_on_release: bool = True,
        sparse_pct: float = DEFAULT_ROOM_SPARSE_PCT,
        margin_pct: float = DEFAULT_DEFRAG_MARGIN_PCT,
        room_max_moves: int = DEFAULT_ROOM_MAX_MOVES,
        room_gpus: int = DEFAULT_ROOM_GPUS,
        room_tries: int = DEFAULT_ROOM_TRIES,
        max_migrations_per_release: float | None = DEFAULT_MAX_MIGRATIONS_PER_RELEASE,
        migration_burst: float = DEFAULT_MIGRATION_BURST,
    ) -> None:
        for label, v in (
            ("room_max_moves", room_max_moves),
            ("room_gpus", room_gpus),
            ("room_tries", room_tries),
            ("migration_burst", migration_burst),
        ):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{label} must be >= 0, got {v}")
        if max_migrations_per_release is not None and not (
            math.isfinite(max_migrations_per_release) and max_migrations_per_release >= 0
        ):
            raise ValueError(
                f"max_migrations_per_release must be >= 0 or None, got {max_migrations_per_release}"
            )
        super().__init__(
            max_gpus,
            repack_threshold=repack_threshold,
            merge_on_release=merge_on_release,
            sparse_pct=sparse_pct,
            margin_pct=margin_pct,
        )
        self.room_max_moves: Final[int] = room_max_moves
        self.room_gpus: Final[int] = room_gpus
        self.room_tries: Final[int] = room_tries
        self.max_migrations_per_release: Final[float | None] = max_migrations_per_release
        self.migration_burst: Final[float] = migration_burst
        self.rooms = 0
        self.releases = 0

    # NOTE — making room at arrival: gshare's extension of MRA, NOT in FaST-GShare (§3.4.2 binds
    # a pod to a free rectangle or "a new GPU required"; it never moves pods across GPUs).
    # Rule, when no free rectangle of an in-use GPU fits F = (w, h) (line 1 finds nothing):
    #   1. budget: k = min(room_max_moves, migrations still allowed); nothing if k = 0;
    #   2. candidate GPUs: the ``room_gpus`` least-loaded in-use GPUs with free area >= w x h;
    #   3. candidate spots on one: x in {0, 100 - w, every instance's x2, every x1 - w}, y
    #      likewise, the w x h rectangle inside the GPU; its *blockers* are the instances it
    #      overlaps; kept when 1 <= blockers <= k (and not every instance of the GPU);
    #   4. spots in order (fewest blockers, least blocker area, GPU, y, x); for the first
    #      ``room_tries`` of them, the blockers are planned onto the OTHER in-use GPUs as a
    #      drain is ("mra-defrag" step 3, all-or-nothing); the first spot that plans is taken:
    #      blockers move, the GPU's free list is rebuilt exactly and F is placed on the spot;
    #   5. otherwise "mra" opens the lowest-index unused GPU.
    # Drains: "mra-defrag"'s rule after every release, skipped when the drained GPU's instances
    # would overrun the budget. Budget: migrations <= max_migrations_per_release x releases +
    # migration_burst (a token bucket's rate and initial fill).
    # Invariant: F overlaps no instance that stays; making room never opens a GPU.
    # Why this rule, measurements and what did not work: docs/journal/placement.md.

    def _place(self, instance_id: str, w: float, h: float) -> Binding:
        if self._best_area_fit(w, h) is None:
            made = self._make_room(instance_id, w, h)
            if made is not None:
                return made
        return super()._place(instance_id, w, h)

    def _release(self, instance_id: str) -> None:
        self.releases += 1
        super()._release(instance_id)

    def _drain(self, g: int) -> bool:
        if len(self._on_gpu[g]) > self._allowed_migrations():
            return False
        return super()._drain(g)

    def _allowed_migrations(self) -> int:
        """Cross-GPU moves the budget still allows now (a large number without a budget)."""
        if self.max_migrations_per_release is None:
            return len(self._bindings)  # no plan moves more instances than are placed
        left = (
            self.max_migrations_per_release * self.releases + self.migration_burst - self.migrations
        )
        return max(0, math.floor(left + GEOM_EPS))

    def _room_spots(self, w: float, h: float, k: int) -> list[tuple[int, float, int, Box]]:
        """NOTE steps 2-4: candidate spots as (blockers, blocker area, gpu, spot), sorted by
        (blockers, blocker area, gpu, y, x)."""
        need = w * h
        spots: list[tuple[int, float, int, float, float, Box]] = []
        for load, g in islice(self._by_load, 0, self.room_gpus):
            if GPU_WIDTH * GPU_HEIGHT - load < need - GEOM_EPS:
                break  # the list is sorted by load: no later GPU has the free area either
            on = self._on_gpu[g]
            xs = {0.0, _snap(GPU_WIDTH - w)}
            ys = {0.0, _snap(GPU_HEIGHT - h)}
            for b in on.values():
                xs.update((b[2], _snap(b[0] - w)))
                ys.update((b[3], _snap(b[1] - h)))
            for x in xs:
                if x < -GEOM_EPS or x + w > GPU_WIDTH + GEOM_EPS:
                    continue
                for y in ys:
                    if y < -GEOM_EPS or y + h > GPU_HEIGHT + GEOM_EPS:
                        continue
                    spot = (x, y, _snap(x + w), _snap(y + h))
                    blockers = [b for b in on.values() if _overlap(b, spot)]
                    if 1 <= len(blockers) <= k and len(blockers) < len(on):
                        area = round(sum(_area(b) for b in blockers), 6)
                        spots.append((len(blockers), area, g, y, x, spot))
        spots.sort()
        return [(n, a, g, spot) for n, a, g, _, _, spot in spots]

    def _make_room(self, instance_id: str, w: float, h: float) -> Binding | None:
        """NOTE steps 1-4: place ``instance_id`` by moving blockers away, or None (nothing
        changed)."""
        k = min(self.room_max_moves, self._allowed_migrations())
        if k < 1:
            return None
        for _, _, g, spot in islice(self._room_spots(w, h, k), 0, self.room_tries):
            blockers = [i for i, b in self._on_gpu[g].items() if _overlap(b, spot)]
            planned = self._plan_elsewhere(blockers, g)
            if planned is None:
                continue
            self._apply_plan(*planned)
            self._set_free(g, _cut(_maximal_free(self._on_gpu[g].values()), spot))
            binding = self._bind(instance_id, g, spot)
            self.rooms += 1
            self._repack_receivers(planned[0])
            if len(self._free[g]) > self.repack_threshold:
                self._repack(g, new_instance=instance_id)
                binding = self._bindings[instance_id]
            return binding
        return None
