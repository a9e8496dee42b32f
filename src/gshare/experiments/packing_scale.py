"""``packing-scale``: FaST-GShare's placement (§3.4.2) at cluster scale.

Question: on 1,000 GPUs under a churn of instance arrivals and departures, how many GPUs does
each placer keep in use compared with the area lower bound, how long does one decision take,
and — for ``mra-defrag`` and ``mra-room``, which consolidate by moving instances across GPUs
— how many migrations does that cost?

Workload (one event list, shared by every placer, seeded by ``seed``):

* arrivals are a Poisson process (rate 1 per time unit), ``arrivals`` of them; each instance
  lives an exponential time with mean ``mean_population`` units, so the live population tends
  to ``mean_population`` (Little's law). Departures after the last arrival are not part of the
  run (the placers are then drained to check that every GPU comes back empty);
* each instance is a random function of the shipped V100 table — a model (uniform over the 69
  models), a batch (uniform over its measured batches) and an SLO factor ``f`` (uniform over
  ``slo_factors``). Its share is FaST-GShare's efficient config (§3.4.1, ``p_eff``): among the
  table's *measured* points with quota in [``min_quota_pct``, 100] (every measured SM value,
  5..100 % step 5; quotas 20..100 % step 10), the one with the highest RPR = throughput /
  (SM % x quota %) whose latency is within ``f`` x the model's latency on a whole GPU (ties:
  smaller area, then fewer SMs). Without the SLO, RPR always picks 5 % of the SMs; the SLO
  factors 1.1-2 give a realistic mix (mean ~25 % SMs x ~70 % quota, area ~1,700 of 10,000).
  The rectangle is quota % wide and SM % high.

Metrics, per placer:

* ``gpus_over_area_bound`` — GPUs in use ÷ ⌈Σ area of the live instances' *requested*
  rectangles / 10,000⌉, the bound no placer can beat. Sampled after every event (arrival or
  departure) once ``warmup_arrivals`` arrivals have happened (one mean lifetime: the population
  is then ~63 % of its limit and still growing to ~90 % at the end); the summary reports the
  mean over those samples, ``gpus_over_area_bound_max`` the maximum. Time sharing allocates
  100 % of the SMs, yet its bound uses the requested area too, so the ratios compare.
* ``pattern_bound_over_area_bound`` (summary) and ``gpus_over_pattern_bound`` (rows) — a
  tighter bound, ``width_pattern_bound``: at every SM level of a GPU the quotas of the instances
  crossing it sum to <= 100 %, so a quota-90 instance never shares its SM rows; relaxing SM
  shares to fractions gives a small LP over row patterns (multisets of quotas with sum <= 100).
  It is computed every ``pattern_bound_every`` events after warm-up on the live population (as
  if no arrival were rejected); a placer's ratio to it is reported only when it rejected none.
  It shows how much of the gap to the area bound no placement can close.
* ``decision_us_p50`` / ``_p99`` — wall-clock microseconds of each ``place()`` call (including
  rejected ones), measured here with ``time.perf_counter``: experiments are mechanisms.
* ``rejected`` — arrivals that no GPU of ``gpus`` could take (``NoCapacity``); a rejected
  instance never departs. Time sharing needs roughly Σ quota / 100 GPUs, about three times the
  area bound, so on 1,000 GPUs it rejects part of the population; its ratio then reflects only
  the instances it placed.
* ``repacks``, ``moves`` — MRA re-packs (free list over ``repack_threshold``) and every
  instance move reported by ``take_moves`` (within a GPU or across GPUs); time sharing's
  compactions.
* ``migrations_per_departure`` — cross-GPU moves (``Move.is_cross_gpu``: a replacement instance
  started on another GPU, the old one drained) ÷ departures, both counted over the whole run
  (not the final drain): the price of ``mra-defrag``'s and ``mra-room``'s consolidation; 0 for
  every other placer. ``migrations``, ``drains`` (GPUs emptied by defragmentation) and
  ``rooms`` (arrivals ``mra-room`` placed by moving blockers away) are in the rows.
* ``release_us_p50`` / ``_p99`` — wall-clock microseconds of each ``release()`` call: where
  ``mra-defrag`` plans and applies its drains (``mra-room`` makes room inside ``place()``, so
  its room-making counts in ``decision_us``).

Rows: one per placer (``mra-defrag`` is MRA plus gshare's cross-GPU defragmentation with
``defrag_sparse_pct`` / ``defrag_margin_pct``, see ``policy.placement``; ``mra-room`` adds
making room at arrival under a migration budget, with its own defaults), plus
``mra-no-merge`` (``mra_literal_row``): MRA whose keep-restructure only adds the freed
rectangle back, without joining it to its free neighbours. ``mra`` stays the paper-faithful
reference; the 1.10 target is checked for both ``mra`` and ``mra-defrag``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linprog

from gshare.experiments.registry import register
from gshare.experiments.results import ExperimentResult
from gshare.policy.placement import (
    DEFAULT_DEFRAG_MARGIN_PCT,
    DEFAULT_DEFRAG_SPARSE_PCT,
    DEFAULT_REPACK_THRESHOLD,
    PLACERS,
    DefragMaxRectsPlacer,
    MaxRectsPlacer,
    NoCapacity,
    RoomDefragPlacer,
    make_placer,
)
from gshare.profiles import ProfileTable
from gshare.stats import percentile

GPU_AREA = 10_000.0
"""A whole GPU: 100 % quota x 100 % SMs."""
TARGET_MRA_RATIO = 1.10
MRA_LITERAL = "mra-no-merge"
"""Ablation row: MRA with ``merge_on_release=False`` (keep-restructure exactly as the paper's
text: the freed rectangle is only added back), to show what the default merging buys."""

FULL_PARAMS: dict[str, Any] = {
    "gpus": 1000,
    "arrivals": 5000,
    "mean_population": 2000,
    "warmup_arrivals": 2000,
    "slo_factors": [1.1, 1.25, 1.5, 2.0],
    "min_quota_pct": 20,
    "placers": ["mra", "mra-defrag", "mra-room", "first-fit", "best-fit", "time-share"],
    "repack_threshold": DEFAULT_REPACK_THRESHOLD,
    "defrag_sparse_pct": DEFAULT_DEFRAG_SPARSE_PCT,
    "defrag_margin_pct": DEFAULT_DEFRAG_MARGIN_PCT,
    "mra_literal_row": True,
    "pattern_bound_every": 250,
}
QUICK_PARAMS: dict[str, Any] = {
    "gpus": 100,
    "arrivals": 500,
    "mean_population": 200,
    "warmup_arrivals": 200,
}


# -- workload ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Share:
    """One function's placement request, from the profile table."""

    model: str
    batch: int
    slo_factor: float
    sm_pct: float
    quota_pct: float

    @property
    def area(self) -> float:
        return self.sm_pct * self.quota_pct


