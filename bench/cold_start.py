"""Cold start: the first request to a function scaled to zero, instances forked from the node's
template vs one Ray actor per instance.

What it measures: a real ``gshare serve`` (``--launcher fork``, the default, and
``--launcher ray``, one after the other) serves a function with ``min_instances: 0`` and
``keep_alive_s: 1``. Each trial waits until the controller has scaled the function to zero,
then sends one request and times it until the answer arrives (the gateway queues it while
the controller starts an instance: placement, process start, imports — with ``ray`` only —,
model load from the node's store, token registration, first inference). The first trial of
each server also puts the weights in the node's store and is reported apart (``first_s``);
the others are the steady cold starts a user sees after a quiet period. Models: ``mlp`` (a
few hundred kB of weights: the process start alone) and ``resnet50`` (``transformers``'
ResNet-50 architecture with random weights, 98 MB), its input as raw float32 bytes.

Summary: ``cold_start_s_fork`` / ``cold_start_s_ray`` (median over the trials of every
model, per model in ``rows``) and ``speedup_fork_vs_ray`` (ray ÷ fork, per model and
overall), plus the machine load. A warm request (the instance already running) is timed too
(``warm_ms``), so that the cold start's own cost is visible.

    .venv/bin/python bench/cold_start.py [--quick] [--json PATH] [--trials N] \
        [--models mlp,resnet50]

``--quick``: 2 trials and ``mlp`` only.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, machine_load, print_table, write_json
from gshare.testing import ServeProcess, WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "mlp": {"bytes": 64 * 4},
    "resnet50": {"bytes": 3 * 224 * 224 * 4},
}


def wait_zero(client: Any, name: str, timeout_s: float = 60.0) -> None:
    """Until the controller has stopped every instance of ``name``."""
    try:
        wait_until(
            lambda: not client.get(name).get("instances"), timeout_s, f"{name} to be scaled to zero"
        )
    except WaitTimeout as e:
        raise SystemExit(str(e)) from None


def run_server(launcher: str, models: list[str], trials: int, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    with ServeProcess("--launcher", launcher, state_dir=tmp / f"state-{launcher}", cwd=ROOT) as srv:
        c = srv.client()
        for model in models:
            name = f"cold-{model}"
            c.deploy(
                {
                    "name": name,
                    "model": model,
                    "device": "cpu",
                    "min_instances": 0,
                    "max_instances": 1,
                    "keep_alive_s": 1,
                    "batching": {"max_batch": 1, "max_wait_ms": 0},
                }
            )
            body = bytes(MODELS[model]["bytes"])  # zeros: a valid float32 input
            times = []
            warm_ms = []
            for _ in range(trials + 1):  # the first also builds the store's copy
                wait_zero(c, name)
                t0 = time.perf_counter()
                r = c.invoke_raw(name, body)
                times.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    raise SystemExit(f"{launcher}/{model}: {r.status_code} {r.text[:300]}")
                t1 = time.perf_counter()
                c.invoke_raw(name, body)
                warm_ms.append((time.perf_counter() - t1) * 1000.0)
                print(
                    f"  {launcher} {model}: cold {times[-1]:.2f} s, warm {warm_ms[-1]:.1f} ms",
                    flush=True,
                )
            c.delete(name)
            rows.append(
                {
                    "launcher": launcher,
                    "model": model,
                    "first_s": times[0],
                    "cold_start_s": statistics.median(times[1:]),
                    "cold_start_s_min": min(times[1:]),
                    "cold_start_s_max": max(times[1:]),
                    "warm_ms": statistics.median(warm_ms),
                    "trials": trials,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--trials", type=int, default=None, help="cold starts per model (5; quick 2)"
    )
    parser.add_argument("--models", default=None, help="comma-separated (mlp,resnet50; quick mlp)")
    args = parser.parse_args(argv)
    trials = args.trials or (2 if args.quick else 5)
    models = (args.models or ("mlp" if args.quick else "mlp,resnet50")).split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    load = machine_load()
    with tempfile.TemporaryDirectory(prefix="gscold-") as d:
        rows = run_server("fork", models, trials, Path(d)) + run_server(
            "ray", models, trials, Path(d)
        )

    def cell(launcher: str, model: str) -> dict[str, Any]:
        return next(r for r in rows if r["launcher"] == launcher and r["model"] == model)

    summary: dict[str, Any] = {
        "cold_start_s_fork": statistics.median(
            r["cold_start_s"] for r in rows if r["launcher"] == "fork"
        ),
        "cold_start_s_ray": statistics.median(
            r["cold_start_s"] for r in rows if r["launcher"] == "ray"
        ),
        "trials": trials,
        "models": models,
    }
    summary["speedup_fork_vs_ray"] = summary["cold_start_s_ray"] / summary["cold_start_s_fork"]
    for m in models:
        summary[f"speedup_fork_vs_ray_{m}"] = (
            cell("ray", m)["cold_start_s"] / cell("fork", m)["cold_start_s"]
        )
    summary.update(load)
    print_table(
        "cold start: first request to a function scaled to zero",
        ["launcher", "model", "first s (store)", "cold s (median)", "min", "max", "warm ms"],
        [
            [
                r["launcher"],
                r["model"],
                r["first_s"],
                r["cold_start_s"],
                r["cold_start_s_min"],
                r["cold_start_s_max"],
                r["warm_ms"],
            ]
            for r in rows
        ],
    )
    print(
        f"cold start, median: fork {summary['cold_start_s_fork']:.2f} s, ray "
        f"{summary['cold_start_s_ray']:.2f} s: {summary['speedup_fork_vs_ray']:.1f}x faster forked"
    )
    write_json(args.json, summary, rows=rows, params={"trials": trials, "models": models})
    return summary


if __name__ == "__main__":
    main()
