"""Aquatope's offline Bayesian optimisation of a static configuration per stage (ESG §4.2;
Zhou et al., ASPLOS 2023).

Why in ``gshare.experiments``: it uses scikit-learn's ``GaussianProcessRegressor``, which
imports ``threading`` (and joblib), and the policy layer must stay free of such imports
(docs/DESIGN.md §1); and it builds a policy, so it cannot sit in the data layer
(``gshare.workflows``) that the policies import (``tests/test_layers.py``). The split:

* this module runs the optimisation (``optimise_static_plans``) and builds the policy
  (``make_aquatope``, or ``bo_optimiser(perf)`` as the ``optimiser=`` of
  ``BASELINES["aquatope"]``);
* ``gshare.policy.workflow.baselines.aquatope.AquatopePolicy`` only serves the plans.

Who calls it: the simulator's experiment set-up, once per run before the workload starts
(``AquatopePolicy.prepare`` calls the optimiser it was given), and the tests. It is seeded:
the same seed gives the same plans.

NOTE (ESG §4.2 "Aquatope": "the application of interest is profiled in many sample executions
based on Bayesian Optimization (BO), through which it builds up a performance model and learns
about the statistically good configurations for every stage in the application (encoded in an
acquisition function) ... starts with 100 bootstrapping samples, iterates 50 rounds (we sample
five configurations in each round), and selects the best configuration").

* Search space: a static plan = one option per stage (the options the simulator uses, e.g.
  ``PerfModel.options``), all batches allowed (Aquatope knows no queue lengths).
* A sample execution of a plan (``StaticSpace.evaluate``): ``n_samples`` noisy runs drawn from the
  performance model (``PerfModel.exec_ms`` and its Gaussian noise ``mean * max(floor, 1 +
  sigma * N(0, 1))``, ESG §4) with the application's seeded ``numpy`` generator; the
  end-to-end latency of a run is its longest source-to-sink path; the cost of a run is every
  stage's resource price x its sampled time / its batch. Observed: the mean cost per request,
  the empirical P95 latency and the fraction of runs within the SLO. A plan is *feasible* when
  its empirical P95 latency is within the SLO, i.e. it meets the SLO in >= 95 % of runs (the
  P95 goal Orion uses too; ``percentile`` changes it).
* Surrogates: two Gaussian processes over the plan's encoding (per stage: log2 of the batch,
  the vCPUs and the vGPUs, each scaled to [0, 1] over the stage's options) — one for
  log(cost), one for the constraint log(P95 / SLO) (<= 0 is feasible) — with a Matern-5/2 ARD kernel
  times a constant plus a white-noise kernel (Aquatope is uncertainty-aware: the samples are noisy),
  normalised targets, hyper-parameters fitted by maximum likelihood (warm-started, every
  ``hyper_every`` rounds and whenever the data has grown by half; refitted to the new data
  with the hyper-parameters kept in between).
* Acquisition: constrained expected improvement (Gardner et al., 2014), EI of the cost below
  the cheapest feasible plan seen x the probability that the constraint holds; before any
  feasible plan has been seen, the probability of feasibility alone. It is maximised over a
  pool of candidate plans (``pool_size`` uniform random plans plus ``n_local`` one-stage
  mutations of the best tenth of the plans seen; every plan when the space is no larger than
  that), never re-proposing a plan already sampled.
* Rounds: ``n_bootstrap`` (100) distinct uniform random plans, then ``n_rounds`` (50) rounds of
  ``batch_size`` (5) plans chosen by the "kriging believer" batch rule: take the acquisition's
  best, pretend its outcome is the surrogate's mean, refit (hyper-parameters kept) and take the
  next among the ``20 x batch_size`` candidates the first scoring ranked highest. 100 + 50 x 5
  = 350 sample executions per application (~10-25 s each of ESG's applications on the default
  448-configuration grid, on the development machine; BLAS is kept single-threaded).
* Result: the cheapest feasible plan sampled; if no plan was feasible, the one with the lowest
  P95 latency (closest to meeting the SLO).
``random_search`` spends the same number of sample executions on distinct uniform random plans
and picks the same way (the reference the tests compare BO with).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel
from threadpoolctl import threadpool_limits

from gshare.policy.workflow.baselines.aquatope import AquatopePolicy, StaticPlanOptimiser
from gshare.policy.workflow.baselines.common import source_to_sink_paths, stage_options
from gshare.policy.workflow.replan import WorkflowLike
from gshare.workflows.config import MS_PER_HOUR, ConfigOption, FunctionConfig
from gshare.workflows.perf import PerfModel

FloatArray = npt.NDArray[np.float64]
Workflows = Sequence[tuple[str, WorkflowLike]] | Mapping[str, WorkflowLike]


@dataclass(frozen=True, slots=True)
class BoParams:
    """Budget and knobs of the offline optimisation (module NOTE). Defaults are ESG's: 100
    bootstrap samples, 50 rounds of 5. Invariants (checked): counts >= 0 (``batch_size``,
    ``n_samples``, ``pool_size`` >= 1), ``0 < percentile < 100``."""

    n_bootstrap: int = 100
    n_rounds: int = 50
    batch_size: int = 5
    n_samples: int = 32
    """Noisy runs per sample execution of a plan."""
    percentile: float = 95.0
    """The latency percentile that must be within the SLO."""
    pool_size: int = 2000
    """Uniform random candidate plans scored by the acquisition every round."""
    n_local: int = 400
    """One-stage mutations of the best plans seen, added to the pool every round."""
    xi: float = 0.01
    """Expected-improvement margin, in log cost (0.01: improvements under ~1 % count less)."""
    gp_maxiter: int = 50
    """L-BFGS-B iterations of a hyper-parameter fit (warm-started from the previous one)."""
    hyper_every: int = 5
    """Re-fit the surrogates' hyper-parameters by maximum likelihood every this many rounds
    (and in the first, and whenever the data has grown by half since the last fit); in
    between the surrogates are refitted to the new data with the hyper-parameters kept (the
    fit dominates the run time: ~5x faster, same plan quality in our runs)."""

    def __post_init__(self) -> None:
        for name in ("n_bootstrap", "n_rounds", "n_local"):
            if getattr(self, name) < 0:
                raise ValueError(f"BoParams.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "n_samples", "pool_size", "gp_maxiter", "hyper_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"BoParams.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.percentile < 100.0:
            raise ValueError(f"BoParams.percentile must be in (0, 100), got {self.percentile}")

    @property
    def evaluations(self) -> int:
        """Sample executions per application: ``n_bootstrap + n_rounds * batch_size``."""
        return self.n_bootstrap + self.n_rounds * self.batch_size


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One sample execution of a static plan (module NOTE)."""

    plan: tuple[int, ...]
    """Option index per stage (in ``StaticSpace.stages`` order)."""
    configs: tuple[FunctionConfig, ...]
    cost_usd: float
    """Mean sampled cost per request."""
    p95_ms: float
    """Empirical ``percentile`` of the sampled end-to-end latency (named for the default)."""
    p_slo: float
    """Fraction of the sampled runs within the SLO."""
    feasible: bool
    """``p95_ms <= slo_ms``."""
    mean_cost_usd: float
    """Noise-free cost per request (sum of the stages' mean costs), for comparisons."""