def efficient_shares(
    table: ProfileTable, slo_factors: Sequence[float], min_quota_pct: float
) -> dict[tuple[str, int, float], Share]:
    """FaST's ``p_eff`` per (model, batch, SLO factor): the measured (SM %, quota %) with the
    highest RPR whose latency is within the factor x the whole-GPU latency (module doc)."""
    points: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    full: dict[tuple[str, int], float] = {}
    for r in table:
        key = (r.model, r.batch)
        if r.quota_pct >= min_quota_pct:
            points.setdefault(key, []).append((r.sm_pct, r.quota_pct, r.latency_ms))
        if r.sm_pct == 100.0 and r.quota_pct == 100.0:
            full[key] = r.latency_ms
    out: dict[tuple[str, int, float], Share] = {}
    for (model, batch), pts in sorted(points.items()):
        if (model, batch) not in full:
            continue
        for f in slo_factors:
            slo_ms = f * full[(model, batch)]
            ok = [(sm, q, lat) for sm, q, lat in pts if lat <= slo_ms]
            # highest RPR = batch*1000/lat / (sm*q); ties: smaller area, fewer SMs
            sm, q, _ = min(
                ok, key=lambda p: (-batch * 1000.0 / p[2] / (p[0] * p[1]), p[0] * p[1], p[0])
            )
            out[(model, batch, f)] = Share(model, batch, f, sm, q)
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    shares: list[Share]
    """Share of arrival i."""
    events: list[tuple[float, int, int]]
    """(time, kind, i) in time order; kind 0 = departure of i, 1 = arrival of i."""


ARRIVE, DEPART = 1, 0


