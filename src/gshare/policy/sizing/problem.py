"""The BulkX sizing problem of one resource component: inputs, answer, and how a candidate is
scored. Both solvers (``exact`` and ``milp``) build on this module, so they agree on every
convention by construction; the conventions themselves are listed in the package docstring
(``gshare.policy.sizing``) and in ``docs/journal/sizing.md``.

Pure: numpy only, no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

UNIT_EPS: Final[float] = 1e-9
"""A demand ``h`` needs ``D = ceil(h / granularity - UNIT_EPS)`` units: a demand that is a
multiple of the granularity up to float noise needs exactly that many units (the same 1e-9
slack as ``policy.memory.grow_limit``)."""
WASTE_TOL: Final[float] = 1e-9
"""``init`` is feasible when ``waste(init) <= waste_threshold + WASTE_TOL`` (absolute, on the
dimensionless waste ratio)."""
TIE_REL: Final[float] = 1e-9
"""Two objective values within ``TIE_REL * max(1, |f|)`` are a tie (then fewer total steps,
then the smaller init, then the smaller step wins)."""


class SizingError(ValueError):
    """A bad input (empty history, a negative or non-finite number); the message names it."""


@dataclass(frozen=True, slots=True)
class Demand:
    """One historical execution of a component: its peak demand and how long it ran."""

    demand_mb: float
    """Peak memory the execution needed, MB (>= 0)."""
    exec_time_s: float
    """How long it ran, s (>= 0); weighs its over-allocation in the waste ratio."""


@dataclass(frozen=True, slots=True)
class History:
    """A history as two columns (what the simulator and the benches hold already): one
    ``Demand`` per index. ``solve_sizing`` takes it or a sequence of ``Demand``; the columns
    skip building (and reading back) one Python object per execution, which at 10,000 demands
    costs more than solving."""

    demand_mb: FloatArray
    """Peak demands, MB (>= 0)."""
    exec_time_s: FloatArray
    """Execution times, s (>= 0), the same length."""

    def __len__(self) -> int:
        return int(np.shape(self.demand_mb)[0])

    @staticmethod
    def of(history: Sequence[Demand]) -> History:
        """The columns of a sequence of ``Demand``."""
        n = len(history)
        return History(
            np.fromiter((d.demand_mb for d in history), dtype=np.float64, count=n),
            np.fromiter((d.exec_time_s for d in history), dtype=np.float64, count=n),
        )


@dataclass(frozen=True, slots=True)
class Sizing:
    """The answer: start a component with ``init_mb`` and grow it by ``step_mb``.

    Invariants (tested): ``init_mb`` and ``step_mb`` are multiples of the granularity,
    ``step_mb >= granularity``, ``waste <= waste_threshold`` (+``WASTE_TOL``), and every demand
    of the history is covered by ``init_mb + k * step_mb`` with the ``k`` counted in
    ``expected_steps``."""

    init_mb: float
    """Initial allocation, MB."""
    step_mb: float
    """Increment of one scale-up, MB."""
    expected_steps: float
    """Mean over the history of ``k_h``, the fewest steps that cover demand ``h``."""
    waste: float
    """The appendix's waste ratio of ``init`` over the history (package doc: exec times are
    taken relative to the history's mean, so the ratio is dimensionless)."""
    objective_mb: float
    """The minimised objective ``init + Σ_h k_h · (cost_factor · step + step_cost_mb)``, MB."""
    total_steps: int
    """``Σ_h k_h`` (= ``expected_steps · history_len``, exact)."""
    history_len: int
    """Number of demands solved over."""
    max_demand_mb: float
    """The largest demand of the history, MB (a natural ``max`` for the run-time cap)."""

    @property
    def key(self) -> tuple[float, int, float, float]:
        """Order of preference among solutions: objective, total steps, init, step."""
        return (self.objective_mb, self.total_steps, self.init_mb, self.step_mb)


