"""The reference formulation of the BulkX sizing problem on a MILP solver
(``solve_sizing_milp``): HiGHS through ``scipy.optimize.milp``.

Who calls it: the tests (the exact solver must reach the same optimum on random instances) and
``bench/sizing.py`` (time of both solvers side by side). Production callers use
``solve_sizing``; this one is the check.

Why HiGHS and not OR-Tools (which BulkX used): scipy is already a pinned dependency, so the
reference needs no new native wheel (and no protobuf pin shared with Ray); HiGHS is an exact
branch-and-cut MILP solver, run here with a relative gap of 0 so that it proves optimality. The
price: a MILP solver takes no product of variables, so ``step · k_h`` is linearised below
(OR-Tools' CP-SAT would take the product as a constraint).

Formulation (units of the granularity, ``D_h``, ``w_h`` and the objective as in the package
doc), with ``B = bit_length(d_max)`` bits for the step::

    min   g·I + c·g·Σ_j m_j Σ_b 2^b u_jb + p·Σ_j m_j k_j
    s.t.  S = Σ_b 2^b s_b,  1 <= S <= max(1, d_max)       s_b binary
          I + Σ_b 2^b u_jb >= D_j                          (cover; u_jb = s_b · k_j)
          u_jb <= K_j s_b,  u_jb <= k_j,  u_jb >= k_j − K_j (1 − s_b),  0 <= u_jb <= K_j
          v_l >= g·I − h_l,  v_l >= 0
          Σ_l (w_l / Σ_h h) v_l <= threshold               (the waste bound)
          0 <= I <= d_max, 0 <= k_j <= K_j = D_j integers

Demands with the same ``D`` share one ``k_j`` weighted by their multiplicity ``m_j`` (they have
the same optimal ``k``, so this is exact), and demands with the same ``h`` share one ``v_l``
with their weights summed. A solution's ``(I, S)`` is re-scored exactly by
``Problem.sizing`` (minimal ``k_h``), so both solvers report the same numbers for the same
``(I, S)``.

Purity: scipy.optimize is imported inside the function (importing it pulls in threading and
sockets, which policy modules must not import); ``time_limit_s`` is an option handed to HiGHS,
no clock is read here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gshare.policy.sizing.problem import Demand, Problem, Sizing, SizingError


class MilpNotSolved(SizingError):
    """HiGHS stopped without proving an optimum (time limit, or a numerical failure)."""


def solve_sizing_milp(
    history: Sequence[Demand],
    cost_factor: float,
    waste_threshold: float,
    *,
    granularity_mb: float = 1.0,
    step_cost_mb: float = 0.0,
    time_limit_s: float | None = None,
) -> Sizing:
    """The same problem as ``solve_sizing``, as a MILP on HiGHS (module doc). Ties between
    optima may be broken differently; the objective is the same. ``MilpNotSolved`` when HiGHS
    does not prove an optimum within ``time_limit_s``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    p = Problem.build(history, cost_factor, waste_threshold, granularity_mb, step_cost_mb)
    g, c, pc = p.granularity_mb, p.cost_factor, p.step_cost_mb
    if p.d_max == 0:  # every demand is 0: init 0 and no step is optimal and feasible
        return p.sizing(0, 1)
    d_vals, d_mult = np.unique(p.units[p.units > 0], return_counts=True)
    h_vals, h_inv = np.unique(p.demand_mb, return_inverse=True)
    h_w = np.bincount(h_inv, weights=p.weight)
    nbits = int(p.d_max).bit_length()
    nj, nl = int(d_vals.shape[0]), int(h_vals.shape[0])
    # variable layout
    i_var = 0
    s0 = 1
    k0 = s0 + nbits
    u0 = k0 + nj
    v0 = u0 + nj * nbits
    nvar = v0 + nl
    pow2 = 2.0 ** np.arange(nbits)

    def u(j: int, b: int) -> int:
        return u0 + j * nbits + b

    cost = np.zeros(nvar)
    cost[i_var] = g
    cost[k0 : k0 + nj] = pc * d_mult
    cost[u0:v0] = (c * g * d_mult[:, None] * pow2[None, :]).ravel()

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(lb)
        hi.append(ub)

    row([(s0 + b, float(pow2[b])) for b in range(nbits)], 1.0, float(max(1, p.d_max)))
    for j in range(nj):
        big = float(d_vals[j])
        row([(i_var, 1.0)] + [(u(j, b), float(pow2[b])) for b in range(nbits)], big, np.inf)
        for b in range(nbits):
            row([(u(j, b), 1.0), (s0 + b, -big)], -np.inf, 0.0)
            row([(u(j, b), 1.0), (k0 + j, -1.0)], -np.inf, 0.0)
            row([(u(j, b), 1.0), (k0 + j, -1.0), (s0 + b, -big)], -big, np.inf)
    for ell in range(nl):
        row([(v0 + ell, 1.0), (i_var, -g)], -float(h_vals[ell]), np.inf)
    total_h = float(p.demand_mb.sum())
    if total_h > 0:
        row(
            [(v0 + ell, float(h_w[ell] / total_h)) for ell in range(nl)], -np.inf, p.waste_threshold
        )
    else:  # all demands 0 would have returned above
        raise SizingError("unreachable: a positive demand makes Σ h > 0")

    a = coo_array((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
    lower = np.zeros(nvar)
    upper = np.full(nvar, np.inf)
    upper[i_var] = p.d_max
    upper[s0:k0] = 1.0
    upper[k0 : k0 + nj] = d_vals
    upper[u0:v0] = np.repeat(d_vals.astype(np.float64), nbits)
    integrality = np.zeros(nvar)
    integrality[: k0 + nj] = 1  # I, the step's bits, the k_j
    options: dict[str, float | bool] = {"mip_rel_gap": 0.0, "presolve": True}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    res = milp(
        cost,
        constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
        integrality=integrality,
        bounds=Bounds(lower, upper),
        options=options,
    )
    if res.status != 0 or res.x is None:
        raise MilpNotSolved(f"HiGHS did not prove an optimum: {res.message}")
    init = round(float(res.x[i_var]))
    step = round(float(np.dot(pow2, np.round(res.x[s0:k0]))))
    return p.sizing(init, max(1, step))
