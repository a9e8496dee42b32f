"""Profile tables: measured latency per (model, sm_pct, quota_pct, batch).

The shipped table (``gshare/data/rapp_v100_sm_quota_latency.csv.gz``) holds 54,928 inference
latencies of 69 torchvision models measured on an NVIDIA V100 under MPS SM partitions
(5-100 %, step 5) x time quotas (10-100 %, step 10) x batch 1/2/4/8 with FaST-GShare's
manager. Source: the ``profiling_result`` fields of ``data/graph_features_all_models/*.json``
in github.com/KontonGu/RaPP, Apache License 2.0, (c) HAS-GPU authors, Jianfeng Gu et al.
(see ``NOTICE``).

Interpolation (``ProfileTable.latency_ms``) of an unmeasured point, in this order:

1. **batch** — piecewise-linear in batch between the two nearest measured batches; above the
   largest measured batch, linear extrapolation through the last two (each extra item costs
   the marginal time of the last measured step); below the smallest, the smallest's latency.
2. **quota** — piecewise-linear in quota between the two nearest measured quotas (of that
   batch); below the smallest measured quota the fluid rule ``lat(q_min) * q_min / q``.
3. **sm_pct** — piecewise-linear in SM % between the two nearest measured SM values (of that
   batch and quota); above the largest, the largest's latency (more SMs never help a model
   that is already saturated); below the smallest measured value it is an error, because a
   latency at an SM share nobody measured cannot be guessed safely.

Throughput is ``batch * 1000 / latency_ms`` (requests per second): the profiler ran a closed
loop with one outstanding batch, so one batch completes every ``latency_ms``.

This module reads files only in ``ProfileTable.from_csv``; the table itself is plain data that
policies may query.
"""

from __future__ import annotations

import bisect
import csv
import gzip
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from gshare.stats import percentile

SHIPPED_V100_TABLE = "rapp_v100_sm_quota_latency.csv.gz"
KERNELS_TABLE = "torchvision_kernels.csv"
"""Kernel launches per eager inference forward of the shipped table's models, counted from
their architectures (``tools/model_ops.py`` writes it; an approximation, not a measurement)."""