@dataclass(frozen=True, slots=True)
class BoResult:
    """The outcome of optimising one application."""

    application: str
    method: Literal["bo", "random"]
    stages: tuple[str, ...]
    best: Evaluation
    evaluations: tuple[Evaluation, ...] = field(repr=False)
    """Every sample execution, in the order they ran."""

    @property
    def plan(self) -> dict[str, FunctionConfig]:
        """Stage -> its static configuration."""
        return dict(zip(self.stages, self.best.configs, strict=True))


class StaticSpace:
    """The static plans of one application and how a plan is sampled and encoded."""

    def __init__(
        self,
        workflow: WorkflowLike,
        options: Mapping[str, Sequence[ConfigOption]],
        perf: PerfModel,
    ) -> None:
        self.workflow = workflow
        self.stages = tuple(s.name for s in workflow.stages)
        self.functions = tuple(s.function for s in workflow.stages)
        self.options: tuple[tuple[ConfigOption, ...], ...] = tuple(
            tuple(stage_options(workflow, s, options)) for s in self.stages
        )
        for s, opts in zip(self.stages, self.options, strict=True):
            if not opts:
                raise ValueError(f"stage {s!r} of {workflow.name!r} has no option")
        self.sizes = tuple(len(o) for o in self.options)
        pos = {s: i for i, s in enumerate(self.stages)}
        self.paths = [[pos[s] for s in p] for p in source_to_sink_paths(workflow)]
        self.slo_ms = workflow.slo_ms
        self.sigma = perf.params.noise_sigma_frac
        self.floor = perf.params.noise_floor_frac
        self.mean_ms = tuple(
            np.array([perf.exec_ms(f, o.config) for o in opts], dtype=np.float64)
            for f, opts in zip(self.functions, self.options, strict=True)
        )
        self.usd_per_ms = tuple(
            np.array([o.config.usd_per_hour / MS_PER_HOUR / o.config.batch for o in opts])
            for opts in self.options
        )
        feats = []
        for opts in self.options:
            raw = np.array(
                [
                    [
                        math.log2(o.config.batch),
                        math.log2(o.config.vcpus),
                        math.log2(o.config.vgpus),
                    ]
                    for o in opts
                ],
                dtype=np.float64,
            )
            lo, hi = raw.min(axis=0), raw.max(axis=0)
            feats.append((raw - lo) / np.where(hi > lo, hi - lo, 1.0))
        self._features = tuple(feats)

    @property
    def size(self) -> int:
        """Number of static plans (the product of the stages' option counts)."""
        return math.prod(self.sizes)

    def encode(self, plans: Sequence[tuple[int, ...]]) -> FloatArray:
        """Plans -> feature matrix (per stage: log2 batch, vCPUs, vGPUs, scaled to [0, 1])."""
        idx = np.asarray(plans, dtype=np.int64).reshape(len(plans), len(self.stages))
        return np.hstack([self._features[k][idx[:, k]] for k in range(len(self.stages))])

    def random_plans(self, rng: np.random.Generator, n: int) -> list[tuple[int, ...]]:
        cols = [rng.integers(0, m, size=n) for m in self.sizes]
        return [tuple(int(c[i]) for c in cols) for i in range(n)]

    def evaluate(
        self, plan: tuple[int, ...], rng: np.random.Generator, n_samples: int, percentile: float
    ) -> Evaluation:
        """One sample execution: ``n_samples`` noisy runs of ``plan`` (module NOTE)."""
        k = len(self.stages)
        mean = np.array([self.mean_ms[j][plan[j]] for j in range(k)])
        z = rng.standard_normal((n_samples, k))
        t = mean[None, :] * np.maximum(self.floor, 1.0 + self.sigma * z)
        e2e = np.max(np.stack([t[:, p].sum(axis=1) for p in self.paths], axis=1), axis=1)
        rate = np.array([self.usd_per_ms[j][plan[j]] for j in range(k)])
        cost = float((t * rate[None, :]).sum(axis=1).mean())
        p95 = float(np.percentile(e2e, percentile))
        return Evaluation(
            plan=plan,
            configs=tuple(self.options[j][plan[j]].config for j in range(k)),
            cost_usd=cost,
            p95_ms=p95,
            p_slo=float(np.mean(e2e <= self.slo_ms)),
            feasible=p95 <= self.slo_ms,
            mean_cost_usd=float((mean * rate).sum()),
        )


