"""Workloads: arrival times of requests, and drivers that feed them to the gateway.

Generators return sorted arrival times in milliseconds (numpy arrays):

* ``poisson`` — exponential inter-arrivals at ``rate_rps``;
* ``uniform`` — one request every ``1000 / rate_rps`` ms (constant intervals; ESG §4.1's
  intervals drawn uniformly from a range are ``sim.workflow.workload.uniform_intervals``);
* ``bursty`` — a two-state Markov-modulated Poisson process (on/off bursts);
* ``piecewise_poisson`` — Poisson with a rate that changes at given times (a varying RPS trace);
* ``ramping_poisson`` — Poisson whose rate ramps linearly between targets (k6 stages);
* ``azure2021`` — replay of the shipped Azure Functions 2021 sample (arrival = end − duration);
* ``azure_llm`` — replay of the shipped Azure LLM inference 2023 timestamps;
* ``azure2019_minutes`` — Azure Functions 2019 per-minute invocation counts
  (``HashOwner,HashApp,HashFunction,Trigger,1..1440``), spread as Poisson within each minute;
* ``azure2019_functions`` — the busiest functions of a slice of minutes of such a file (the
  shipped 990-function day, ``minute_1..minute_1440`` columns, by default), one stream each,
  on one clock (``scale_streams_to_rate`` rescales them together).

Replays can be rescaled to a target mean rate (``scale_to_rate``). The shipped traces are in
``gshare/data`` (sources and licences in ``NOTICE``).

``drive_open_loop`` schedules arrivals lazily (one pending event per stream);
``drive_closed_loop`` keeps ``users`` requests outstanding per function (a saturating load, as
a load generator at full speed).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np

from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.priorities import PRIO_ARRIVAL
from gshare.sim.request import SimRequest


def poisson(
    rate_rps: float, duration_ms: float, rng: np.random.Generator, start_ms: float = 0.0
) -> np.ndarray:
    if rate_rps <= 0:
        return np.empty(0)
    n = int(rate_rps * duration_ms / 1000.0 * 1.2 + 20)
    gaps = rng.exponential(1000.0 / rate_rps, n)
    t = start_ms + np.cumsum(gaps)
    while t[-1] < start_ms + duration_ms:
        more = t[-1] + np.cumsum(rng.exponential(1000.0 / rate_rps, n))
        t = np.concatenate([t, more])
    return t[t < start_ms + duration_ms]


def uniform(rate_rps: float, duration_ms: float, start_ms: float = 0.0) -> np.ndarray:
    if rate_rps <= 0:
        return np.empty(0)
    step = 1000.0 / rate_rps
    return start_ms + np.arange(step, duration_ms + 1e-9, step)


def piecewise_poisson(
    segments: Sequence[tuple[float, float]], rng: np.random.Generator
) -> np.ndarray:
    """``segments`` = [(duration_ms, rate_rps), ...] played one after the other."""
    out = []
    t0 = 0.0
    for dur, rate in segments:
        out.append(poisson(rate, dur, rng, start_ms=t0))
        t0 += dur
    return np.concatenate(out) if out else np.empty(0)


def ramping_poisson(
    stages: Sequence[tuple[float, float]],
    rng: np.random.Generator,
    start_rps: float = 0.0,
    step_ms: float = 100.0,
) -> np.ndarray:
    """Poisson arrivals whose rate ramps linearly from one target to the next, like a k6
    ``ramping-arrival-rate`` scenario (FaST-GShare drove its experiments with k6): ``stages`` =
    [(duration_ms, target_rps), ...]; the rate is held constant over ``step_ms`` slices."""
    segments: list[tuple[float, float]] = []
    rate = start_rps
    for dur, target in stages:
        n = max(1, int(round(dur / step_ms)))
        for i in range(n):
            mid = rate + (target - rate) * (i + 0.5) / n
            segments.append((dur / n, mid))
        rate = target
    return piecewise_poisson(segments, rng)


def bursty(
    mean_rate_rps: float,
    duration_ms: float,
    rng: np.random.Generator,
    burst_factor: float = 4.0,
    on_fraction: float = 0.2,
    mean_period_ms: float = 5000.0,
) -> np.ndarray:
    """On/off MMPP: during 'on' periods the rate is ``burst_factor`` x the 'off' rate, chosen so
    the long-run mean is ``mean_rate_rps``."""
    off_rate = mean_rate_rps / (on_fraction * burst_factor + (1 - on_fraction))
    on_rate = off_rate * burst_factor
    t = 0.0
    out = []
    on = False
    while t < duration_ms:
        mean_len = mean_period_ms * (on_fraction if on else 1 - on_fraction)
        length = min(float(rng.exponential(mean_len)), duration_ms - t)
        out.append(poisson(on_rate if on else off_rate, length, rng, start_ms=t))
        t += length
        on = not on
    return np.concatenate(out) if out else np.empty(0)


def _data_path(name: str) -> Path:
    return Path(str(resources.files("gshare").joinpath("data", name)))


def azure2021(path: str | Path | None = None) -> np.ndarray:
    """Arrival times (ms, from 0) of the Azure Functions 2021 sample: end − duration."""
    p = Path(path) if path else _data_path("azure2021_sample_200.csv")
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    t = np.array([float(r["end_timestamp"]) - float(r["duration"]) for r in rows]) * 1000.0
    t.sort()
    out: np.ndarray = t - t[0]
    return out


def azure_llm(path: str | Path | None = None) -> np.ndarray:
    """Arrival times (ms, from 0) of the Azure LLM inference 2023 (code) trace."""
    p = Path(path) if path else _data_path("azure_llm_inference_2023_code.csv")
    with open(p, newline="") as f:
        stamps = [r["TIMESTAMP"] for r in csv.DictReader(f)]
    ts = np.array([_parse_ts(s) for s in stamps])
    ts.sort()
    out: np.ndarray = (ts - ts[0]) * 1000.0
    return out


def azure_llm_tokens(path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Context and generated token counts of the Azure LLM inference 2023 (code) trace's
    requests, in the order of ``azure_llm``'s arrivals (by timestamp, ties in file order)."""
    p = Path(path) if path else _data_path("azure_llm_inference_2023_code.csv")
    with open(p, newline="") as f:
        rows = [
            (_parse_ts(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
            for r in csv.DictReader(f)
        ]
    order = np.argsort(np.array([t for t, _, _ in rows]), kind="stable")
    ctx = np.array([rows[i][1] for i in order], dtype=np.int64)
    gen = np.array([rows[i][2] for i in order], dtype=np.int64)
    return ctx, gen


def _parse_ts(s: str) -> float:
    s = s.strip()
    if "." in s:
        head, frac = s.split(".", 1)
        return datetime.fromisoformat(head).timestamp() + float("0." + frac)
    return datetime.fromisoformat(s).timestamp()


def azure2019_minutes(
    path: str | Path, rng: np.random.Generator, row: int = 0, minutes: int | None = None
) -> np.ndarray:
    """Arrivals of one function (``row``) of an Azure 2019 ``invocations_per_function`` file."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        first = _minute_columns(header)
        for i, r in enumerate(reader):
            if i == row:
                counts = [int(x) for x in r[first:]]
                break
        else:
            raise ValueError(f"{path}: no row {row}")
    if minutes is not None:
        counts = counts[:minutes]
    out = [m * 60_000.0 + np.sort(rng.uniform(0, 60_000.0, c)) for m, c in enumerate(counts) if c]
    return np.concatenate(out) if out else np.empty(0)


def _minute_columns(header: Sequence[str]) -> int:
    """Index of the first per-minute column: ``1`` (Azure 2019 release) or ``minute_1``
    (invitro's 990-function sample)."""
    for name in ("1", "minute_1"):
        if name in header:
            return header.index(name)
    raise ValueError("no per-minute columns ('1' or 'minute_1') in the header")


def azure2019_functions(
    rng: np.random.Generator,
    *,
    start_minute: int,
    minutes: int,
    top: int,
    path: str | Path | None = None,
) -> dict[str, np.ndarray]:
    """Arrivals (ms, from the slice's start) of the ``top`` busiest functions of minutes
    ``[start_minute, start_minute + minutes)`` of an Azure 2019 per-minute file (default: the
    shipped ``azure2019_990_invocations.csv.gz``). Keys are ``fNN-<hash prefix>`` in order of
    decreasing count; counts are spread uniformly at random within each minute (Poisson)."""
    import gzip

    p = Path(path) if path else _data_path("azure2019_990_invocations.csv.gz")
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        first = _minute_columns(header)
        h_fn = header.index("HashFunction")
        rows = []
        for r in reader:
            counts = [int(x) for x in r[first + start_minute : first + start_minute + minutes]]
            rows.append((sum(counts), r[h_fn], counts))
    rows.sort(key=lambda x: (-x[0], x[1]))
    out: dict[str, np.ndarray] = {}
    for i, (total, h, counts) in enumerate(rows[:top]):
        if total == 0:
            break
        parts = [m * 60_000.0 + np.sort(rng.uniform(0, 60_000.0, c)) for m, c in enumerate(counts)]
        out[f"f{i:02d}-{h[:8]}"] = np.concatenate(parts)
    return out


def scale_streams_to_rate(
    streams: dict[str, np.ndarray], rate_rps: float, span_ms: float
) -> dict[str, np.ndarray]:
    """Stretch or compress several streams on one clock (one factor for all, so their relative
    timing is kept) so that their total mean rate over ``span_ms`` is ``rate_rps``."""
    total = sum(len(t) for t in streams.values())
    if total == 0 or rate_rps <= 0:
        return dict(streams)
    factor = (total / rate_rps * 1000.0) / span_ms
    return {k: t * factor for k, t in streams.items()}


def scale_to_rate(times_ms: np.ndarray, rate_rps: float) -> np.ndarray:
    """Compress or stretch a trace in time so its mean rate is ``rate_rps`` (shape kept)."""
    if len(times_ms) < 2:
        return times_ms
    span = times_ms[-1] - times_ms[0]
    target_span = len(times_ms) / rate_rps * 1000.0
    out: np.ndarray = (times_ms - times_ms[0]) * (target_span / span if span > 0 else 1.0)
    return out


def drive_open_loop(
    loop: EventLoop, gateway: Gateway, function: str, times_ms: Iterable[float]
) -> None:
    """Submit a request of ``function`` at each time (sorted); events are scheduled lazily."""
    it = iter(times_ms)

    def fire() -> None:
        gateway.submit(function)
        schedule_next()

    def schedule_next() -> None:
        for t in it:
            loop.at(max(float(t), loop.now_ms), fire, PRIO_ARRIVAL)
            return

    schedule_next()


def drive_closed_loop(
    loop: EventLoop,
    gateway: Gateway,
    function: str,
    users: int,
    until_ms: float,
    think_ms: float = 0.0,
) -> None:
    """Keep ``users`` requests of ``function`` outstanding until ``until_ms``."""

    def on_complete(req: SimRequest) -> None:
        if req.function == function and loop.now_ms < until_ms:
            loop.after(think_ms, lambda: gateway.submit(function), PRIO_ARRIVAL)

    gateway.on_complete_hooks.append(on_complete)
    for _ in range(users):
        loop.at(loop.now_ms, lambda: gateway.submit(function), PRIO_ARRIVAL)