class ProfileError(LookupError):
    """A profile lookup that cannot be answered (unknown model, SM % below the measured range)."""


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured (or interpolated) point of a profile table."""

    model: str
    sm_pct: float
    quota_pct: float
    batch: int
    latency_ms: float

    @property
    def throughput_rps(self) -> float:
        """Requests per second of one instance in a closed loop: ``batch * 1000 / latency_ms``."""
        return self.batch * 1000.0 / self.latency_ms


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear interpolation on sorted ``xs``; the caller handles out-of-range ``x``."""
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class ProfileTable:
    """Latency and throughput per (model, sm_pct, quota_pct, batch), with interpolation.

    Built from ``ProfilePoint`` rows (``from_csv`` or ``shipped_v100``). Immutable after
    construction; lookups are pure. Who calls it: the autoscaler (throughput per config), the
    simulator (burst durations at quota 100 %), the fidelity experiment (the measured rows).
    """

    def __init__(self, rows: Iterable[ProfilePoint]) -> None:
        # grid[model][batch][quota] -> (sorted sm list, latency list)
        raw: dict[str, dict[int, dict[float, dict[float, float]]]] = {}
        self._rows: list[ProfilePoint] = []
        for r in rows:
            if r.latency_ms <= 0:
                raise ProfileError(f"latency_ms must be > 0 in {r}")
            self._rows.append(r)
            raw.setdefault(r.model, {}).setdefault(r.batch, {}).setdefault(r.quota_pct, {})[
                r.sm_pct
            ] = r.latency_ms
        self._grid: dict[str, dict[int, dict[float, tuple[list[float], list[float]]]]] = {}
        for model, by_b in raw.items():
            self._grid[model] = {}
            for b, by_q in by_b.items():
                self._grid[model][b] = {}
                for q, by_sm in by_q.items():
                    sms = sorted(by_sm)
                    self._grid[model][b][q] = (sms, [by_sm[s] for s in sms])

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_csv(cls, path: str | Path) -> ProfileTable:
        """Load a CSV (optionally gzip-compressed) with columns
        ``model,sm_pct,quota_pct,batch,latency_ms``."""
        p = Path(path)
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", newline="") as f:
            return cls(_parse_rows(csv.DictReader(f), str(p)))

    @classmethod
    def shipped_v100(cls) -> ProfileTable:
        """The V100 table shipped inside the package (cached: built once per process)."""
        return _shipped_v100()

    def filtered(
        self, *, models: Iterable[str] | None = None, quota_pct: float | None = None
    ) -> ProfileTable:
        """A new table with only the given models and/or only rows at one quota."""
        keep = set(models) if models is not None else None
        return ProfileTable(
            r
            for r in self._rows
            if (keep is None or r.model in keep) and (quota_pct is None or r.quota_pct == quota_pct)
        )

    # -- queries ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[ProfilePoint]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def models(self) -> list[str]:
        return sorted(self._grid)

    def has_model(self, model: str) -> bool:
        return model in self._grid

    def batches(self, model: str) -> list[int]:
        return sorted(self._model(model))

    def quotas(self, model: str, batch: int) -> list[float]:
        return sorted(self._model(model).get(batch, {}))

    def sm_values(self, model: str, batch: int = 1, quota_pct: float = 100.0) -> list[float]:
        """Measured SM percentages of a model at one batch and quota."""
        entry = self._model(model).get(batch, {}).get(quota_pct)
        return list(entry[0]) if entry else []

    def measured(self, model: str) -> list[ProfilePoint]:
        """Every measured row of one model."""
        self._model(model)
        return [r for r in self._rows if r.model == model]

    def latency_ms(
        self, model: str, sm_pct: float, quota_pct: float = 100.0, batch: int = 1
    ) -> float:
        """Latency of one batch at (sm_pct, quota_pct); interpolated as the module doc says."""
        if batch < 1:
            raise ProfileError(f"batch must be >= 1, got {batch}")
        if not (0 < quota_pct <= 100):
            raise ProfileError(f"quota_pct must be in (0, 100], got {quota_pct}")
        by_b = self._model(model)
        bs = sorted(by_b)
        if batch in by_b:
            return self._lat_bq(model, by_b[batch], batch, sm_pct, quota_pct)
        if batch < bs[0]:
            return self._lat_bq(model, by_b[bs[0]], bs[0], sm_pct, quota_pct)
        if batch > bs[-1]:
            if len(bs) == 1:
                b0 = b1 = bs[0]
                return self._lat_bq(model, by_b[b0], b0, sm_pct, quota_pct) * batch / b0
            b0, b1 = bs[-2], bs[-1]
        else:
            i = bisect.bisect_left(bs, batch)
            b0, b1 = bs[i - 1], bs[i]
        y0 = self._lat_bq(model, by_b[b0], b0, sm_pct, quota_pct)
        y1 = self._lat_bq(model, by_b[b1], b1, sm_pct, quota_pct)
        return max(1e-6, y0 + (y1 - y0) * (batch - b0) / (b1 - b0))

    def launch_floor_ms(self, model: str, quantile_pct: float = 0.0) -> float:
        """The model's host-bound floor: its smallest latency at quota 100 % over every
        measured SM share and batch. With enough SMs a small batch is bound by the host
        launching kernels, not by the GPU; the simulator's launch-gated bursts (see
        ``sim.gpu``) use this as the token-gated launch work of one inference.

        ``quantile_pct`` > 0: that percentile (linear interpolation) of the quota-100 latencies
        instead of their minimum — a floor robust to a single low measurement (0 = the minimum).
        """
        if not 0.0 <= quantile_pct <= 100.0:
            raise ProfileError(f"quantile_pct must be in [0, 100], got {quantile_pct}")
        by_b = self._model(model)
        lats = [x for by_q in by_b.values() for q, e in by_q.items() if q == 100.0 for x in e[1]]
        if not lats:
            raise ProfileError(f"model {model!r} has no quota-100 rows")
        return percentile(lats, quantile_pct)

    def throughput_rps(
        self, model: str, sm_pct: float, quota_pct: float = 100.0, batch: int = 1
    ) -> float:
        """Requests per second of one instance: ``batch * 1000 / latency_ms``."""
        return batch * 1000.0 / self.latency_ms(model, sm_pct, quota_pct, batch)

    # -- internals ----------------------------------------------------------------------------

    def _model(self, model: str) -> dict[int, dict[float, tuple[list[float], list[float]]]]:
        try:
            return self._grid[model]
        except KeyError:
            known = ", ".join(self.models()[:8])
            raise ProfileError(
                f"unknown model {model!r} in the profile table (known: {known}, ...)"
            ) from None

    def _lat_bq(
        self,
        model: str,
        by_q: dict[float, tuple[list[float], list[float]]],
        batch: int,
        sm_pct: float,
        quota_pct: float,
    ) -> float:
        qs = sorted(by_q)
        if quota_pct in by_q:
            return self._lat_sm(model, by_q[quota_pct], batch, quota_pct, sm_pct)
        if quota_pct < qs[0]:
            return self._lat_sm(model, by_q[qs[0]], batch, qs[0], sm_pct) * qs[0] / quota_pct
        if quota_pct > qs[-1]:
            return self._lat_sm(model, by_q[qs[-1]], batch, qs[-1], sm_pct)
        i = bisect.bisect_left(qs, quota_pct)
        q0, q1 = qs[i - 1], qs[i]
        y0 = self._lat_sm(model, by_q[q0], batch, q0, sm_pct)
        y1 = self._lat_sm(model, by_q[q1], batch, q1, sm_pct)
        return y0 + (y1 - y0) * (quota_pct - q0) / (q1 - q0)

    @staticmethod
    def _lat_sm(
        model: str,
        entry: tuple[list[float], list[float]],
        batch: int,
        quota_pct: float,
        sm_pct: float,
    ) -> float:
        sms, lats = entry
        if sm_pct < sms[0] - 1e-9:
            raise ProfileError(
                f"sm_pct {sm_pct} is below the smallest measured SM share {sms[0]} of "
                f"{model} (batch {batch}, quota {quota_pct})"
            )
        if sm_pct >= sms[-1]:
            return lats[-1]
        return _interp(sm_pct, sms, lats)


