"""policy.placement: gshare's cross-GPU extensions of MRA — ``"mra-defrag"``'s drains and
``"mra-room"``'s room-making at arrival under its migration budget. Table-driven cases carry
their arithmetic in comments (notation as in ``test_placement.py``: a rectangle is
(x, y)-(x2, y2), x = time %, y = SM %; a request is "w x h" = quota % x SM %); the invariants
under random sequences are checked with every placer in ``test_placement.py``.
"""

from __future__ import annotations

import pytest

from gshare.policy.placement import (
    Binding,
    DefragMaxRectsPlacer,
    Move,
    Placer,
    RoomDefragPlacer,
    make_placer,
)
from gshare.resources import FULL_GPU, Rect


def R(x1: float, y1: float, x2: float, y2: float) -> Rect:
    """A Rect from corners, to keep the tables readable."""
    return Rect(x1, y1, x2 - x1, y2 - y1)


# -- cross-GPU defragmentation ("mra-defrag", gshare's extension) ---------------------------------


def _one_small_left(name: str, **kw: object) -> Placer:
    # a = 60 x 100 -> GPU 0 (0,0); a2 = 40 x 100 fills GPU 0's (60,0)-(100,100) exactly.
    # b = 50 x 100 fits no GPU in use -> GPU 1 (0,0); s = 30 x 30 -> GPU 1's only free
    # rectangle (50,0)-(100,100) -> (50,0)-(80,30).
    # a2 leaves: GPU 0 holds 6,000 (60 %, not sparse), GPU 1 5,000 + 900 = 5,900 (59 %, not
    # sparse); Σ area 11,900 -> bound ⌈1.19⌉ = 2 = GPUs used: nothing to gain, nothing moves.
    # b leaves: GPU 1 holds s alone, 900 = 9 % < 50 % -> sparse; Σ area 6,900 -> bound 1, and
    # 2 GPUs > 1 x (1 + 5 %) -> drain GPU 1 (what "mra-defrag" does; "mra" never moves).
    p = make_placer(name, max_gpus=2, **kw)
    assert p.place("a", 60, 100).gpu == 0
    assert p.place("a2", 40, 100) == Binding("a2", 0, R(60, 0, 100, 100))
    assert p.place("b", 50, 100).gpu == 1
    assert p.place("s", 30, 30) == Binding("s", 1, R(50, 0, 80, 30))
    p.release("a2")
    assert p.take_moves() == []
    p.release("b")
    return p


@pytest.mark.parametrize(
    ("name", "kw", "drained"),
    [
        # the paper's MRA: GPU 1 stays open for s until s leaves
        ("mra", {}, False),
        ("mra-defrag", {}, True),
        ("mra", {"defrag": True}, True),
        # sparse means allocated area < sparse_pct % of 10,000: 900 < 1,000 (10 %) drains,
        # 900 < 900 (9 %) does not
        ("mra-defrag", {"sparse_pct": 10}, True),
        ("mra-defrag", {"sparse_pct": 9}, False),
        # margin: 2 GPUs used > bound 1 x (1 + 99 %) = 1.99 drains; > 1 x (1 + 100 %) = 2 not
        ("mra-defrag", {"margin_pct": 99}, True),
        ("mra-defrag", {"margin_pct": 100}, False),
        # "mra-room" drains as "mra-defrag" does (900 < 4,700: sparse) within its budget:
        # migrations <= rate x releases (2 here) + burst; the drain moves 1 instance
        ("mra-room", {}, True),
        ("mra-room", {"max_migrations_per_release": 0.5, "migration_burst": 0}, True),  # 1.0
        ("mra-room", {"max_migrations_per_release": 0.4, "migration_burst": 0}, False),  # 0.8
        ("mra-room", {"max_migrations_per_release": 0, "migration_burst": 0.9}, False),
        ("mra-room", {"max_migrations_per_release": None, "migration_burst": 0}, True),
    ],
)
def test_defrag_empties_a_gpu_left_with_one_small_instance(
    name: str, kw: dict[str, object], drained: bool
) -> None:
    p = _one_small_left(name, **kw)
    if not drained:
        assert p.take_moves() == []
        assert p.gpus_used() == 2 and p.binding("s") == Binding("s", 1, R(50, 0, 80, 30))
        return
    # s = 30 x 30 goes by MRA's best-area fit to the only other GPU in use: GPU 0's free
    # (60,0)-(100,100) (area 4,000), bottom-left -> (60,0)-(90,30); GPU 1 is empty again
    moves = p.take_moves()
    assert moves == [Move("s", 0, R(50, 0, 80, 30), R(60, 0, 90, 30), old_gpu=1)]
    assert moves[0].is_cross_gpu and (moves[0].old_gpu, moves[0].new_gpu) == (1, 0)
    assert p.gpus_used() == 1
    assert p.binding("s") == Binding("s", 0, R(60, 0, 90, 30))
    assert p.instances_on(1) == {} and p.free_rects(1) == [FULL_GPU]
    # GPU 0's free space after s: right of s (90,0)-(100,100), above s (60,30)-(100,100)
    assert p.free_rects(0) == [R(90, 0, 100, 100), R(60, 30, 100, 100)]
    assert isinstance(p, DefragMaxRectsPlacer)
    assert (p.drains, p.migrations, p.area_bound()) == (1, 1, 1)
    # the emptied GPU is the lowest unused one: the next GPU opened
    assert p.place("big", 100, 100).gpu == 1