@dataclass(frozen=True)
class Problem:
    """A history in integer units of the granularity, with everything the solvers need.

    Built once by ``Problem.build``; read-only afterwards."""

    demand_mb: FloatArray
    """Demands as given (MB), in input order."""
    weight: FloatArray
    """``exec_time_s / mean exec_time_s`` (all 0 when every exec time is 0)."""
    units: IntArray
    """``D_h``: units each demand needs (``UNIT_EPS``)."""
    d_max: int
    """``max D_h``."""
    count: IntArray
    """``count[v]`` = number of demands with ``D_h == v``, ``v`` in ``0..d_max``."""
    at_least: IntArray
    """``at_least[v]`` = number of demands with ``D_h >= v``, ``v`` in ``0..d_max + 1``."""
    init_max: int
    """Largest init (units) whose waste is within the threshold (waste grows with init)."""
    cost_factor: float
    waste_threshold: float
    granularity_mb: float
    step_cost_mb: float

    @property
    def n(self) -> int:
        return int(self.units.shape[0])

    @staticmethod
    def build(
        history: Sequence[Demand] | History,
        cost_factor: float,
        waste_threshold: float,
        granularity_mb: float,
        step_cost_mb: float,
    ) -> Problem:
        """Validate the inputs and precompute the unit demands and ``init_max``."""
        if len(history) == 0:
            raise SizingError("history is empty: nothing to size from (keep the default)")
        _check("cost_factor", cost_factor, allow_zero=True)
        _check("waste_threshold", waste_threshold, allow_zero=True)
        _check("granularity_mb", granularity_mb, allow_zero=False)
        _check("step_cost_mb", step_cost_mb, allow_zero=True)
        cols = history if isinstance(history, History) else History.of(history)
        h = np.asarray(cols.demand_mb, dtype=np.float64)
        t = np.asarray(cols.exec_time_s, dtype=np.float64)
        if h.shape != t.shape or h.ndim != 1:
            raise SizingError("demand_mb and exec_time_s must be 1-D arrays of one length")
        # min >= 0 is False for a NaN, max < inf for an inf: two reductions check everything
        if not (h.min() >= 0 and h.max() < math.inf):
            raise SizingError("every demand_mb must be a finite number >= 0")
        if not (t.min() >= 0 and t.max() < math.inf):
            raise SizingError("every exec_time_s must be a finite number >= 0")
        mean_t = float(t.mean())
        w = t / mean_t if mean_t > 0 else np.zeros_like(t)
        units = _units(h, granularity_mb)
        d_max = int(units.max())
        count = np.bincount(units, minlength=d_max + 1).astype(np.int64, copy=False)
        at_least = np.zeros(d_max + 2, dtype=np.int64)
        at_least[: d_max + 1] = np.cumsum(count[::-1])[::-1]
        wastes = waste_curve(h, w, granularity_mb, d_max, units=units)
        feasible = wastes <= waste_threshold + WASTE_TOL
        # waste(0) = 0 always; waste is non-decreasing in init: the feasible inits are 0..k
        init_max = d_max if bool(feasible.all()) else int(np.argmin(feasible)) - 1
        return Problem(
            demand_mb=h,
            weight=w,
            units=units,
            d_max=d_max,
            count=count,
            at_least=at_least,
            init_max=init_max,
            cost_factor=float(cost_factor),
            waste_threshold=float(waste_threshold),
            granularity_mb=float(granularity_mb),
            step_cost_mb=float(step_cost_mb),
        )

    def waste(self, init: int) -> float:
        """The waste ratio of ``init`` units (package doc)."""
        return waste_of(self.demand_mb, self.weight, init * self.granularity_mb)

    def total_steps(self, init: int, step: int) -> int:
        """``Σ_h k_h``, ``k_h = ceil((D_h - init) / step)`` for ``D_h > init``, else 0: demand
        ``h`` takes the ``m``-th step (``m >= 0``) when ``D_h >= init + 1 + m·step``, so the sum
        is ``Σ_{m>=0} at_least[init + 1 + m·step]`` — ``O(d_max / step)``, not ``O(n)``."""
        return int(self.at_least[init + 1 :: step].sum())

    def objective(self, init: int, total_steps: int, step: int) -> float:
        g = self.granularity_mb
        return init * g + (self.cost_factor * step * g + self.step_cost_mb) * total_steps

    def sizing(self, init: int, step: int) -> Sizing:
        """The ``Sizing`` of a candidate ``(init, step)`` in units, scored exactly."""
        if not (init >= 0 and step >= 1):
            raise SizingError(f"bad candidate init={init} step={step} (units)")
        steps = self.total_steps(init, step)
        g = self.granularity_mb
        return Sizing(
            init_mb=init * g,
            step_mb=step * g,
            expected_steps=steps / self.n,
            waste=self.waste(init),
            objective_mb=self.objective(init, steps, step),
            total_steps=steps,
            history_len=self.n,
            max_demand_mb=float(self.demand_mb.max()),
        )


