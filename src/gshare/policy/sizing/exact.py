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
    History,
    IntArray,
    Problem,
    Sizing,
)

Cand = tuple[float, int, int, int]
"""(objective MB, total steps, init units, step units)."""


def solve_sizing(
    history: Sequence[Demand] | History,
    cost_factor: float,
    waste_threshold: float,
    *,
    granularity_mb: float = 1.0,
    step_cost_mb: float = 0.0,
) -> Sizing:
    """The optimal ``(init, step)`` for ``history`` (package doc: the formulation and every
    interpretation): a sequence of ``Demand`` or the same as ``History`` columns (faster at
    10,000 demands). ``SizingError`` on an empty history or a bad number."""
    p = Problem.build(history, cost_factor, waste_threshold, granularity_mb, step_cost_mb)
    best = _solve(p)
    return p.sizing(best[2], best[3])


# NOTE: BulkX appendix §2.3 (the integer program), solved by enumeration with exact bounds; the
# argument is in docs/journal/sizing.md. (1) At init I the total steps of every step S at once:
# Σ_h ceil(R_h/S) = Σ_{m>=0} #{D_h >= I+1+mS}, a harmonic sum. (2) When cost_factor ·
# N(init_max) >= 1, raising init by a whole step never hurts (every k_h drops by one), so step S
# only needs inits in (init_max − S, init_max]; there the total steps are at least those at
# init_max, so lo(S) + (c·S + p)·T(init_max, S) bounds the window from below and only the steps
# whose bound does not pass the incumbent are opened; the windows stop where the weaker bound
# lo(S) + (c·S + p)·N(init_max), which grows with S, passes it. (3) Otherwise inits are scanned
# in order of the relaxation bound I + c·Σ(D_h − I)+ + p·N(I) until it passes the incumbent.
def _solve(p: Problem) -> Cand:
    top = p.init_max
    if top == 0:
        return _best_step_at(p, 0)
    n_star = int(p.at_least[top + 1])
    if n_star == 0:
        return _scan_inits(p, (top * p.granularity_mb, 0, top, 1))
    totals = _totals_at(p, top)
    best = _pick_steps(p, top, totals)
    if p.cost_factor * n_star >= 1.0:
        return _scan_windows(p, best, n_star, totals)
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
    if tied.shape[0] == 1:
        i = int(tied[0])
    else:
        order = np.lexsort((step_units[tied], inits[tied], steps[tied]))
        i = int(tied[order[0]])
    return (float(f[i]), int(steps[i]), int(inits[i]), int(step_units[i]))


def _totals_at(p: Problem, init: int) -> IntArray:
    """``T(init, S) = Σ_h ceil((D_h − init)+ / S)`` for every step ``S = 1..d_max − init``
    (index ``S − 1``), by the harmonic sum of the NOTE; ``init < d_max``."""
    r_max = p.d_max - init
    total = np.full(r_max, int(p.at_least[init + 1]), dtype=np.int64)
    x = r_max - 1  # Σ floor((R_h − 1)/S) needs m·S <= R_h − 1 <= x
    if x >= 1:
        s = np.arange(1, x + 1, dtype=np.int64)
        per_s = x // s  # multiples m = 1..x//S of each S <= x
        s_rep = np.repeat(s, per_s)
        # m·S within each S's run: a running sum of S that restarts at every run
        run_end = np.cumsum(per_s * s)
        ms = np.cumsum(s_rep) - np.repeat(run_end - per_s * s, per_s)
        hits = p.at_least[init + 1 + ms]
        total[:x] += np.bincount(s_rep - 1, weights=hits, minlength=x).astype(np.int64)
    return total


def _pick_steps(p: Problem, init: int, totals: IntArray) -> Cand:
    """The best step at ``init`` among ``S = 1..len(totals)``, given their total steps."""
    g = p.granularity_mb
    s = np.arange(1, totals.shape[0] + 1, dtype=np.int64)
    f = np.asarray(init * g + (p.cost_factor * g * s + p.step_cost_mb) * totals, dtype=np.float64)
    return _pick(f, totals, np.full(s.shape[0], init, dtype=np.int64), s)


def _best_step_at(p: Problem, init: int) -> Cand:
    """The best step for a fixed init, over every step 1..d_max − init (a larger step only
    adds cost: every demand already takes one step)."""
    if int(p.at_least[init + 1]) == 0:
        return (init * p.granularity_mb, 0, init, 1)
    return _pick_steps(p, init, _totals_at(p, init))


def _scan_windows(p: Problem, best: Cand, n_star: int, totals_top: IntArray) -> Cand:
    """Case (2) of the NOTE: for each step S >= 2, the inits max(0, init_max − S + 1)..init_max
    − 1 (init_max itself is in ``best`` already), opened only where the window's lower bound
    does not pass the incumbent. The steps are taken in increasing order and an incumbent is
    replaced only by a ``_better`` candidate, exactly as if every window were opened: a skipped
    window's candidates all lie above the incumbent by more than ``TIE_REL``."""
    g, c, pc = p.granularity_mb, p.cost_factor, p.step_cost_mb
    top = p.init_max
    s = np.arange(2, p.d_max + 1, dtype=np.int64)
    lo = np.maximum(top - s + 1, 0)
    t_top = np.full(s.shape[0], n_star, dtype=np.int64)  # T(init_max, S); N* past d_max − top
    t_top[: totals_top.shape[0] - 1] = totals_top[1:]
    weak = lo * g + (c * g * s + pc) * n_star
    strong = lo * g + (c * g * s + pc) * t_top
    first = 0
    while first < s.shape[0]:
        limit = best[0] + TIE_REL * max(1.0, abs(best[0]))
        past = np.flatnonzero(weak[first:] > limit)  # the scan stops at the first of these
        stop = first + int(past[0]) if past.shape[0] else s.shape[0]
        open_ = np.flatnonzero(strong[first:stop] <= limit)
        replaced = False
        for j in open_ + first:
            cand = _window(p, int(s[j]), int(lo[j]))
            if _better(cand, best):
                best = cand
                first = int(j) + 1
                replaced = True
                break  # a new incumbent: recompute the bounds' verdicts past this step
        if not replaced:
            break
    return best


def _window(p: Problem, step: int, lo: int) -> Cand:
    """The best init in ``lo..init_max − 1`` for ``step``: ``T(I, S) = Σ_{m>=0}
    at_least[I + 1 + m·S]`` for all of them at once, the column sums of ``at_least[lo + 1:]``
    laid out in rows of ``S`` (column ``j`` holds init ``lo + j``)."""
    g, c, pc = p.granularity_mb, p.cost_factor, p.step_cost_mb
    top = p.init_max
    seg = p.at_least[lo + 1 :]
    rows = -(-seg.shape[0] // step)
    padded = np.zeros(rows * step, dtype=np.int64)
    padded[: seg.shape[0]] = seg
    totals = padded.reshape(rows, step).sum(axis=0)[: top - lo]
    inits = np.arange(lo, top, dtype=np.int64)
    f = np.asarray(inits * g + (c * g * step + pc) * totals, dtype=np.float64)
    return _pick(f, totals, inits, np.full(inits.shape[0], step, dtype=np.int64))


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
