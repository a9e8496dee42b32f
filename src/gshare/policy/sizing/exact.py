"""The exact specialised solver of the BulkX sizing problem (``solve_sizing``).

Who calls it: the live controller (``runtime.control.memory``: a ``mem_mb: auto`` function is
re-solved from its measured peaks) and the simulator (``sim.sizing``: per app, on a training
prefix and per window). ``policy.sizing.milp`` solves the same problem as a MILP; the tests
check that both reach the same optimum on random instances.

What must hold: the answer minimises the objective over every integer ``(init, step)`` with
``init <= init_max`` (the waste bound), and among ties it has the fewest total steps, then the
smallest init, then the smallest step (``problem.better``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gshare.policy.sizing.problem import (
    TIE_REL,
    Demand,
    FloatArray,
    IntArray,
    Problem,
    Sizing,
)

Cand = tuple[float, int, int, int]
"""(objective MB, total steps, init units, step units)."""


def solve_sizing(
    history: Sequence[Demand],
    cost_factor: float,
    waste_threshold: float,
    *,
    granularity_mb: float = 1.0,
    step_cost_mb: float = 0.0,
) -> Sizing:
    """The optimal ``(init, step)`` for ``history`` (package doc: the formulation and every
    interpretation). ``SizingError`` on an empty history or a bad number."""
    p = Problem.build(history, cost_factor, waste_threshold, granularity_mb, step_cost_mb)
    best = _solve(p)
    return p.sizing(best[2], best[3])


# NOTE: BulkX appendix §2.3 (the integer program), solved by enumeration with exact bounds; the
# argument is in docs/journal/sizing.md. (1) At init I the best step is found for all steps at
# once: Σ_h ceil(R_h/S) = N + Σ_{m>=1} #{D_h >= I+1+mS}, a harmonic sum. (2) When
# cost_factor · N(init_max) >= 1, raising init by a whole step never hurts (every k_h drops by
# one), so step S only needs inits in (init_max − S, init_max]; steps are scanned upwards until
# the lower bound init + (c·S + p)·N(init_max) passes the incumbent. (3) Otherwise inits are
# scanned in order of the relaxation bound I + c·Σ(D_h − I)+ + p·N(I) until it passes it.
def _solve(p: Problem) -> Cand:
    best = _best_step_at(p, p.init_max)
    n_star = int(p.at_least[p.init_max + 1])
    if p.init_max == 0:
        return best
    if p.cost_factor * n_star >= 1.0:
        return _scan_windows(p, best, n_star)
    return _scan_inits(p, best)


def _better(a: Cand, b: Cand) -> bool:
    tol = TIE_REL * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol:
        return False
    return a[1:] < b[1:]


def _pick(f: FloatArray, steps: IntArray, inits: IntArray, step_units: IntArray) -> Cand:
    """The preferred candidate among arrays of equal length (objective with ``TIE_REL``, then
    steps, init, step)."""
    fmin = float(f.min())
    tied = np.flatnonzero(f <= fmin + TIE_REL * max(1.0, abs(fmin)))
    order = np.lexsort((step_units[tied], inits[tied], steps[tied]))
    i = int(tied[order[0]])
    return (float(f[i]), int(steps[i]), int(inits[i]), int(step_units[i]))


def _best_step_at(p: Problem, init: int) -> Cand:
    """The best step for a fixed init, over every step 1..d_max − init (a larger step only
    adds cost: every demand already takes one step)."""
    g = p.granularity_mb
    n_above = int(p.at_least[init + 1])
    if n_above == 0:
        return (init * g, 0, init, 1)
    r_max = p.d_max - init
    s = np.arange(1, r_max + 1, dtype=np.int64)
    total = np.full(r_max, n_above, dtype=np.int64)
    x = r_max - 1  # Σ floor((R_h − 1)/S) needs m·S <= R_h − 1 <= x
    if x >= 1:
        per_s = x // s[:x]  # multiples m = 1..x//S of each S <= x
        s_rep = np.repeat(s[:x], per_s)
        starts = np.cumsum(per_s) - per_s
        m = np.arange(s_rep.shape[0], dtype=np.int64) - np.repeat(starts, per_s) + 1
        hits = p.at_least[init + 1 + m * s_rep]
        total[:x] += np.bincount(s_rep - 1, weights=hits, minlength=x)[:x].astype(np.int64)
    f = np.asarray(init * g + (p.cost_factor * g * s + p.step_cost_mb) * total, dtype=np.float64)
    inits = np.full(r_max, init, dtype=np.int64)
    return _pick(f, total, inits, s)


def _scan_windows(p: Problem, best: Cand, n_star: int) -> Cand:
    """Case (2) of the NOTE: for each step S, the inits max(0, init_max − S + 1)..init_max − 1
    (init_max itself is in ``best`` already)."""
    g, c, pc = p.granularity_mb, p.cost_factor, p.step_cost_mb
    top = p.init_max
    above = p.count[top + 1 :]  # demands over init_max, by units above it (1, 2, ...)
    for s in range(2, p.d_max + 1):
        lo = max(0, top - s + 1)
        bound = lo * g + (c * g * s + pc) * n_star
        if bound > best[0] + TIE_REL * max(1.0, abs(best[0])):
            break  # the bound grows with S (c·N* >= 1): no larger step can win
        # total steps at init_max: demand at init_max + 1 + j takes j // S + 1 steps
        rows = -(-above.shape[0] // s)
        padded = np.zeros(rows * s, dtype=np.int64)
        padded[: above.shape[0]] = above
        at_top = int((padded.reshape(rows, s).sum(axis=1) * np.arange(1, rows + 1)).sum())
        # drops T(y) = #{D_h >= y, D_h ≡ y (mod S)} for y = lo+1..top (one residue class each)
        seg = p.count[lo + 1 :]
        rows2 = -(-seg.shape[0] // s)
        padded2 = np.zeros(rows2 * s, dtype=np.int64)
        padded2[: seg.shape[0]] = seg
        drops = padded2.reshape(rows2, s).sum(axis=0)[: top - lo]
        totals = at_top + np.cumsum(drops[::-1])[::-1]  # inits lo..top−1
        inits = np.arange(lo, top, dtype=np.int64)
        f = np.asarray(inits * g + (c * g * s + pc) * totals, dtype=np.float64)
        cand = _pick(f, totals, inits, np.full(inits.shape[0], s, dtype=np.int64))
        if _better(cand, best):
            best = cand
    return best


def _scan_inits(p: Problem, best: Cand) -> Cand:
    """Case (3) of the NOTE: every init below init_max, best relaxation bound first."""
    g, c, pc = p.granularity_mb, p.cost_factor, p.step_cost_mb
    inits = np.arange(0, p.init_max, dtype=np.int64)
    # Σ_h (D_h − I)+ = Σ_{v > I} at_least[v]
    excess = np.cumsum(p.at_least[::-1])[::-1]  # excess[v] = Σ_{u >= v} at_least[u]
    n_above = p.at_least[inits + 1]
    bound = inits * g + c * g * excess[inits + 1] + pc * n_above
    for i in np.argsort(bound, kind="stable"):
        tol = TIE_REL * max(1.0, abs(best[0]))
        if bound[i] > best[0] + tol:
            break
        if bound[i] >= best[0] - tol and int(n_above[i]) > best[1]:
            continue  # at best a tie in the objective, with more steps than the incumbent
        cand = _best_step_at(p, int(inits[i]))
        if _better(cand, best):
            best = cand
    return best