def best_of(evals: Sequence[Evaluation]) -> Evaluation:
    """The cheapest feasible evaluation; if none is feasible, the lowest P95 latency."""
    ok = [e for e in evals if e.feasible]
    if ok:
        return min(ok, key=lambda e: (e.cost_usd, e.p95_ms, e.plan))
    return min(evals, key=lambda e: (e.p95_ms, e.cost_usd, e.plan))


def app_rng(seed: int, application: str) -> np.random.Generator:
    """The generator of one application: seeded by ``seed`` and the application's name, so
    adding an application does not change the others' plans."""
    return np.random.default_rng([seed, zlib.crc32(application.encode())])


# -- random search ------------------------------------------------------------------------------


def random_search(
    application: str,
    workflow: WorkflowLike,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    n_evaluations: int,
    params: BoParams | None = None,
) -> BoResult:
    """``n_evaluations`` sample executions of distinct uniform random plans (fewer if the
    space is smaller); the best as BO picks it. ``params`` gives ``n_samples`` and
    ``percentile``."""
    p = params or BoParams()
    space = StaticSpace(workflow, options, perf)
    rng = app_rng(seed, application)
    plans = _distinct_random(space, rng, min(n_evaluations, space.size), set())
    evals = tuple(space.evaluate(x, rng, p.n_samples, p.percentile) for x in plans)
    return BoResult(application, "random", space.stages, best_of(evals), evals)