def test_defrag_is_all_or_nothing() -> None:
    # as in _one_small_left, but GPU 1 also holds t = 45 x 40: after s at (50,0)-(80,30),
    # GPU 1's free rectangles are (80,0)-(100,100) (20 wide) and (50,30)-(100,100) (50 x 70)
    # -> t at (50,30)-(95,70).
    p = make_placer("mra-defrag", max_gpus=2)
    p.place("a", 60, 100)
    p.place("a2", 40, 100)
    p.place("b", 50, 100)
    assert p.place("s", 30, 30) == Binding("s", 1, R(50, 0, 80, 30))
    assert p.place("t", 45, 40) == Binding("t", 1, R(50, 30, 95, 70))
    p.release("a2")  # GPU 0 free (60,0)-(100,100), 40 wide; 60 % and 77 % loaded: no drain
    # b leaves: GPU 1 holds 900 + 1,800 = 2,700 (27 %, sparse); Σ 8,700 -> bound 1 < 2 used.
    # Largest first: t = 45 x 40 fits no other GPU (GPU 0's only free rectangle is 40 wide),
    # so nothing moves — not even s, which alone would fit.
    p.release("b")
    assert p.take_moves() == []
    assert p.gpus_used() == 2
    assert p.instances_on(1) == {"s": R(50, 0, 80, 30), "t": R(50, 30, 95, 70)}
    assert isinstance(p, DefragMaxRectsPlacer) and (p.drains, p.drain_attempts) == (0, 1)
    # t leaves: GPU 1 holds s alone (9 %), which fits GPU 0's (60,0)-(100,100) -> drained
    p.release("t")
    assert p.take_moves() == [Move("s", 0, R(50, 0, 80, 30), R(60, 0, 90, 30), old_gpu=1)]
    assert p.gpus_used() == 1


def test_defragment_on_demand_drains_a_sparse_gpu_release_did_not_try() -> None:
    # GPU 0: a = 60 x 100 + a2 = 40 x 100 (full). GPU 1: B = 45 x 100 + x1 = 55 x 100 (full).
    # GPU 2: c = 40 x 100 at (0,0), s = 30 x 30 at (40,0): 4,900 (49 %).
    p = make_placer("mra-defrag", max_gpus=3)
    for iid, w, h in [("a", 60, 100), ("a2", 40, 100), ("B", 45, 100), ("x1", 55, 100)]:
        p.place(iid, w, h)
    assert p.place("c", 40, 100) == Binding("c", 2, R(0, 0, 40, 100))
    assert p.place("s", 30, 30) == Binding("s", 2, R(40, 0, 70, 30))
    # x1 leaves: GPU 1 holds B = 4,500 (45 %, sparse); Σ 19,400 -> bound 2 < 3 used; but B
    # (full height, 45 wide) fits neither full GPU 0 nor GPU 2 (free: 30 wide full height, or
    # 70 high) -> no move
    p.release("x1")
    # a2 leaves: GPU 0 = 60 %, not sparse; the least-loaded GPU is GPU 1 (4,500 < 4,900),
    # which still cannot move -> no move; GPU 2 is not tried (one candidate per rule)
    p.release("a2")
    assert p.take_moves() == []
    assert p.gpus_used() == 3
    assert isinstance(p, DefragMaxRectsPlacer)
    # defragment(): sparse GPUs least-loaded first: GPU 1 fails again, GPU 2 (49 %) drains.
    # Largest first: c = 40 x 100 -> GPU 0's (60,0)-(100,100) (area 4,000, exact) beats GPU
    # 1's (45,0)-(100,100) (5,500); then s = 30 x 30 -> GPU 1's (45,0)-(100,100) -> (45,0)
    assert p.defragment() == 1
    assert p.take_moves() == [
        Move("c", 0, R(0, 0, 40, 100), R(60, 0, 100, 100), old_gpu=2),
        Move("s", 1, R(40, 0, 70, 30), R(45, 0, 75, 30), old_gpu=2),
    ]
    assert p.gpus_used() == 2 and p.free_rects(2) == [FULL_GPU]
    # Σ 6,000 + 4,500 + 4,900 = 15,400 -> bound 2 = GPUs used: nothing more to do
    assert p.area_bound() == 2
    assert p.defragment(max_drains=5) == 0