def _parse_rows(reader: Iterable[dict[str, str]], source: str) -> Iterator[ProfilePoint]:
    for i, row in enumerate(reader, start=2):
        try:
            yield ProfilePoint(
                model=row["model"],
                sm_pct=float(row["sm_pct"]),
                quota_pct=float(row["quota_pct"]),
                batch=int(row["batch"]),
                latency_ms=float(row["latency_ms"]),
            )
        except (KeyError, ValueError, TypeError) as e:
            raise ProfileError(f"{source}:{i}: bad profile row {row!r} ({e})") from None


@lru_cache(maxsize=1)
def _shipped_v100() -> ProfileTable:
    ref = resources.files("gshare").joinpath("data", SHIPPED_V100_TABLE)
    with resources.as_file(ref) as p:
        return ProfileTable.from_csv(p)


@lru_cache(maxsize=1)
def kernels_per_inference() -> dict[str, int]:
    """Kernel launches of one inference of each shipped-table model (``KERNELS_TABLE``; the
    same for every batch). Who calls it: ``sim.instance.LaunchGating`` users that take the
    token-gated launch work per kernel (``token-fidelity``). A model not in it has no count."""
    ref = resources.files("gshare").joinpath("data", KERNELS_TABLE)
    out: dict[str, int] = {}
    with ref.open("r", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                out[row["model"]] = int(row["kernels"])
            except (KeyError, ValueError) as e:
                raise ProfileError(f"{KERNELS_TABLE}:{i}: bad row {row!r} ({e})") from None
    return out