def make_workload(
    table: ProfileTable,
    *,
    arrivals: int,
    mean_population: float,
    slo_factors: Sequence[float],
    min_quota_pct: float,
    seed: int,
) -> Workload:
    """Poisson arrivals (rate 1), exponential lifetimes (mean ``mean_population``), shares from
    ``efficient_shares``; seeded, so every placer sees the same events."""
    rng = np.random.default_rng(seed)
    configs = efficient_shares(table, slo_factors, min_quota_pct)
    models = sorted({m for m, _, _ in configs})
    batches = {m: sorted({b for mm, b, _ in configs if mm == m}) for m in models}
    t_arrive = np.cumsum(rng.exponential(1.0, arrivals))
    t_depart = t_arrive + rng.exponential(mean_population, arrivals)
    shares: list[Share] = []
    for _ in range(arrivals):
        m = models[int(rng.integers(len(models)))]
        b = batches[m][int(rng.integers(len(batches[m])))]
        f = slo_factors[int(rng.integers(len(slo_factors)))]
        shares.append(configs[(m, b, f)])
    end = float(t_arrive[-1]) if arrivals else 0.0
    events = [(float(t), ARRIVE, i) for i, t in enumerate(t_arrive)]
    events += [(float(t), DEPART, i) for i, t in enumerate(t_depart) if t <= end]
    events.sort()
    return Workload(shares, events)