# -- making room at arrival ("mra-room", gshare's extension) --------------------------------------


@pytest.mark.parametrize(
    ("name", "kw", "room"),
    [
        ("mra", {}, False),
        ("mra-defrag", {}, False),  # drains on release only: an arrival never moves anything
        ("mra-room", {}, True),
        ("mra-room", {"room_max_moves": 0}, False),
        ("mra-room", {"room_gpus": 0}, False),
        ("mra-room", {"room_tries": 0}, False),
        # budget: 0 releases so far, so only the burst allows moves (1 needed)
        ("mra-room", {"migration_burst": 1}, True),
        ("mra-room", {"migration_burst": 0.9}, False),
        ("mra-room", {"max_migrations_per_release": None, "migration_burst": 0}, True),
    ],
)
def test_room_moves_a_small_blocker_instead_of_opening_a_gpu(
    name: str, kw: dict[str, object], room: bool
) -> None:
    # a = 100 x 60 -> GPU 0 (0,0)-(100,60); s = 20 x 20 -> GPU 0 (0,60)-(20,80) (best area:
    # GPU 0's only free rectangle); b = 100 x 70 fits no GPU in use -> GPU 1 (0,0)-(100,70).
    # F = 100 x 35: GPU 0's free (20,60)-(100,100) is 80 wide, (0,80)-(100,100) 20 high; GPU
    # 1's (0,70)-(100,100) 30 high -> nothing fits, "mra" opens GPU 2.
    p = make_placer(name, max_gpus=3, **kw)
    p.place("a", 100, 60)
    assert p.place("s", 20, 20) == Binding("s", 0, R(0, 60, 20, 80))
    assert p.place("b", 100, 70).gpu == 1
    f = p.place("F", 100, 35)
    moves = p.take_moves()
    if not room:
        assert (f.gpu, moves, p.gpus_used()) == (2, [], 3)
        return
    # room: GPU 0 is the least-loaded GPU (6,400) with free area 3,600 >= 3,500 (GPU 1's
    # 3,000 is not). Spots x = 0 (the only one 100 wide); y in {0, 25, 60, 65}: y = 60 and
    # y = 65 are blocked by s alone (400) -> y = 60 first. s goes by best-area fit to GPU 1's
    # (0,70)-(100,100) -> (0,70)-(20,90); F takes (0,60)-(100,95); no GPU is opened.
    assert f == Binding("F", 0, R(0, 60, 100, 95))
    assert moves == [Move("s", 1, R(0, 60, 20, 80), R(0, 70, 20, 90), old_gpu=0)]
    assert p.gpus_used() == 2
    assert p.free_rects(0) == [R(0, 95, 100, 100)]
    assert p.free_rects(1) == [R(20, 70, 100, 100), R(0, 90, 100, 100)]
    assert isinstance(p, RoomDefragPlacer)
    assert (p.rooms, p.migrations, p.drains) == (1, 1, 0)


def test_room_never_moves_every_instance_of_a_gpu_nor_one_that_fits_nowhere() -> None:
    # GPU 0: a = 100 x 60 alone; F = 100 x 50 overlaps a wherever it goes: moving a (the GPU's
    # only instance) would just swap GPUs -> not a spot. GPU 1 opens.
    p = make_placer("mra-room", max_gpus=3)
    p.place("a", 100, 60)
    assert p.place("F", 100, 50).gpu == 1
    # GPU 0: a + t = 60 x 40 at (0,60); GPU 1: F + u = 90 x 50 at (0,50) (full). G = 100 x 40
    # fits nowhere; GPU 0's spot (0,60)-(100,100) is blocked by t alone, but t (60 x 40) fits
    # no other GPU in use (GPU 1 is full) -> nothing moves, GPU 2 opens.
    assert p.place("t", 60, 40) == Binding("t", 0, R(0, 60, 60, 100))
    assert p.place("u", 90, 50) == Binding("u", 1, R(0, 50, 90, 100))
    assert p.place("G", 100, 40).gpu == 2
    assert p.take_moves() == []
    assert isinstance(p, RoomDefragPlacer) and p.rooms == 0