def _distinct_random(
    space: StaticSpace, rng: np.random.Generator, n: int, seen: set[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    left = space.size - len(seen)
    n = min(n, left)
    if space.size <= 4 * (len(seen) + n):  # small space: draw from what is left, no retries
        rest = [x for x in _all_plans(space) if x not in seen]
        order = rng.permutation(len(rest))[:n]
        return [rest[int(i)] for i in order]
    while len(out) < n:
        for x in space.random_plans(rng, 2 * (n - len(out))):
            if x not in seen:
                seen.add(x)
                out.append(x)
                if len(out) == n:
                    break
    return out


def _all_plans(space: StaticSpace) -> list[tuple[int, ...]]:
    plans: list[tuple[int, ...]] = [()]
    for m in space.sizes:
        plans = [(*x, i) for x in plans for i in range(m)]
    return plans


# -- Bayesian optimisation ----------------------------------------------------------------------


def _gp(dim: int, seed: int, warm: Kernel | None, maxiter: int) -> GaussianProcessRegressor:
    """A surrogate: constant x Matern-5/2 (one length scale per feature) + white noise;
    hyper-parameters by L-BFGS-B from ``warm`` (last round's fit) when given."""
    kernel = (
        warm
        if warm is not None
        else ConstantKernel(1.0, (1e-3, 1e3))
        * Matern(length_scale=np.ones(dim), length_scale_bounds=(1e-2, 1e2), nu=2.5)
        + WhiteKernel(1e-3, (1e-8, 1.0))
    )

    def lbfgs(
        obj: Callable[..., Any], theta0: FloatArray, bounds: FloatArray
    ) -> tuple[FloatArray, float]:
        res = minimize(
            obj, theta0, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": maxiter}
        )
        return np.asarray(res.x, dtype=np.float64), float(res.fun)

    return GaussianProcessRegressor(
        kernel=kernel,
        normalize_y=True,
        optimizer=lbfgs,
        n_restarts_optimizer=0,
        random_state=seed,
    )


def _fit(gp: GaussianProcessRegressor, x: FloatArray, y: FloatArray) -> GaussianProcessRegressor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gp.fit(x, y)


def _refit_kernel(
    kernel: Kernel, seed: int, x: FloatArray, y: FloatArray
) -> GaussianProcessRegressor:
    """A surrogate with fixed hyper-parameters ``kernel`` fitted to ``(x, y)``."""
    fixed = GaussianProcessRegressor(
        kernel=kernel, normalize_y=True, optimizer=None, random_state=seed
    )
    return _fit(fixed, x, y)


def _refit_fixed(
    gp: GaussianProcessRegressor, x: FloatArray, y: FloatArray
) -> GaussianProcessRegressor:
    """The same surrogate on more data, hyper-parameters kept (kriging believer)."""
    return _refit_kernel(gp.kernel_, int(gp.random_state or 0), x, y)


def constrained_ei(
    mu_cost: FloatArray,
    sd_cost: FloatArray,
    mu_con: FloatArray,
    sd_con: FloatArray,
    best_cost: float | None,
    xi: float = 0.0,
) -> FloatArray:
    """Expected improvement of (log) cost below ``best_cost`` x P(constraint <= 0); the
    probability alone when ``best_cost`` is None (no feasible plan seen yet)."""
    sd_con = np.maximum(sd_con, 1e-12)
    pof = norm.cdf(-mu_con / sd_con)
    if best_cost is None:
        return np.asarray(pof, dtype=np.float64)
    sd = np.maximum(sd_cost, 1e-12)
    imp = best_cost - mu_cost - xi
    zz = imp / sd
    ei = imp * norm.cdf(zz) + sd * norm.pdf(zz)
    return np.asarray(np.maximum(ei, 0.0) * pof, dtype=np.float64)


def bayesian_optimise(
    application: str,
    workflow: WorkflowLike,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    params: BoParams | None = None,
) -> BoResult:
    """Aquatope's offline BO of one application (module NOTE). Deterministic for a seed.

    BLAS runs single-threaded inside (``threadpoolctl``): the matrices are small (at most a
    few hundred plans), and a multi-threaded OpenBLAS was two orders of magnitude slower on
    them on a shared 2-core machine."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _bayesian_optimise(application, workflow, options, perf, seed, params)


def _bayesian_optimise(
    application: str,
    workflow: WorkflowLike,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    params: BoParams | None,
) -> BoResult:
    p = params or BoParams()
    space = StaticSpace(workflow, options, perf)
    rng = app_rng(seed, application)
    gp_seed = int(rng.integers(0, 2**31 - 1))
    seen: set[tuple[int, ...]] = set()
    evals: list[Evaluation] = []

    def run(plans: Sequence[tuple[int, ...]]) -> None:
        for x in plans:
            seen.add(x)
            evals.append(space.evaluate(x, rng, p.n_samples, p.percentile))

    run(_distinct_random(space, rng, max(1, p.n_bootstrap), set(seen)))
    dim = 3 * len(space.stages)
    warm_cost: Kernel | None = None
    warm_con: Kernel | None = None
    fitted_on = 0
    for rnd in range(p.n_rounds):
        if len(seen) >= space.size:
            break
        x_train = space.encode([e.plan for e in evals])
        y_cost = np.log(np.array([max(e.cost_usd, 1e-300) for e in evals]))
        y_con = np.log(np.array([max(e.p95_ms, 1e-9) for e in evals]) / space.slo_ms)
        if (
            warm_cost is None
            or warm_con is None
            or rnd % p.hyper_every == 0
            or len(evals) >= 1.5 * fitted_on
        ):
            gp_cost = _fit(_gp(dim, gp_seed, warm_cost, p.gp_maxiter), x_train, y_cost)
            gp_con = _fit(_gp(dim, gp_seed, warm_con, p.gp_maxiter), x_train, y_con)
            warm_cost, warm_con = gp_cost.kernel_, gp_con.kernel_
            fitted_on = len(evals)
        else:
            gp_cost = _refit_kernel(warm_cost, gp_seed, x_train, y_cost)
            gp_con = _refit_kernel(warm_con, gp_seed, x_train, y_con)
        pool = _pool(space, rng, p, evals, seen)
        if not pool:
            break
        x_pool = space.encode(pool)
        feas = [math.log(e.cost_usd) for e in evals if e.feasible and e.cost_usd > 0]
        best_cost = min(feas) if feas else None
        chosen: list[tuple[int, ...]] = []
        xs, yc, yk = x_train, y_cost, y_con
        for b in range(min(p.batch_size, len(pool))):
            mc, sc = gp_cost.predict(x_pool, return_std=True)
            mk, sk = gp_con.predict(x_pool, return_std=True)
            acq = constrained_ei(mc, sc, mk, sk, best_cost, p.xi)
            order = np.argsort(-acq, kind="stable")
            i = int(order[0])
            chosen.append(pool[i])
            if b + 1 < p.batch_size:
                # kriging believer: the surrogate's mean as a fantasy outcome, refit with the
                # hyper-parameters kept, and re-score only the most promising candidates
                xs = np.vstack([xs, x_pool[i : i + 1]])
                yc = np.append(yc, mc[i])
                yk = np.append(yk, mk[i])
                gp_cost = _refit_fixed(gp_cost, xs, yc)
                gp_con = _refit_fixed(gp_con, xs, yk)
                keep = [int(j) for j in order[1 : 1 + 20 * p.batch_size]]
                pool = [pool[j] for j in keep]
                x_pool = x_pool[keep]
                if not pool:
                    break
        run(chosen)
    return BoResult(application, "bo", space.stages, best_of(evals), tuple(evals))


def _pool(
    space: StaticSpace,
    rng: np.random.Generator,
    p: BoParams,
    evals: Sequence[Evaluation],
    seen: set[tuple[int, ...]],
) -> list[tuple[int, ...]]:
    """Candidate plans for the acquisition: uniform random ones plus one-stage mutations of
    the best plans seen (cheapest feasible first, then lowest P95), none already sampled."""
    if space.size <= p.pool_size + p.n_local:
        return [x for x in _all_plans(space) if x not in seen]
    ranked = sorted(evals, key=lambda e: (not e.feasible, e.cost_usd if e.feasible else e.p95_ms))
    elite = [e.plan for e in ranked[: max(1, len(ranked) // 10)]]
    cand: dict[tuple[int, ...], None] = {}
    for x in space.random_plans(rng, p.pool_size):
        if x not in seen:
            cand[x] = None
    k = len(space.stages)
    for _ in range(p.n_local):
        base = list(elite[int(rng.integers(0, len(elite)))])
        j = int(rng.integers(0, k))
        base[j] = int(rng.integers(0, space.sizes[j]))
        x = tuple(base)
        if x not in seen:
            cand[x] = None
    return list(cand)


# -- the public entry points --------------------------------------------------------------------


def _pairs(workflows: Workflows) -> list[tuple[str, WorkflowLike]]:
    if isinstance(workflows, Mapping):
        return list(workflows.items())
    return list(workflows)


def _params(params: BoParams | None, overrides: Mapping[str, Any]) -> BoParams:
    base = params or BoParams()
    return replace(base, **overrides) if overrides else base


def optimise_applications(
    workflows: Workflows,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    params: BoParams | None = None,
    **overrides: Any,
) -> dict[str, BoResult]:
    """``bayesian_optimise`` for every application; ``overrides`` replace ``params`` fields
    (e.g. ``n_bootstrap=10, n_rounds=4`` in tests)."""
    p = _params(params, overrides)
    return {
        app: bayesian_optimise(app, wf, options, perf, seed, p) for app, wf in _pairs(workflows)
    }


def optimise_static_plans(
    workflows: Workflows,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    params: BoParams | None = None,
    **overrides: Any,
) -> dict[str, dict[str, FunctionConfig]]:
    """Application -> stage -> static configuration, by Aquatope's offline BO (module NOTE).
    ``workflows`` is ``[(application, spec), ...]`` (as ``WorkflowPolicy.prepare`` gets it) or
    a mapping; ``overrides`` replace ``BoParams`` fields."""
    results = optimise_applications(workflows, options, perf, seed, params, **overrides)
    return {app: r.plan for app, r in results.items()}


def bo_optimiser(
    perf: PerfModel, params: BoParams | None = None, **overrides: Any
) -> StaticPlanOptimiser:
    """The offline phase as the callable ``AquatopePolicy`` / ``BASELINES["aquatope"]`` take
    (``optimiser=``): ``(workflows, options, seed) -> plans``."""
    p = _params(params, overrides)

    def optimise(
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> dict[str, dict[str, FunctionConfig]]:
        return optimise_static_plans(workflows, options, perf, seed, p)

    return optimise


def make_aquatope(
    workflows: Workflows,
    options: Mapping[str, Sequence[ConfigOption]],
    perf: PerfModel,
    seed: int,
    params: BoParams | None = None,
    **overrides: Any,
) -> AquatopePolicy:
    """An ``AquatopePolicy`` whose static plans are already optimised for ``workflows`` (its
    ``prepare`` then only checks them; an application it has not seen is optimised there with
    the same parameters)."""
    p = _params(params, overrides)
    plans = optimise_static_plans(workflows, options, perf, seed, p)
    return AquatopePolicy(plans, optimiser=bo_optimiser(perf, p))


__all__ = [
    "BoParams",
    "BoResult",
    "Evaluation",
    "StaticSpace",
    "bayesian_optimise",
    "best_of",
    "bo_optimiser",
    "constrained_ei",
    "make_aquatope",
    "optimise_applications",
    "optimise_static_plans",
    "random_search",
]