def width_pattern_bound(sizes: Sequence[tuple[float, float]]) -> int:
    """GPUs that any placement of ``sizes`` ((quota %, SM %) each) needs at least: the row
    relaxation of the module doc. Row patterns are the maximal multisets of the distinct quotas
    with sum <= 100 %; the LP covers every quota's total SM % with pattern rows at least cost
    (rows / 100 = GPUs); the result is its ceiling (never below the area bound's ⌈Σ area⌉)."""
    if not sizes:
        return 0
    need: dict[float, float] = {}
    for w, h in sizes:
        need[w] = need.get(w, 0.0) + h
    widths = sorted(need)
    patterns: list[list[int]] = []

    def extend(j: int, room: float, counts: list[int]) -> None:
        if j == len(widths):
            if room < widths[0] - 1e-9:  # maximal: not even the narrowest quota fits
                patterns.append(list(counts))
            return
        for n in range(int((room + 1e-9) // widths[j]), -1, -1):
            counts.append(n)
            extend(j + 1, room - n * widths[j], counts)
            counts.pop()

    extend(0, GPU_AREA / 100.0, [])
    a_ub = -np.asarray(patterns, dtype=float).T  # rows: quotas, columns: patterns
    res = linprog(
        np.ones(len(patterns)),
        A_ub=a_ub,
        b_ub=-np.asarray([need[w] for w in widths]),
        bounds=(0, None),
        method="highs",
    )
    area = math.ceil(sum(w * h for w, h in sizes) / GPU_AREA - 1e-9)
    if not res.success:
        return max(1, area)
    return max(1, area, math.ceil(float(res.fun) / 100.0 - 1e-6))


# -- one placer ------------------------------------------------------------------------------------


@dataclass
class PlacerRun:
    placer: str
    ratios: list[float]
    used: list[int]
    bound: list[int]
    decision_us: list[float]
    release_us: list[float]
    rejected: int
    moves: int
    migrations: int
    """Cross-GPU moves (``Move.is_cross_gpu``): each one is a replacement instance started."""
    departures: int
    drains: int
    repacks: int
    rooms: int
    live_mean: float
    gpus_after_drain: int


def run_placer(name: str, wl: Workload, gpus: int, warmup_arrivals: int, **opts: Any) -> PlacerRun:
    """Replay the workload's events on a fresh placer; sample after every event."""
    placer = make_placer(name, max_gpus=gpus, **opts)
    live: set[int] = set()
    live_area = 0.0
    arrived = rejected = moves = migrations = departures = 0
    ratios: list[float] = []
    used: list[int] = []
    bound: list[int] = []
    decision_us: list[float] = []
    release_us: list[float] = []
    live_sum = 0
    clock = time.perf_counter
    for _, kind, i in wl.events:
        s = wl.shares[i]
        if kind == ARRIVE:
            arrived += 1
            t0 = clock()
            try:
                placer.place(f"i{i}", s.quota_pct, s.sm_pct)
                ok = True
            except NoCapacity:
                ok = False
            decision_us.append((clock() - t0) * 1e6)
            if not ok:
                rejected += 1
                continue
            live.add(i)
            live_area += s.area
        else:
            if i not in live:
                continue
            t0 = clock()
            placer.release(f"i{i}")
            release_us.append((clock() - t0) * 1e6)
            live.discard(i)
            live_area -= s.area
            departures += 1
        taken = placer.take_moves()
        moves += len(taken)
        migrations += sum(m.is_cross_gpu for m in taken)
        if arrived > warmup_arrivals and live:
            b = max(1, math.ceil(live_area / GPU_AREA - 1e-9))
            u = placer.gpus_used()
            ratios.append(u / b)
            used.append(u)
            bound.append(b)
            live_sum += len(live)
    repacks = placer.repacks if isinstance(placer, MaxRectsPlacer) else 0
    drains = placer.drains if isinstance(placer, DefragMaxRectsPlacer) else 0
    rooms = placer.rooms if isinstance(placer, RoomDefragPlacer) else 0
    for i in sorted(live):  # drain (not counted in moves/repacks): every GPU must empty
        placer.release(f"i{i}")
    placer.take_moves()
    return PlacerRun(
        placer=name,
        ratios=ratios,
        used=used,
        bound=bound,
        decision_us=decision_us,
        release_us=release_us,
        rejected=rejected,
        moves=moves,
        migrations=migrations,
        departures=departures,
        drains=drains,
        repacks=repacks,
        rooms=rooms,
        live_mean=live_sum / len(ratios) if ratios else 0.0,
        gpus_after_drain=placer.gpus_used(),
    )


def pattern_bounds(wl: Workload, warmup_arrivals: int, every: int) -> dict[int, tuple[int, int]]:
    """Sample k -> (``width_pattern_bound``, area bound) of the live population, for every
    ``every``-th sample; samples are numbered as ``run_placer`` numbers them (after every event
    once ``warmup_arrivals`` arrived, while instances live) and every arrival counts as placed,
    so they match the samples of a placer that rejected none."""
    live: set[int] = set()
    arrived = k = 0
    out: dict[int, tuple[int, int]] = {}
    for _, kind, i in wl.events:
        if kind == ARRIVE:
            arrived += 1
            live.add(i)
        else:
            live.discard(i)
        if arrived > warmup_arrivals and live:
            if every > 0 and k % every == 0:
                sizes = [(wl.shares[j].quota_pct, wl.shares[j].sm_pct) for j in sorted(live)]
                area = max(1, math.ceil(sum(a * b for a, b in sizes) / GPU_AREA - 1e-9))
                out[k] = (width_pattern_bound(sizes), area)
            k += 1
    return out


# -- the experiment ------------------------------------------------------------------------------


@register(
    "packing-scale",
    "FaST-GShare §3.4.2 at scale: GPUs used / area bound and decision time of MRA (and "
    "gshare's MRA + cross-GPU defrag, with its migrations) vs first-fit, best-fit and time "
    "sharing on 1,000 GPUs under instance churn",
    full_params=FULL_PARAMS,
    quick_params=QUICK_PARAMS,
)
def run(params: Mapping[str, Any], seed: int) -> ExperimentResult:
    p = {**FULL_PARAMS, **params}
    unknown = [n for n in p["placers"] if n not in PLACERS]
    if unknown:
        raise ValueError(f"unknown placers {unknown} (known: {', '.join(sorted(PLACERS))})")
    wl = make_workload(
        ProfileTable.shipped_v100(),
        arrivals=int(p["arrivals"]),
        mean_population=float(p["mean_population"]),
        slo_factors=list(p["slo_factors"]),
        min_quota_pct=float(p["min_quota_pct"]),
        seed=seed,
    )
    variants: list[tuple[str, str, dict[str, Any]]] = []
    for name in p["placers"]:
        opts: dict[str, Any] = {}
        if name in ("mra", "mra-defrag", "mra-room"):
            opts["repack_threshold"] = int(p["repack_threshold"])
        if name == "mra-defrag":
            opts["sparse_pct"] = float(p["defrag_sparse_pct"])
            opts["margin_pct"] = float(p["defrag_margin_pct"])
        variants.append((name, name, opts))
        if name == "mra" and p["mra_literal_row"]:
            variants.append((MRA_LITERAL, name, {**opts, "merge_on_release": False}))
    pattern = pattern_bounds(wl, int(p["warmup_arrivals"]), int(p["pattern_bound_every"]))
    runs: list[PlacerRun] = []
    for label, name, opts in variants:
        run_ = run_placer(name, wl, int(p["gpus"]), int(p["warmup_arrivals"]), **opts)
        run_.placer = label
        runs.append(run_)

    rows: list[dict[str, Any]] = []
    for r in runs:
        rows.append(
            {
                "placer": r.placer,
                "gpus_over_area_bound": float(np.mean(r.ratios)) if r.ratios else math.nan,
                "gpus_over_area_bound_max": max(r.ratios) if r.ratios else math.nan,
                "gpus_over_pattern_bound": (
                    float(np.mean([r.used[k] / pb for k, (pb, _) in pattern.items()]))
                    if pattern and not r.rejected
                    else math.nan
                ),
                "gpus_used_mean": float(np.mean(r.used)) if r.used else math.nan,
                "area_bound_mean": float(np.mean(r.bound)) if r.bound else math.nan,
                "live_instances_mean": r.live_mean,
                "rejected": r.rejected,
                "repacks": r.repacks,
                "moves": r.moves,
                "migrations": r.migrations,
                "drains": r.drains,
                "rooms": r.rooms,
                "departures": r.departures,
                "migrations_per_departure": r.migrations / r.departures if r.departures else 0.0,
                "decision_us_p50": percentile(r.decision_us, 50),
                "decision_us_p99": percentile(r.decision_us, 99),
                "release_us_p50": percentile(r.release_us, 50),
                "release_us_p99": percentile(r.release_us, 99),
                "samples": len(r.ratios),
                "gpus_after_drain": r.gpus_after_drain,
            }
        )
    by = {row["placer"]: row for row in rows}
    summary: dict[str, Any] = {
        "gpus_over_area_bound": {n: by[n]["gpus_over_area_bound"] for n in by},
        "gpus_over_area_bound_max": {n: by[n]["gpus_over_area_bound_max"] for n in by},
        "decision_us_p50": {n: by[n]["decision_us_p50"] for n in by},
        "migrations_per_departure": {n: by[n]["migrations_per_departure"] for n in by},
        "release_us_p50": {n: by[n]["release_us_p50"] for n in by},
        "gpus_over_pattern_bound": {n: by[n]["gpus_over_pattern_bound"] for n in by},
        "pattern_bound_over_area_bound": (
            float(np.mean([pb / ab for pb, ab in pattern.values()])) if pattern else math.nan
        ),
        "rejected": {n: by[n]["rejected"] for n in by},
        "events": len(wl.events),
        "mean_share_area": float(np.mean([s.area for s in wl.shares])) if wl.shares else 0.0,
    }
    if "mra" in by or "mra-defrag" in by:
        summary["mra_target"] = TARGET_MRA_RATIO
    if "mra" in by:
        summary["mra_within_target"] = bool(by["mra"]["gpus_over_area_bound"] <= TARGET_MRA_RATIO)
    if "mra-defrag" in by:
        summary["mra_defrag_within_target"] = bool(
            by["mra-defrag"]["gpus_over_area_bound"] <= TARGET_MRA_RATIO
        )

    def plot(result: ExperimentResult, out_dir: Path) -> Path:
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for r in runs:
            if r.placer != "time-share":  # ~4-5x: off this scale, see the bars
                ax1.plot(r.ratios, label=r.placer, lw=1)
        ax1.axhline(TARGET_MRA_RATIO, color="tab:red", ls=":", lw=1, label="target 1.10")
        ax1.set_xlabel("event after warm-up (arrival or departure)")
        ax1.set_ylabel("GPUs in use / area bound")
        ax1.set_title("spatial placers under churn")
        ax1.legend(fontsize=8)
        names = [r.placer for r in runs]
        vals = [by[n]["gpus_over_area_bound"] for n in names]
        bars = ax2.bar(names, vals, color="tab:blue")
        ax2.bar_label(
            bars,
            labels=[
                f"{by[n]['gpus_over_area_bound']:.3f}"
                + (
                    f"\n{by[n]['migrations_per_departure']:.2f} mig/dep"
                    if by[n]["migrations"]
                    else ""
                )
                for n in names
            ],
            fontsize=8,
        )
        ax2.axhline(1.0, color="k", lw=0.8)
        ax2.axhline(TARGET_MRA_RATIO, color="tab:red", ls=":", lw=1, label="target 1.10")
        ax2.set_ylabel("GPUs used / area bound (mean)")
        ax2.set_title(f"{result.params['gpus']} GPUs, {result.params['arrivals']} arrivals")
        ax2.tick_params(axis="x", labelsize=8)
        ax2.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / "packing_scale.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    return ExperimentResult(
        experiment="packing-scale",
        seed=seed,
        params=p,
        rows=rows,
        summary=summary,
        plots=[plot],
        table_columns=[
            "placer",
            "gpus_over_area_bound",
            "gpus_over_area_bound_max",
            "gpus_over_pattern_bound",
            "gpus_used_mean",
            "area_bound_mean",
            "rejected",
            "repacks",
            "migrations_per_departure",
            "decision_us_p50",
            "decision_us_p99",
            "release_us_p50",
        ],
    )
