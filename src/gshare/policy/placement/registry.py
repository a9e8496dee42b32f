"""The placer registry shared by the CLI, the simulator, the runtime and the experiments.

(Separate from ``base``: it names every placer, and every placer module imports ``base``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gshare.policy.placement.base import Placer, UnknownPlacer
from gshare.policy.placement.baselines import BestFitPlacer, FirstFitPlacer, TimeSharePlacer
from gshare.policy.placement.defrag import DefragMaxRectsPlacer
from gshare.policy.placement.mra import MaxRectsPlacer
from gshare.policy.placement.room import RoomDefragPlacer

PLACERS: dict[str, Callable[..., Placer]] = {
    MaxRectsPlacer.name: MaxRectsPlacer,
    DefragMaxRectsPlacer.name: DefragMaxRectsPlacer,
    RoomDefragPlacer.name: RoomDefragPlacer,
    FirstFitPlacer.name: FirstFitPlacer,
    BestFitPlacer.name: BestFitPlacer,
    TimeSharePlacer.name: TimeSharePlacer,
}
"""Named placers shared by the CLI, the simulator, the runtime and the experiments."""


def make_placer(name: str, *, max_gpus: int, defrag: bool | None = None, **kw: Any) -> Placer:
    """Build the placer ``name`` for a cluster of ``max_gpus`` GPUs (``kw``: its options, e.g.
    ``repack_threshold`` for ``"mra"``). ``defrag=True`` with ``"mra"`` builds ``"mra-defrag"``
    (cross-GPU defragmentation; ``kw`` may then hold ``sparse_pct`` / ``margin_pct``); other
    placers have no ``defrag`` option. Raises ``UnknownPlacer`` listing the known names."""
    try:
        factory = PLACERS[name]
    except KeyError:
        raise UnknownPlacer(
            f"unknown placer {name!r} (known: {', '.join(sorted(PLACERS))})"
        ) from None
    if defrag is not None:
        if factory not in (MaxRectsPlacer, DefragMaxRectsPlacer):
            raise ValueError(f"defrag is an option of the 'mra' placer only, not of {name!r}")
        if factory is DefragMaxRectsPlacer and not defrag:
            raise ValueError(f"placer {name!r} always defragments: drop defrag=False or use 'mra'")
        factory = DefragMaxRectsPlacer if defrag else MaxRectsPlacer
    return factory(max_gpus, **kw)
