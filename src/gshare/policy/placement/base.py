"""What every placer shares: the decisions it returns (``Binding``, ``Move``), its errors
(``NoCapacity``, ``UnknownInstance``, ``UnknownPlacer``), the ``Placer`` base class with the
per-GPU bookkeeping, and ``_MaxRectsPlacer``, the free-list bookkeeping of the
maximal-rectangles placers (``mra``, ``defrag``, ``baselines``'s first/best fit).

The registry (``PLACERS``, ``make_placer``) is in ``registry``: it names every placer, and the
placers import this module.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Final

from gshare.policy.placement.geometry import FULL_BOX, Box, _area, _snap, _to_rect
from gshare.resources import GEOM_EPS, GPU_HEIGHT, GPU_WIDTH, GpuShare, Rect

# -- decisions and errors -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Binding:
    """Where an instance runs: returned by ``Placer.place``, listed by ``Placer.bindings``."""

    instance_id: str
    gpu: int
    """GPU index in ``[0, max_gpus)``."""
    rect: Rect
    """Its rectangle: x = time offset %, y = SM offset %, w = quota %, h = SM %."""


@dataclass(frozen=True, slots=True)
class Move:
    """A placed instance changed rectangle, and possibly GPU; returned by ``Placer.take_moves``.

    Within one GPU (a re-pack or a compaction; ``old_gpu == gpu``) the mechanism applies it by
    giving the instance its new SM band / time offset. Across GPUs (``"mra-defrag"``,
    ``"mra-room"``; ``old_gpu != gpu``, see ``is_cross_gpu``) it starts a replacement instance
    on ``gpu`` in ``new`` and drains the old one on ``old_gpu`` (serverless instances are
    stateless).
    """

    instance_id: str
    gpu: int
    """The GPU the instance is on now (``new_gpu``)."""
    old: Rect
    """The rectangle the instance had (and the mechanism applied) before."""
    new: Rect
    """The rectangle it has now; same width and height as ``old``."""
    old_gpu: int | None = None
    """The GPU the instance was on before; ``None`` when built means ``gpu`` (a move within one
    GPU) and is replaced by ``gpu``, so it is always an ``int`` once built."""

    def __post_init__(self) -> None:
        if self.old_gpu is None:
            object.__setattr__(self, "old_gpu", self.gpu)

    @property
    def new_gpu(self) -> int:
        """The GPU the instance is on now (same as ``gpu``)."""
        return self.gpu

    @property
    def is_cross_gpu(self) -> bool:
        """True when the instance changed GPU (a migration: start on ``gpu``, drain the old)."""
        return self.old_gpu != self.gpu


class NoCapacity(Exception):
    """No GPU among the placer's ``max_gpus`` can take the request; the message names both."""


class UnknownInstance(KeyError):
    """``release`` of an instance the placer does not hold; the message names it."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownPlacer(KeyError):
    """``make_placer`` with an unknown name; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


# -- placers ------------------------------------------------------------------------------------


def _check_size(instance_id: str, width_pct: float, height_pct: float) -> tuple[float, float]:
    for label, v, limit in (
        ("quota (width)", width_pct, GPU_WIDTH),
        ("SM (height)", height_pct, GPU_HEIGHT),
    ):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(
                f"instance {instance_id!r}: {label} must be in (0, {limit:g}] %, got {v}"
            )
        if v > limit + GEOM_EPS:
            raise ValueError(
                f"instance {instance_id!r} requests {label} {v:g} %, larger than a GPU "
                f"({limit:g} %): it can never be placed"
            )
    return _snap(min(width_pct, GPU_WIDTH)), _snap(min(height_pct, GPU_HEIGHT))


