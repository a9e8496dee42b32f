"""Events per second of the simulator's event loop vs SimPy, on the same model in the same run.

Usage: ``python bench/engine.py [--quick] [--json PATH] [--repeat N]``

The model is an M/M/1 queue driven by pre-drawn arrival and service times (one seed for both
engines): an *arrival* event enqueues a request and starts service if the server is idle; a
*departure* event completes the request and starts the next. Each engine processes exactly one
event per arrival and one per departure (2 x requests in all); both must report the same number
of completions and the same total latency, or the bench fails.

* ``gshare`` — ``gshare.sim.engine.EventLoop`` (a heap of ``(time, priority, seq, callback)``);
* ``simpy`` — the same callbacks on ``simpy.Environment`` with raw ``Timeout`` events (SimPy's
  cheapest way to schedule a callback: one event, one heap entry);
* ``simpy-process`` — for reference, the idiomatic SimPy version (a generator process per
  request and a ``Resource``); it processes more events per request, so it is compared on
  requests per second, not events.

A fourth row runs the real ``SimGpu`` (token scheduler + interference, 8 pods at 12 % SMs under a
saturating closed loop) and reports its events per second: the cost of the full model per event.

Printed as a table; ``--json`` writes ``{"summary": {...}, "rows": [...]}`` where
``summary.events_per_s`` is gshare's loop rate and ``summary.ratio_vs_simpy`` = gshare ÷ simpy
(events per second, same model, same run). Times are the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simpy
from rich.console import Console
from rich.table import Table

from gshare.sim.engine import EventLoop


def _draws(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (Poisson, 90 req/s) and service times (exponential, mean 10 ms): rho 0.9."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / 90.0, n))
    services = rng.exponential(10.0, n)
    return arrivals, services


class _MM1:
    """The model, written once against a tiny scheduling interface (``now``, ``schedule``)."""

    def __init__(
        self,
        arrivals: np.ndarray,
        services: np.ndarray,
        now: Callable[[], float],
        schedule: Callable[[float, Callable[..., None]], None],
    ) -> None:
        self.arrivals = arrivals.tolist()
        self.services = services.tolist()
        self.now = now
        self.schedule = schedule
        self.queue: deque[int] = deque()
        self.busy = False
        self.next_i = 0
        self.completed = 0
        self.total_latency_ms = 0.0
        self.events = 0

    def start(self) -> None:
        self.schedule(self.arrivals[0], self.arrive)

    # Callbacks take an optional argument so SimPy can call them directly with its event
    # (no wrapper on SimPy's side); gshare's loop calls them with none.
    def arrive(self, _ev: object = None) -> None:
        self.events += 1
        i = self.next_i
        self.next_i += 1
        if self.next_i < len(self.arrivals):
            self.schedule(self.arrivals[self.next_i] - self.now(), self.arrive)
        self.queue.append(i)
        if not self.busy:
            self._serve()

    def _serve(self) -> None:
        self.busy = True
        i = self.queue[0]
        self.schedule(self.services[i], self.depart)

    def depart(self, _ev: object = None) -> None:
        self.events += 1
        i = self.queue.popleft()
        self.completed += 1
        self.total_latency_ms += self.now() - self.arrivals[i]
        self.busy = False
        if self.queue:
            self._serve()


def run_gshare(arrivals: np.ndarray, services: np.ndarray) -> tuple[_MM1, float, int]:
    loop = EventLoop()
    m = _MM1(arrivals, services, lambda: loop.now_ms, loop.after)
    t0 = time.perf_counter()
    m.start()
    loop.run()
    return m, time.perf_counter() - t0, loop.events_processed


def run_simpy(arrivals: np.ndarray, services: np.ndarray) -> tuple[_MM1, float, int]:
    env = simpy.Environment()

    def schedule(delay: float, cb: Callable[..., None]) -> None:
        simpy.events.Timeout(env, delay).callbacks.append(cb)

    m = _MM1(arrivals, services, lambda: float(env.now), schedule)
    t0 = time.perf_counter()
    m.start()
    env.run()
    return m, time.perf_counter() - t0, m.events


def run_simpy_process(arrivals: np.ndarray, services: np.ndarray) -> tuple[int, float, float]:
    """Idiomatic SimPy: a source process and one process per request holding a Resource."""
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    arr, svc = arrivals.tolist(), services.tolist()
    done = [0, 0.0]

    def request(i: int):  # type: ignore[no-untyped-def]
        with server.request() as req:
            yield req
            yield env.timeout(svc[i])
        done[0] += 1
        done[1] += env.now - arr[i]

    def source():  # type: ignore[no-untyped-def]
        for i, t in enumerate(arr):
            yield env.timeout(t - env.now)
            env.process(request(i))

    t0 = time.perf_counter()
    env.process(source())
    env.run()
    return int(done[0]), time.perf_counter() - t0, float(done[1])


def run_sim_gpu(measure_ms: float) -> tuple[int, float]:
    """The full GPU model: events and wall time of a saturated 8 x 12 % ResNet-50 GPU."""
    from gshare.experiments.common import Pod, run_saturated
    from gshare.profiles import ProfileTable
    from gshare.resources import GpuShare

    profiles = ProfileTable.shipped_v100()  # loaded outside the timed part
    pods = [Pod(f"p{i}", "resnet", "resnet50", GpuShare(12.0, 1.0, 1.0)) for i in range(8)]
    t0 = time.perf_counter()
    r = run_saturated(pods, profiles=profiles, warmup_ms=0.0, measure_ms=measure_ms)
    return r.events, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (for tests / CI)")
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    ap.add_argument("--repeat", type=int, default=None, help="runs per engine (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = 20_000 if args.quick else 300_000
    repeat = args.repeat or (2 if args.quick else 3)
    gpu_ms = 5_000.0 if args.quick else 60_000.0
    arrivals, services = _draws(n, args.seed)

    best: dict[str, float] = {}
    results: dict[str, tuple[int, float, int]] = {}
    for _ in range(repeat):
        for name, fn in (("gshare", run_gshare), ("simpy", run_simpy)):
            m, wall, events = fn(arrivals, services)
            results[name] = (m.completed, m.total_latency_ms, events)
            best[name] = min(best.get(name, float("inf")), wall)
        completed_p, wall_p, lat_p = run_simpy_process(arrivals, services)
        best["simpy-process"] = min(best.get("simpy-process", float("inf")), wall_p)
    g, s = results["gshare"], results["simpy"]
    if not (g[0] == s[0] == completed_p == n and g[2] == s[2] == 2 * n):
        raise SystemExit(f"engines disagree: gshare {g}, simpy {s}, simpy-process {completed_p}")
    if not (abs(g[1] - s[1]) <= 1e-6 * g[1] and abs(g[1] - lat_p) <= 1e-6 * g[1]):
        raise SystemExit(f"total latency differs: gshare {g[1]}, simpy {s[1]}, process {lat_p}")
    gpu_events, gpu_wall = run_sim_gpu(gpu_ms)

    rows = [
        {
            "engine": "gshare EventLoop",
            "requests": n,
            "events": g[2],
            "wall_s": best["gshare"],
            "events_per_s": g[2] / best["gshare"],
            "requests_per_s": n / best["gshare"],
        },
        {
            "engine": "simpy (raw Timeout callbacks)",
            "requests": n,
            "events": s[2],
            "wall_s": best["simpy"],
            "events_per_s": s[2] / best["simpy"],
            "requests_per_s": n / best["simpy"],
        },
        {
            "engine": "simpy (process + Resource)",
            "requests": n,
            "events": None,
            "wall_s": best["simpy-process"],
            "events_per_s": None,
            "requests_per_s": n / best["simpy-process"],
        },
        {
            "engine": "gshare SimGpu (8 x 12 % ResNet-50)",
            "requests": None,
            "events": gpu_events,
            "wall_s": gpu_wall,
            "events_per_s": gpu_events / gpu_wall,
            "requests_per_s": None,
        },
    ]
    summary = {
        "events_per_s": rows[0]["events_per_s"],
        "ratio_vs_simpy": rows[0]["events_per_s"] / rows[1]["events_per_s"],
        "ratio_vs_simpy_process": rows[0]["requests_per_s"] / rows[2]["requests_per_s"],
        "simpy_events_per_s": rows[1]["events_per_s"],
        "sim_gpu_events_per_s": rows[3]["events_per_s"],
        "completions": g[0],
        "events": g[2],
    }

    console = Console()
    table = Table(
        "engine",
        "requests",
        "events",
        "wall s",
        "events/s",
        "requests/s",
        title=f"M/M/1, {n:,} requests (rho 0.9), best of {repeat}",
        box=None,
    )
    for r in rows:
        table.add_row(
            r["engine"],
            f"{r['requests']:,}" if r["requests"] else "-",
            f"{r['events']:,}" if r["events"] else "-",
            f"{r['wall_s']:.3f}",
            f"{r['events_per_s']:,.0f}" if r["events_per_s"] else "-",
            f"{r['requests_per_s']:,.0f}" if r["requests_per_s"] else "-",
        )
    console.print(table)
    console.print(
        f"gshare ÷ simpy (events/s, same model): [bold]{summary['ratio_vs_simpy']:.2f}x[/]; "
        f"÷ idiomatic simpy (requests/s): {summary['ratio_vs_simpy_process']:.2f}x"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
