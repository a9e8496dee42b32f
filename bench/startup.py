"""Startup, restart and idle memory of ``gshare serve``: the embedded default vs ``--cluster ray``.

What it measures, for each mode (the embedded default: the node agent a child process, no
Ray; ``--cluster ray``: a local Ray instance started on purpose, the agent a Ray actor), with
the real built-in models:

* ``ready_s`` -- from spawning ``gshare serve`` (empty state directory, nothing deployed) to
  the first 200 of ``GET /v2/health/ready`` (polled every ``POLL_S``), median of the trials;
* idle memory of the whole process tree (the server and every descendant: Ray's processes,
  the agent, its template, instances), once the tree has settled (``SETTLE_S`` without a new
  process): the sum of RSS and the sum of PSS (``/proc/PID/smaps_rollup``: shared pages
  counted once across the tree, which is what the tree costs the machine), with nothing
  deployed and with one ``resnet50`` instance (``min_instances: 1``) ready;
* ``restart_first_answer_s`` -- with ``mlp`` (``examples/mlp.yaml``) deployed and answered
  once, ``kill -9`` of the server, then a new ``gshare serve`` on the same state directory
  (it reclaims what the killed one left and restores the function): the time from spawning
  it to the first 200 answer of ``mlp`` (requests sent back to back, each after the last one
  failed), median of the trials; ``from_kill`` counts from the kill instead.

Summary: ``ready_s_embedded``, ``ready_s_ray``, ``pss_mb_idle_embedded``, ``pss_mb_idle_ray``,
``rss_mb_idle_*``, ``pss_mb_resnet50_*``, ``rss_mb_resnet50_*``, ``processes_idle_*``,
``restart_first_answer_s_embedded``, ``restart_first_answer_s_ray``, the ratios embedded / Ray
(``ready_ratio``, ``pss_idle_ratio``, ``restart_ratio``) with their targets (``pass_*``: ready
<= 1.0 s and <= 0.4x Ray's; idle PSS <= 0.5x; restart <= 0.3x), and the machine load.

    .venv/bin/python bench/startup.py [--quick] [--json PATH] [--trials N] [--modes embedded,ray]

``--quick``: 2 trials of each timing (5 without).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from _common import bench_parser, machine_load, print_table, write_json
from gshare.runtime.client import Client
from gshare.testing import stop_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
MODES = {"embedded": (), "ray": ("--cluster", "ray")}
POLL_S = 0.01
"""How often readiness and the first answer are polled."""
SETTLE_S = 3.0
"""The tree is idle once no process joined or left it for this long."""
READY_TIMEOUT_S = 180.0
MLP_BODY = [0.1] * 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(mode: str, state: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``gshare serve`` in ``mode`` on ``state`` and ``port`` (its own session)."""
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "gshare.cli", "serve", "--port", str(port)]
            + ["--state", str(state), *MODES[mode]],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        )


