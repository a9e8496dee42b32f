"""Share accuracy of the live token mechanism: busy instance processes on one device.

Usage: ``python bench/share_accuracy.py [--quick] [--json PATH] [--phase-s S] [--device spin|sleep]
[--protocol reuse|per-burst] [--token-config JSON] [--probe-s S] [--no-pin]``

The live twin of the simulator's ``token-share`` experiment (same scenario table, same
arithmetic), run with real processes and the wall clock: a ``TokenServer`` in this process (the
node agent's role) and one process per instance (multiprocessing *spawn*), each running a
*saturating closed loop* of bursts of CPU spinning under a ``TokenClient``. A burst is
``kernels`` x 0.25 ms of spinning; before each 0.25-ms "kernel" the client checks
``should_yield`` and gives the token back when the kernel does not fit (Gemini revocation,
``completed=False``), then asks again for the rest of the burst. So a compliant instance never
starts a kernel that cannot finish within its token (with ``--device sleep`` it can still run
past it when it wakes late: it wakes 0.5 ms early and polls the rest). The per-window table says
which: ``over windows`` counts (client, window) pairs over the limit and ``with overrun`` those in
which that client had a token that ran past its length.

Device time. On the spin device a kernel is a fixed amount of CPU work (0.25 ms of the
spinning thread's CPU time), and the time a client reports on its tokens is the CPU time it got
(``TokenClient(busy_clock=time.thread_time)``): what the device -- the core -- gave it. Wall time
would also count the stalls below, during which the client held its token but its core ran
something else (measured: in kernels stretched to 1-8 ms the thread got 0.04-0.24 ms of CPU).
On ``--device sleep`` it is the wall time from launch to wake-up, as a GPU frontend measures it.

The "device" is one core (``--no-pin`` turns this off): the instance processes are pinned to
the last core and the token server and this driver to the others, as a GPU's token server runs
on the host, not on the GPU it schedules. The instances run without Python's garbage collector
(a real frontend is a C hook library; a full collection of a long log between a kernel's check
and its end would be an overrun of the bench's own making).

Machine stalls: before the scenarios a probe process spins the same 0.25-ms kernels back to
back on the device core with no tokens at all (``--probe-s``, 10 s; quick 3 s) and counts the
kernels stretched past 1 ms (``probe_stalls_per_min``, ``probe_max_stall_ms``). On the 2-core
VM this was written on such stalls (2-8 ms) come a few times a minute, with or without
``nice -20``, some with no context switch of the process at all (the vCPU itself stopped).
Measured in wall time, a spinning instance hit by one in the last kernel of the token that
takes it to its limit ends that window over the limit (``max_over_limit_wall_pp``); measured
in device time it does not, since a kernel starts only when its CPU work fits in the token's
wall-clock rest and CPU time never runs faster than the wall clock.

``--protocol reuse`` (the default, the runtime instance's pattern): bursts run back to back on
one token (``TokenClient.start_burst`` reuses it while any time is left on it -- the client is
built with ``split_bursts=True``, since it checks every kernel; ``end_burst`` keeps it; a kernel
that does not fit releases it with ``completed=False`` and asks again for the rest of the
burst), and the token is given back (``idle``) when the phase ends; each token's record then
holds the busy time of all its bursts. The runtime instance, whose preemption points are
coarser (torch modules), reuses a token only while its rest fits the predicted burst. ``--protocol
per-burst`` releases after every burst (the old frontend: a hand-over of the device, two wake-ups,
per burst, which cost the clients 2-6 pp of their shares on this VM).

The token server runs with the live node agent's configuration,
``gshare.runtime.tokens.LIVE_TOKEN_CONFIG`` (``--token-config JSON`` overrides fields of it).

Every client has 100 % of the SMs, so the SM adapter lets only one of them hold a token at a
time: they *time-share* the device (and, on this CPU-only machine, at most one spins at a time,
so they do not compete for cores and the shares are decided by the scheduler alone). Expected
shares (window W = 40 ms), as in ``gshare.experiments.token_share``:

* ``iso-r`` (r = 10, 50, 90): T (request r %, limit r %) and a greedy N (request 100 - r,
  limit 100). Phase 1, both busy: the requests sum to 100 %, so each gets exactly its request,
  T = r, N = 100 - r (r = 10: T is guaranteed and capped at 0.10 x 40 = 4 ms of every window,
  N gets the other 36 ms). Phase 2, T idle: N reclaims the idle time up to its limit, N = 100.
* ``elastic-r``: T (request r, limit l = 60 / 80 / 100 for r = 10 / 50 / 90) and N (request
  100 - r, limit 100 - r). Phase 1, both busy: T = r, N = 100 - r. Phase 2, N idle: T reclaims
  up to its limit, T = l. Phase 3, N back: T = r, N = 100 - r again.

A client's **share** is the busy time it reported on its tokens (the time the scheduler
charges), placed at each token's grant (``TokenServer.token_records``: the interval
``[grant, grant + busy]``), summed over a phase minus its first ``settle`` seconds (a
neighbour just started or stopped), divided by that wall time.

Summary:

* ``max_abs_share_error_pp`` -- max over (scenario, phase, active client) of
  ``|achieved - expected|`` in percentage points (target <= 3).
* ``max_over_limit_pp`` -- max over clients and over every *window* of the run (the
  scheduler's windows, aligned to ``TokenServer.epoch_s``) of ``usage in the window / W - limit``
  in pp, clipped at 0, where usage is the server-side busy intervals above (target 0). It is
  positive only when a client used more device time on a token than the token's length (an
  overrun) or the scheduler over-granted.
* ``max_over_limit_client_pp`` -- the same from the clients' own logs (each token's first
  kernel start on ``time.monotonic``, the server's clock, plus the device time it used). It
  differs from the server view by the grant's delivery latency (tens of microseconds).
* ``max_over_limit_wall_pp`` -- informative: the same with each token's *wall-clock* span
  (first kernel start to last kernel end) as its usage. On the spin device it also counts the
  time a client's core was taken from it while it held its token (a stall: see below), which
  the device did not give it.
* ``max_phase_over_limit_pp`` -- the same over a measured phase instead of a window: an
  overrun is charged as debt and repaid in the next windows, so over a phase a client stays
  within its limit (plus at most one burst) even when single windows do not.
* ``overruns`` -- tokens whose reported busy time exceeded their length, and their total.

``--device sleep`` replaces the spinning by an asynchronous "device": the kernels that fit in
the token are launched at once and the process sleeps until they are done (as a host waits on
a GPU stream), so a busy instance does not compete for CPU with the rest of the machine. On a
machine whose cores are saturated by other work, a spinning instance is descheduled mid-burst
(an overrun of a scheduler time slice, several ms) and every hand-over of the device waits for
two wake-ups; both modes then lose accuracy, ``spin`` much more. ``machine_load`` is recorded
in the summary at the start and (``*_end``) at the end of the run (``cpu_pressure_pct``: share
of the last 10 s in which tasks waited for a CPU).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

from _common import (
    add_token_config_option,
    bench_parser,
    live_token_config,
    machine_load,
    print_table,
    write_json,
)
from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.runtime.tokens import LIVE_TOKEN_CONFIG, TokenClient, TokenRecord, TokenServer

KERNEL_MS = 0.25
WAKE_MARGIN_S = 0.0005
"""``--device sleep``: wake this long before the kernels end and poll the rest."""


@dataclass(frozen=True)
class Plan:
    """One client of a scenario: its share, its bursts, what it should get in each phase."""

    name: str
    request_pct: float
    limit_pct: float
    burst_ms: float
    expected_pct: tuple[float | None, ...]
    """Expected share per phase; None = idle in that phase."""


def scenarios(quick: bool) -> list[tuple[str, tuple[Plan, ...]]]:
    """The scenario table (see the module docstring for the arithmetic)."""
    out: list[tuple[str, tuple[Plan, ...]]] = []
    for r in (10, 50, 90):
        out.append(
            (
                f"iso-{r}",
                (
                    Plan("T", r, r, 5.0, (r, None)),
                    Plan("N", 100 - r, 100, 12.0, (100 - r, 100)),
                ),
            )
        )
    for r, lim in ((10, 60), (50, 80), (90, 100)):
        if quick and r != 10:
            continue
        out.append(
            (
                f"elastic-{r}",
                (
                    Plan("T", r, lim, 7.0, (r, lim, r)),
                    Plan("N", 100 - r, 100 - r, 11.0, (100 - r, None, 100 - r)),
                ),
            )
        )
    return out


def _worker(
    path: str,
    cid: str,
    kernels: int,
    device: str,
    reuse: bool,
    conn: Connection,
    device_core: int | None = None,
) -> None:  # pragma: no cover - runs in the child
    """Instance process: wait for the active intervals, run bursts in them, send the log back.

    ``device="spin"``: a kernel is 0.25 ms of CPU spinning, checked one by one with
    ``should_yield``. ``device="sleep"``: the kernels that fit in the token are "launched" at
    once and the process sleeps until they are done, as a host waits on a GPU stream.
    """
    # Every kernel is checked with should_yield, so a burst may start on any rest of a token and
    # be cut where the token ends (TokenClient.reusable, the NOTE on split bursts).
    if device_core is not None:  # --pin: the instances run on the "device" core
        os.sched_setaffinity(0, {device_core})
    # No collector pauses between a kernel's token check and its end (the log grows to
    # thousands of tuples; a full collection of it takes milliseconds). A real frontend is a
    # C hook library without a collector.
    gc.disable()
    # The device time a token's record holds: on the spin device the CPU time the instance got
    # (time.thread_time), not the wall time it held the token -- a stall of its core (another
    # task, or the VM stopping the vCPU) is not time the device gave it.
    busy_clock = time.thread_time if device == "spin" else time.perf_counter
    client = TokenClient(path, cid, timeout_s=30, split_bursts=True, busy_clock=busy_clock)
    conn.send("ready")
    intervals: list[tuple[float, float]] = conn.recv()
    log: list[tuple[float, float]] = []  # (first kernel start, + device time), monotonic
    wall: list[tuple[float, float]] = []  # (first kernel start, last kernel end), monotonic
    perf, mono = time.perf_counter, time.monotonic
    spin_s = KERNEL_MS / 1000.0
    for start, end in intervals:
        time.sleep(max(0.0, start - mono()))
        while mono() < end:
            left = kernels
            if reuse:  # the instance's pattern: bursts back to back on one token
                client.start_burst()
            while left:
                if reuse:
                    if client.token_ms is None:
                        client.acquire()
                else:
                    client.acquire()
                t0 = perf()
                m0 = mono()
                c0 = busy_clock()
                if device == "spin":
                    # A kernel is a fixed amount of CPU work (0.25 ms of this thread's CPU
                    # time), started only when it fits in the token's wall-clock rest.
                    while left and not client.should_yield(KERNEL_MS):
                        d = busy_clock() + spin_s
                        while busy_clock() < d:
                            pass
                        left -= 1
                else:
                    fit = min(left, int(client.token_left_ms() // KERNEL_MS))
                    d = t0 + fit * spin_s
                    # Sleep until a wake-up latency before the end, then poll: a late wake-up
                    # (100-300 us where halt-polling is off) would otherwise run past the token.
                    while (r := d - perf()) > WAKE_MARGIN_S:
                        time.sleep(r - WAKE_MARGIN_S)
                    while perf() < d:
                        pass
                    left -= fit
                busy_ms = (busy_clock() - c0) * 1000.0
                m1 = mono()
                log.append((m0, m0 + busy_ms / 1000.0))
                wall.append((m0, m1))
                if not reuse:
                    client.release(busy_ms, completed=left == 0)
                elif left:  # the token ran out mid-burst: Gemini revocation, then ask again
                    client.release_if_held(completed=False)
            if reuse:
                client.end_burst()
        if reuse:
            client.idle()  # the phase ended: no more work queued
    client.close()
    conn.send((log, wall))
    conn.close()


def _stall_probe(
    seconds: float, device_core: int | None, conn: Connection
) -> None:  # pragma: no cover - child
    """The machine's own stalls: spin ``KERNEL_MS`` kernels back to back (no tokens) on the
    device core for ``seconds`` and send back the lengths (ms) of those stretched past 1 ms (the
    process was descheduled or its CPU stalled mid-kernel), and the kernel count."""
    if device_core is not None:
        os.sched_setaffinity(0, {device_core})
    gc.disable()
    perf = time.perf_counter
    spin_s = KERNEL_MS / 1000.0
    stalls: list[float] = []
    n = 0
    t_end = perf() + seconds
    while perf() < t_end:
        a = perf()
        d = a + spin_s
        while perf() < d:
            pass
        b = perf()
        n += 1
        if b - a > 0.001:
            stalls.append((b - a) * 1000.0)
    conn.send((stalls, n))
    conn.close()


def stall_probe(seconds: float, device_core: int | None) -> dict[str, float]:
    """Run ``_stall_probe`` in a fresh process; summarise it (nothing when ``seconds`` <= 0)."""
    if seconds <= 0:
        return {}
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_stall_probe, args=(seconds, device_core, there), daemon=True)
    proc.start()
    if not here.poll(seconds + 60):
        sys.exit("the stall probe did not finish")
    stalls, n = here.recv()
    proc.join(10)
    return {
        "probe_s": seconds,
        "probe_kernels": n,
        "probe_stalls": len(stalls),
        "probe_stalls_per_min": len(stalls) / seconds * 60.0,
        "probe_max_stall_ms": max(stalls, default=0.0),
    }


def _busy(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)


def _max_over_limit_pp(
    intervals: Sequence[tuple[float, float]],
    limit_pct: float,
    k0: int,
    k1: int,
    origin: float,
    w_s: float,
) -> float:
    """Max over windows k0..k1-1 of (usage / W - limit) in pp, clipped at 0."""
    use = [0.0] * (k1 - k0)
    for a, b in intervals:
        i0 = max(k0, int((a - origin) // w_s))
        i1 = min(k1 - 1, int((b - origin) // w_s))
        for k in range(i0, i1 + 1):
            lo = origin + k * w_s
            use[k - k0] += max(0.0, min(b, lo + w_s) - max(a, lo))
    return max([0.0] + [u / w_s * 100.0 - limit_pct for u in use])


def run_scenario(
    name: str,
    plans: Sequence[Plan],
    phase_s: float,
    settle_s: float,
    tmp: str,
    device: str = "spin",
    reuse: bool = True,
    config: TokenConfig = LIVE_TOKEN_CONFIG,
    device_core: int | None = None,
) -> tuple[list[dict[str, object]], dict[str, float]]:
    """Run one scenario; return one row per (phase, client) and its over-limit figures."""
    w_s = config.window_ms / 1000.0
    path = os.path.join(tmp, f"{name}.sock")
    server = TokenServer(path, config, record_tokens=1_000_000)
    for p in plans:
        server.add_client(ClientSpec(p.name, 100.0, p.request_pct / 100, p.limit_pct / 100))
    server.start()
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    try:
        for p in plans:
            here, there = ctx.Pipe()
            kernels = round(p.burst_ms / KERNEL_MS)
            proc = ctx.Process(
                target=_worker,
                args=(path, p.name, kernels, device, reuse, there, device_core),
                daemon=True,
            )
            proc.start()
            procs.append(proc)
            pipes.append(here)
        for here in pipes:
            if not here.poll(60) or here.recv() != "ready":
                sys.exit(f"{name}: an instance did not start")
        n_phases = len(plans[0].expected_pct)
        t_go = time.monotonic() + 0.2
        for p, here in zip(plans, pipes, strict=True):
            here.send(
                [
                    (t_go + i * phase_s, t_go + (i + 1) * phase_s)
                    for i, e in enumerate(p.expected_pct)
                    if e is not None
                ]
            )
        logs, walls = {}, {}
        for p, here in zip(plans, pipes, strict=True):
            if not here.poll(n_phases * phase_s + 60):
                sys.exit(f"{name}: instance {p.name} did not finish")
            logs[p.name], walls[p.name] = here.recv()
        for proc in procs:
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        records: list[TokenRecord] = server.token_records()
        server.stop()

    srv_iv: dict[str, list[tuple[float, float]]] = {p.name: [] for p in plans}
    overruns, overrun_ms = 0, 0.0
    for r in records:
        srv_iv[r.client_id].append((r.start_s, r.start_s + r.busy_ms / 1000.0))
        if r.busy_ms > r.quota_ms + 1e-9:
            overruns += 1
            overrun_ms += r.busy_ms - r.quota_ms
    rows: list[dict[str, object]] = []
    for i in range(n_phases):
        t0, t1 = t_go + i * phase_s + settle_s, t_go + (i + 1) * phase_s
        for p in plans:
            exp = p.expected_pct[i]
            got = _busy(srv_iv[p.name], t0, t1) / (t1 - t0) * 100.0
            got_client = _busy(logs[p.name], t0, t1) / (t1 - t0) * 100.0
            rows.append(
                {
                    "scenario": name,
                    "phase": i + 1,
                    "client": p.name,
                    "request_limit": f"{p.request_pct:g}/{p.limit_pct:g}",
                    "expected_pct": exp,
                    "share_pct": got,
                    "share_client_pct": got_client,
                    "error_pp": abs(got - exp) if exp is not None else None,
                    "over_limit_pp": max(0.0, got - p.limit_pct),
                }
            )
    # every whole window from the start to the end of the run
    k0 = int((t_go - server.epoch_s) // w_s) + 1
    k1 = int((t_go + n_phases * phase_s - server.epoch_s) // w_s)
    over = max(
        _max_over_limit_pp(srv_iv[p.name], p.limit_pct, k0, k1, server.epoch_s, w_s) for p in plans
    )
    # Why: which over-limit windows hold an overrun token of that client.
    over_windows, over_with_overrun, max_overrun = 0, 0, 0.0
    for p in plans:
        runs = [
            (r.start_s, r.start_s + r.busy_ms / 1000.0)
            for r in records
            if r.client_id == p.name and r.busy_ms > r.quota_ms + 1e-9
        ]
        max_overrun = max(
            [max_overrun] + [r.busy_ms - r.quota_ms for r in records if r.client_id == p.name]
        )
        for k in range(k0, k1):
            lo = server.epoch_s + k * w_s
            if _max_over_limit_pp(srv_iv[p.name], p.limit_pct, k, k + 1, server.epoch_s, w_s) > 0:
                over_windows += 1
                over_with_overrun += any(a < lo + w_s and b > lo for a, b in runs)
    over_client = max(
        _max_over_limit_pp(logs[p.name], p.limit_pct, k0, k1, server.epoch_s, w_s) for p in plans
    )
    over_wall = max(
        _max_over_limit_pp(walls[p.name], p.limit_pct, k0, k1, server.epoch_s, w_s) for p in plans
    )
    return rows, {
        "over_limit_pp": over,
        "over_limit_client_pp": over_client,
        "over_limit_wall_pp": over_wall,
        "overruns": overruns,
        "overrun_ms": overrun_ms,
        "max_overrun_ms": max_overrun,
        "over_windows": over_windows,
        "over_windows_with_overrun": over_with_overrun,
        "tokens": len(records),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--phase-s", type=float, default=None, help="phase length (3; quick 1)")
    parser.add_argument(
        "--device",
        choices=("spin", "sleep"),
        default="spin",
        help="what a kernel is: CPU spinning (default) or an asynchronous device wait",
    )
    parser.add_argument(
        "--protocol",
        choices=("reuse", "per-burst"),
        default="reuse",
        help="token reuse across back-to-back bursts (the runtime's, default) or one per burst",
    )
    add_token_config_option(parser)
    parser.add_argument(
        "--probe-s",
        type=float,
        default=None,
        help="length of the stall probe before the scenarios (10 s; quick 3 s; 0 skips it)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the instances to one core and the token server to the others",
    )
    args = parser.parse_args()
    config = live_token_config(args)
    cores = sorted(os.sched_getaffinity(0))
    device_core = None
    if not args.no_pin and len(cores) >= 2:
        # The "device" is the last core: the instances' kernels run there, and the token server
        # (the node agent's role) and this driver run on the others, as a GPU's token server
        # runs on the host CPU, not on the GPU it schedules.
        device_core = cores[-1]
        os.sched_setaffinity(0, cores[:-1])
    load = machine_load()  # before our own load
    phase_s = args.phase_s or (1.0 if args.quick else 3.0)
    settle_s = 0.2 if args.quick else 0.4

    tmp = tempfile.mkdtemp(prefix="gs-share-", dir="/tmp")
    rows: list[dict[str, object]] = []
    per_scenario: dict[str, dict[str, float]] = {}
    probe = stall_probe(
        args.probe_s if args.probe_s is not None else (3.0 if args.quick else 10.0), device_core
    )
    try:
        for name, plans in scenarios(args.quick):
            r, extra = run_scenario(
                name,
                plans,
                phase_s,
                settle_s,
                tmp,
                args.device,
                args.protocol == "reuse",
                config,
                device_core,
            )
            rows += r
            per_scenario[name] = extra
    finally:
        os.rmdir(tmp)

    errors = [float(r["error_pp"]) for r in rows if r["error_pp"] is not None]  # type: ignore[arg-type]
    summary = {
        "max_abs_share_error_pp": max(errors),
        "mean_abs_share_error_pp": sum(errors) / len(errors),
        "max_over_limit_pp": max(s["over_limit_pp"] for s in per_scenario.values()),
        "max_over_limit_client_pp": max(s["over_limit_client_pp"] for s in per_scenario.values()),
        "max_over_limit_wall_pp": max(s["over_limit_wall_pp"] for s in per_scenario.values()),
        "max_phase_over_limit_pp": max(float(r["over_limit_pp"]) for r in rows),  # type: ignore[arg-type]
        "overruns": int(sum(s["overruns"] for s in per_scenario.values())),
        "overrun_ms": sum(s["overrun_ms"] for s in per_scenario.values()),
        "max_overrun_ms": max(s["max_overrun_ms"] for s in per_scenario.values()),
        "over_windows": int(sum(s["over_windows"] for s in per_scenario.values())),
        "over_windows_with_overrun": int(
            sum(s["over_windows_with_overrun"] for s in per_scenario.values())
        ),
        "tokens": int(sum(s["tokens"] for s in per_scenario.values())),
        "phase_s": phase_s,
        "device": args.device,
        "protocol": args.protocol,
        "token_config": asdict(config),
        "device_core": device_core,
        **probe,
    }
    print_table(
        "share accuracy (live token server, busy instance processes, W = 40 ms)",
        [
            "scenario",
            "phase",
            "client",
            "req/lim %",
            "expected %",
            "share %",
            "client log %",
            "error pp",
        ],
        [
            [
                r["scenario"],
                r["phase"],
                r["client"],
                r["request_limit"],
                "idle" if r["expected_pct"] is None else r["expected_pct"],
                r["share_pct"],
                r["share_client_pct"],
                r["error_pp"],
            ]
            for r in rows
        ],
    )
    print_table(
        "per-window limits",
        [
            "scenario",
            "tokens",
            "over limit pp (server)",
            "over limit pp (client)",
            "over limit pp (wall)",
            "overruns",
            "overrun ms",
            "max overrun ms",
            "over windows",
            "with overrun",
        ],
        [
            [
                n,
                int(s["tokens"]),
                s["over_limit_pp"],
                s["over_limit_client_pp"],
                s["over_limit_wall_pp"],
                int(s["overruns"]),
                s["overrun_ms"],
                s["max_overrun_ms"],
                int(s["over_windows"]),
                int(s["over_windows_with_overrun"]),
            ]
            for n, s in per_scenario.items()
        ],
    )
    print(
        f"max_abs_share_error_pp = {summary['max_abs_share_error_pp']:.2f} (target <= 3), "
        f"max_over_limit_pp = {summary['max_over_limit_pp']:.3f} (target 0), "
        f"client view {summary['max_over_limit_client_pp']:.3f}, wall-clock holding "
        f"{summary['max_over_limit_wall_pp']:.3f}; "
        f"{summary['over_windows']} over-limit (client, window) pairs, "
        f"{summary['over_windows_with_overrun']} of them with an overrun token "
        f"(max overrun {summary['max_overrun_ms']:.3f} ms)"
    )
    if probe:
        print(
            f"machine stalls (a bare {KERNEL_MS} ms spin on the device core, no tokens, "
            f"{probe['probe_s']:g} s): {probe['probe_stalls']} kernels stretched past 1 ms "
            f"({probe['probe_stalls_per_min']:.1f} per min), "
            f"longest {probe['probe_max_stall_ms']:.2f} ms"
        )
    load_end = machine_load()  # other work that started during the run shows here
    summary.update(load)
    summary.update({f"{k}_end": v for k, v in load_end.items() if k != "cpus"})
    print(f"machine load at start: {load}; at the end: {load_end}")
    write_json(args.json, summary, rows=rows, scenarios=per_scenario)


if __name__ == "__main__":
    main()