def waste_of(demand_mb: FloatArray, weight: FloatArray, init_mb: float) -> float:
    """``Σ_h max(init − h, 0) · w_h / Σ_h h`` (0 when the numerator is 0; inf when only the
    denominator is)."""
    num = float((np.maximum(init_mb - demand_mb, 0.0) * weight).sum())
    den = float(demand_mb.sum())
    if num <= 0.0:
        return 0.0
    return num / den if den > 0 else math.inf


def waste_curve(
    demand_mb: FloatArray,
    weight: FloatArray,
    unit_mb: float,
    d_max: int,
    *,
    units: IntArray | None = None,
) -> FloatArray:
    """``waste_of`` for every init ``0..d_max`` units at once, in ``O(n + d_max)``.

    ``units`` are the demands' ``D_h`` (``Problem.units``; computed when not given). The init
    ``v`` over-allocates the demands ``h < x_v = v·unit_mb``; demand ``h`` is below ``x_v``
    exactly for ``v >= b_h``, where ``b_h = D_h`` when ``h < x_{D_h}`` and ``D_h + 1`` otherwise
    (``UNIT_EPS`` puts ``h`` in ``(x_{D_h − 1}, x_{D_h + 1})``), so bucketing the weights by
    ``b_h`` and summing the buckets gives, for every ``v``, the same sets of demands as
    sorting them would — without the sort (the float sums may differ in the last ulp)."""
    if units is None:
        units = _units(demand_mb, unit_mb)
    first_above = units + (demand_mb >= units * unit_mb)  # b_h, in 1..d_max + 1
    cum_w = np.cumsum(np.bincount(first_above, weights=weight, minlength=d_max + 2))
    cum_hw = np.cumsum(np.bincount(first_above, weights=demand_mb * weight, minlength=d_max + 2))
    x = np.arange(d_max + 1, dtype=np.float64) * unit_mb
    num = np.maximum(x * cum_w[: d_max + 1] - cum_hw[: d_max + 1], 0.0)
    den = float(demand_mb.sum())
    out: FloatArray = num / den if den > 0 else np.where(num > 0, np.inf, 0.0)
    return out


def better(a: Sizing, b: Sizing | None) -> bool:
    """True when ``a`` is preferred to ``b`` (``Sizing.key`` with ``TIE_REL`` on the
    objective)."""
    if b is None:
        return True
    tol = TIE_REL * max(1.0, abs(b.objective_mb))
    if a.objective_mb < b.objective_mb - tol:
        return True
    if a.objective_mb > b.objective_mb + tol:
        return False
    return a.key[1:] < b.key[1:]


def _units(demand_mb: FloatArray, granularity_mb: float) -> IntArray:
    """``D_h = ceil(h / granularity − UNIT_EPS)``, at least 0 (``h / 1.0`` is ``h``: skipped)."""
    scaled = demand_mb if granularity_mb == 1.0 else demand_mb / granularity_mb
    out: IntArray = np.maximum(np.ceil(scaled - UNIT_EPS), 0).astype(np.int64)
    return out


def _check(name: str, value: float, *, allow_zero: bool) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise SizingError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}")