def until_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"gshare serve exited ({proc.returncode}):\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get(url + "/v2/health/ready").status_code == 200:
                    return
            time.sleep(POLL_S)
    raise SystemExit(f"gshare serve not ready after {READY_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-3000:]
    return ""


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def settle(pid: int) -> None:
    """Until the tree has had the same processes for ``SETTLE_S``."""
    last: set[int] = set()
    since = time.monotonic()
    deadline = since + 120
    while time.monotonic() < deadline:
        now = {p.pid for p in tree(pid)}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE_S:
            return
        time.sleep(0.2)


def memory(pid: int) -> dict[str, float]:
    """Sum of RSS and of PSS (MiB) over the tree of ``pid``, and its process count."""
    rss = pss = 0
    n = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                fields = {
                    ln.split(":")[0]: int(ln.split()[1])
                    for ln in f
                    if ln.split(":")[0] in ("Rss", "Pss")
                }
        except (OSError, ValueError, IndexError):
            continue
        rss += fields.get("Rss", 0)
        pss += fields.get("Pss", 0)
        n += 1
    return {"rss_mb": rss / 1024, "pss_mb": pss / 1024, "processes": n}


def first_answer(url: str, t0: float) -> float:
    """Seconds from ``t0`` to the first 200 of ``mlp``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=60.0) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if http.post(url + "/function/mlp", json=MLP_BODY).status_code == 200:
                    return time.perf_counter() - t0
            time.sleep(POLL_S)
    raise SystemExit("mlp did not answer after the restart")


def run_mode(mode: str, trials: int, tmp: Path) -> dict[str, Any]:
    log = tmp / f"{mode}.log"
    row: dict[str, Any] = {"mode": mode}
    ready: list[float] = []
    for i in range(trials):
        port = _free_port()
        state = tmp / f"{mode}-ready-{i}"
        t0 = time.perf_counter()
        proc = spawn(mode, state, port, log)
        until_ready(proc, f"http://127.0.0.1:{port}", log)
        ready.append(time.perf_counter() - t0)
        print(f"  {mode}: ready after {ready[-1]:.2f} s", flush=True)
        if i == 0:  # memory at idle, then with one resnet50 instance
            settle(proc.pid)
            row.update({f"{k}_idle": v for k, v in memory(proc.pid).items()})
            c = Client(f"http://127.0.0.1:{port}", state_dir=state)
            c.deploy({"name": "resnet", "model": "resnet50", "device": "cpu", "min_instances": 1})
            wait_until(
                lambda c=c: c.get("resnet")["available_replicas"] == 1, 300, "resnet50 ready"
            )
            settle(proc.pid)
            row.update({f"{k}_resnet50": v for k, v in memory(proc.pid).items()})
            print(
                f"  {mode}: idle {row['pss_mb_idle']:.0f} MiB PSS / {row['rss_mb_idle']:.0f} "
                f"MiB RSS in {row['processes_idle']} processes; with resnet50 "
                f"{row['pss_mb_resnet50']:.0f} / {row['rss_mb_resnet50']:.0f} MiB",
                flush=True,
            )
        stop_process(proc, timeout_s=60)
    row["ready_s"] = statistics.median(ready)
    row["ready_s_all"] = ready
    # restart: mlp deployed and answered, kill -9, a new server on the same state
    state = tmp / f"{mode}-restart"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn(mode, state, port, log)
    until_ready(proc, url, log)
    c = Client(url, state_dir=state)
    c.deploy(ROOT / "examples" / "mlp.yaml")
    first_answer(url, time.perf_counter())
    restarts: list[float] = []
    from_kill: list[float] = []
    for _ in range(trials):
        t_kill = time.perf_counter()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.perf_counter()
        proc = spawn(mode, state, port, log)
        restarts.append(first_answer(url, t0))
        from_kill.append(time.perf_counter() - t_kill)
        print(f"  {mode}: first answer {restarts[-1]:.2f} s after the restart", flush=True)
    stop_process(proc, timeout_s=60)
    with contextlib.suppress(psutil.Error, ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a Ray left by a killed server is reclaimed above
    row["restart_first_answer_s"] = statistics.median(restarts)
    row["restart_first_answer_s_all"] = restarts
    row["restart_from_kill_s"] = statistics.median(from_kill)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=None, help="timings per mode (5; quick 2)")
    parser.add_argument("--modes", default="embedded,ray", help="comma-separated")
    args = parser.parse_args(argv)
    trials = args.trials or (2 if args.quick else 5)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode {unknown[0]!r} (known: {', '.join(MODES)})")
    load = machine_load()
    with tempfile.TemporaryDirectory(prefix="gsstart-") as d:
        rows = [run_mode(m, trials, Path(d)) for m in modes]
    by = {r["mode"]: r for r in rows}
    summary: dict[str, Any] = {"trials": trials}
    for m, r in by.items():
        summary[f"ready_s_{m}"] = r["ready_s"]
        summary[f"pss_mb_idle_{m}"] = r["pss_mb_idle"]
        summary[f"rss_mb_idle_{m}"] = r["rss_mb_idle"]
        summary[f"processes_idle_{m}"] = r["processes_idle"]
        summary[f"pss_mb_resnet50_{m}"] = r["pss_mb_resnet50"]
        summary[f"rss_mb_resnet50_{m}"] = r["rss_mb_resnet50"]
        summary[f"restart_first_answer_s_{m}"] = r["restart_first_answer_s"]
        summary[f"restart_from_kill_s_{m}"] = r["restart_from_kill_s"]
    if "embedded" in by and "ray" in by:
        e, r = by["embedded"], by["ray"]
        summary["ready_ratio"] = e["ready_s"] / r["ready_s"]
        summary["pss_idle_ratio"] = e["pss_mb_idle"] / r["pss_mb_idle"]
        summary["restart_ratio"] = e["restart_first_answer_s"] / r["restart_first_answer_s"]
        summary["pass_ready"] = e["ready_s"] <= 1.0 and summary["ready_ratio"] <= 0.4
        summary["pass_pss_idle"] = summary["pss_idle_ratio"] <= 0.5
        summary["pass_restart"] = summary["restart_ratio"] <= 0.3
    summary.update(load)
    print_table(
        "gshare serve: startup, restart, idle memory of the process tree",
        [
            "mode",
            "ready s",
            "idle PSS MiB",
            "idle RSS MiB",
            "procs",
            "resnet50 PSS MiB",
            "resnet50 RSS MiB",
            "restart->answer s",
        ],
        [
            [
                r["mode"],
                r["ready_s"],
                r["pss_mb_idle"],
                r["rss_mb_idle"],
                r["processes_idle"],
                r["pss_mb_resnet50"],
                r["rss_mb_resnet50"],
                r["restart_first_answer_s"],
            ]
            for r in rows
        ],
    )
    write_json(args.json, summary, rows=rows, params={"trials": trials, "modes": modes})
    return summary


if __name__ == "__main__":
    main()
