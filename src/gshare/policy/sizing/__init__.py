"""Resource-centric sizing (BulkX appendix §2.3): how much memory a component starts
with (``init``) and by how much it grows (``step``), chosen from the history of its demands.

Who calls it: the live controller re-solves a ``mem_mb: auto`` function from the peaks its
instances measured (``runtime.control.memory``); the simulator sizes every Azure app on a
training prefix and per window (``sim.sizing``, experiment ``bulkx-sizing``). At run time a
component grows by ``step`` when an input needs more and returns to ``init`` when idle: that
rule is ``policy.memory.grow_limit`` / ``idle_limit``, which both worlds call (the cover rule
below is the same there).

The appendix's integer program, for one component with history ``H`` (demand ``h``, execution
time ``t_h``)::

    min_{init, step}  init + Σ_h step · k_h · cost_factor
    s.t.              k_h · step + init > h                       for every h in H
                      Σ_h max(init − h, 0) · t_h / Σ_h h < Thres

What gshare solves, and every reading of the formulation (docs/journal/sizing.md has the
arguments and examples):

1. **Integers and granularity.** ``init``, ``step`` and the ``k_h`` are integers in units of
   ``granularity_mb`` (default 1 MB): ``init = I·g``, ``step = S·g``, ``I >= 0``, ``S >= 1``,
   ``k_h >= 0``. A demand needs ``D_h = ceil(h / g)`` units (``UNIT_EPS`` absorbs float noise).
2. **Cover, ``>`` read as ``>=``.** ``I + k_h·S >= D_h``: an allocation equal to the demand
   covers it. A process is killed when its usage *exceeds* its limit, the run-time rule
   ``policy.memory.grow_limit`` covers with ``>=``, and with real-valued demands the two differ
   only on a set of measure zero; with ``>`` a demand of exactly 512 MB would need 513, and an
   app whose every demand is 77 MB could never be sized without waste. ``k_h`` is then the
   fewest steps, ``ceil((D_h − I)/S)`` for ``D_h > I``, else 0 (``Sizing.expected_steps`` is
   their mean) — the same count ``grow_limit`` takes at run time.
3. **Waste, ``<`` read as ``<=``, exec times relative to their mean.** ``waste(I) = Σ_h max(I·g −
   h, 0) · (t_h / t̄) / Σ_h h <= waste_threshold``, ``t̄`` the history's mean exec time. The
   appendix divides MB·s by MB, so its ratio is in seconds and one threshold could not serve
   apps of 10 ms and of 10 min; dividing every ``t_h`` by ``t̄`` makes it dimensionless (for
   equal times it is the over-allocated share of the demanded memory) and leaves the
   appendix's ratio unchanged up to the factor ``t̄``. ``<=`` because an LP cannot state a
   strict bound and a threshold exactly at a waste value is measure zero (``WASTE_TOL``). All
   exec times 0: the waste is 0. ``waste_threshold`` 0: ``init`` may not exceed any demand.
   Only ``init`` is charged, as in the appendix: the overshoot of the last step is not.
4. **``cost_factor`` multiplies ``step·k_h``**, the memory added by scaling, summed over the
   history, while ``init`` counts once, exactly as written. Two consequences, both kept:
   (a) over a long history every MB of ``init`` saves ``cost_factor`` MB per demand above it,
   so ``init`` goes up to what the waste threshold allows (the threshold, not the cost factor,
   sets ``init`` once ``cost_factor · #{h > init} >= 1``); (b) ``S·ceil(R/S) >= R`` with
   equality at ``S = 1``, so **the literal objective always takes the smallest step** (one
   granularity unit, or the largest ``S`` dividing every ``D_h − I`` on a tie): scaling events
   cost nothing in it. ``step_cost_mb`` (default 0 = the appendix) adds gshare's reading of
   "a factor that models the scaling cost": a fixed price per scale-up, so the objective is
   ``init + Σ_h k_h · (cost_factor · step + step_cost_mb)``, which trades step size against the
   number of steps.
5. **Ties**: the fewest total steps, then the smaller ``init``, then the smaller ``step``
   (objectives within ``TIE_REL`` are equal). With nothing above ``init`` the step is free and
   the smallest (one unit) is returned.
6. **Bounds**: ``init <= max D_h`` (more only adds cost); ``step <= max D_h − init`` (a larger
   step takes the same one step per demand). **Empty history**: ``SizingError`` — the caller
   keeps its default until something was measured. **One demand** ``h``, no special case: with
   ``cost_factor >= 1`` (and ``step_cost_mb >= 0``) a step costs at least the init it saves,
   so ``init = D_h`` and no step when the threshold allows it (``waste = (D_h·g − h)/h``);
   with ``cost_factor < 1`` ``init = 0`` and one step of ``D_h`` is cheaper (unless
   ``step_cost_mb`` tips it back).
   A demand of 0 needs nothing. Negative or non-finite numbers: ``SizingError``.

Two solvers, one answer: ``solve_sizing`` (``exact``: enumeration with exact bounds exploiting
the two integers and the sorted history — the NOTE in ``exact`` and the journal) and
``solve_sizing_milp`` (``milp``: the program above linearised for HiGHS, the reference). Both
score their ``(init, step)`` with ``Problem.sizing``. A history is a sequence of ``Demand`` or,
for ``solve_sizing``, the same as two columns (``History``): at 10,000 demands reading one
Python object per demand costs more than the solve.

Pure: numpy only at import; scipy.optimize is imported inside ``solve_sizing_milp``.
"""

from gshare.policy.sizing.exact import solve_sizing
from gshare.policy.sizing.milp import MilpNotSolved, solve_sizing_milp
from gshare.policy.sizing.problem import (
    TIE_REL,
    UNIT_EPS,
    WASTE_TOL,
    Demand,
    History,
    Problem,
    Sizing,
    SizingError,
)

__all__ = [
    "TIE_REL",
    "UNIT_EPS",
    "WASTE_TOL",
    "Demand",
    "History",
    "MilpNotSolved",
    "Problem",
    "Sizing",
    "SizingError",
    "solve_sizing",
    "solve_sizing_milp",
]