class Placer(ABC):
    """A placement policy with its explicit state: per-GPU allocations and free space.

    Who calls it: the simulator's / runtime's controller, once per instance start (``place``)
    and stop (``release``); both must be called in the order the instances start and stop.
    After either call the controller drains ``take_moves`` and applies them. Everything
    returned is a snapshot (frozen dataclasses, fresh dicts/lists) the caller may keep.
    """

    name: ClassVar[str] = ""

    def __init__(self, max_gpus: int) -> None:
        if max_gpus < 1:
            raise ValueError(f"max_gpus must be >= 1, got {max_gpus}")
        self.max_gpus: Final[int] = max_gpus
        self._bindings: dict[str, Binding] = {}
        self._size: dict[str, tuple[float, float]] = {}
        """Allocated (width, height) of every instance."""
        self._on_gpu: list[dict[str, Box]] = [{} for _ in range(max_gpus)]
        self._used = 0
        self._moves: list[Move] = []

    # -- the API ------------------------------------------------------------------------------

    def place(self, instance_id: str, width_pct: float, height_pct: float) -> Binding:
        """Place a new instance needing ``width_pct`` % of the time and ``height_pct`` % of the
        SMs; open a new GPU when none in use fits. Raises ``ValueError`` for a duplicate id or
        a request larger than a GPU and ``NoCapacity`` when no GPU of ``max_gpus`` fits."""
        if instance_id in self._bindings:
            raise ValueError(
                f"instance {instance_id!r} is already placed on GPU "
                f"{self._bindings[instance_id].gpu}"
            )
        w, h = _check_size(instance_id, width_pct, height_pct)
        return self._place(instance_id, w, h)

    def place_share(self, instance_id: str, share: GpuShare) -> Binding:
        """``place`` with the share's rectangle (width = quota request %, height = SM %)."""
        return self.place(instance_id, share.width, share.height)

    def release(self, instance_id: str) -> None:
        """Free the rectangle of a stopped instance. Raises ``UnknownInstance`` (a ``KeyError``)
        when the placer does not hold it."""
        if instance_id not in self._bindings:
            raise UnknownInstance(
                f"cannot release instance {instance_id!r}: {self.name} placer does not hold it"
            )
        self._release(instance_id)

    def gpus_used(self) -> int:
        """Number of GPUs with at least one instance."""
        return self._used

    def bindings(self) -> dict[str, Binding]:
        """Every placed instance and where it is now (after any moves)."""
        return dict(self._bindings)

    def binding(self, instance_id: str) -> Binding:
        """Where one instance is now; ``UnknownInstance`` when it is not placed."""
        try:
            return self._bindings[instance_id]
        except KeyError:
            raise UnknownInstance(f"instance {instance_id!r} is not placed") from None

    def instances_on(self, gpu: int) -> dict[str, Rect]:
        """The instances of one GPU and their rectangles."""
        self._check_gpu(gpu)
        return {iid: self._bindings[iid].rect for iid in self._on_gpu[gpu]}

    def allocated_area(self, gpu: int) -> float:
        """Sum of the allocated rectangles' areas on one GPU (quota % x SM %)."""
        self._check_gpu(gpu)
        return sum(_area(b) for b in self._on_gpu[gpu].values())

    def take_moves(self) -> list[Move]:
        """Moves since the last call (oldest first), and forget them. Only ``"mra"`` re-packs
        (and ``"time-share"`` compacts) within a GPU, only ``"mra-defrag"`` and ``"mra-room"``
        also move instances across GPUs (``Move.is_cross_gpu``); the others never move an
        instance. An instance may move more than once between two calls: apply the moves in
        order."""
        moves, self._moves = self._moves, []
        return moves

    @abstractmethod
    def free_rects(self, gpu: int) -> list[Rect]:
        """The free rectangles of one GPU, bottom-left first (one full rectangle when empty)."""

    # -- for subclasses ---------------------------------------------------------------------

    @abstractmethod
    def _place(self, instance_id: str, w: float, h: float) -> Binding: ...

    @abstractmethod
    def _release(self, instance_id: str) -> None: ...

    def _check_gpu(self, gpu: int) -> None:
        if not (0 <= gpu < self.max_gpus):
            raise ValueError(f"gpu must be in [0, {self.max_gpus}), got {gpu}")

    def _no_capacity(self, instance_id: str, w: float, h: float) -> NoCapacity:
        return NoCapacity(
            f"cannot place instance {instance_id!r} (quota {w:g} % x SM {h:g} %): no GPU of "
            f"max_gpus={self.max_gpus} has room ({self.name} placer, {self._used} in use)"
        )

    def _bind(self, instance_id: str, gpu: int, box: Box) -> Binding:
        if not self._on_gpu[gpu]:
            self._used += 1
        self._on_gpu[gpu][instance_id] = box
        self._size[instance_id] = (_snap(box[2] - box[0]), _snap(box[3] - box[1]))
        b = Binding(instance_id, gpu, _to_rect(box))
        self._bindings[instance_id] = b
        return b

    def _unbind(self, instance_id: str) -> tuple[int, Box]:
        gpu = self._bindings.pop(instance_id).gpu
        del self._size[instance_id]
        box = self._on_gpu[gpu].pop(instance_id)
        if not self._on_gpu[gpu]:
            self._used -= 1
        return gpu, box

    def _move(self, instance_id: str, gpu: int, box: Box, *, report: bool = True) -> None:
        """Give a placed instance the rectangle ``box`` of ``gpu`` (its own GPU or another one)
        and report the change as a ``Move``; ``gpus_used`` follows GPUs that empty or fill."""
        old = self._bindings[instance_id]
        if old.gpu != gpu:
            del self._on_gpu[old.gpu][instance_id]
            if not self._on_gpu[old.gpu]:
                self._used -= 1
            if not self._on_gpu[gpu]:
                self._used += 1
        self._on_gpu[gpu][instance_id] = box
        new = Binding(instance_id, gpu, _to_rect(box))
        self._bindings[instance_id] = new
        if report and (old.rect != new.rect or old.gpu != gpu):
            self._moves.append(Move(instance_id, gpu, old.rect, new.rect, old_gpu=old.gpu))


class _MaxRectsPlacer(Placer):
    """Shared bookkeeping of the maximal-rectangles placers: a free list per GPU (bottom-left
    order, no rectangle inside another, union = the free space) and a min-heap of unused GPUs
    (an unused GPU's list is the full square)."""

    def __init__(self, max_gpus: int) -> None:
        super().__init__(max_gpus)
        self._free: list[list[Box]] = [[FULL_BOX] for _ in range(max_gpus)]
        self._unused: list[int] = list(range(max_gpus))  # sorted, hence a valid heap

    def free_rects(self, gpu: int) -> list[Rect]:
        self._check_gpu(gpu)
        return [_to_rect(b) for b in self._free[gpu]]

    def free_list_len(self, gpu: int) -> int:
        """Length of one GPU's free list (what ``repack_threshold`` is compared with)."""
        self._check_gpu(gpu)
        return len(self._free[gpu])

    def _open_gpu(self) -> int | None:
        """The lowest-index unused GPU, taken off the unused heap (None when all are in use)."""
        return heapq.heappop(self._unused) if self._unused else None

    def _set_free(self, gpu: int, free: list[Box]) -> None:
        """Replace one GPU's free list (subclasses hook their indexes in here)."""
        self._free[gpu] = free

    def _emptied(self, gpu: int) -> None:
        """The last instance of ``gpu`` left: the GPU is one full rectangle again, unused."""
        self._set_free(gpu, [FULL_BOX])
        heapq.heappush(self._unused, gpu)
