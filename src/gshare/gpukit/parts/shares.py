"""Part c: do processes get the time shares the token server gives them?

Three scenes, each a group of saturating processes under one token server (requests, limits):

* ``pair``   two processes at quota 0.3 and 0.6 (request = limit);
* ``lone``   one process at request 0.2, limit 0.5 (alone, it takes idle time up to its limit);
* ``three``  three processes at request 0.2, limit 0.6 (the idle 0.4 is shared out: 1/3 each).

Each runs with the probe (a 500-us kernel in batches of 16; on the GPU or the stub) and, on a
GPU, the pair again with resnet50 at batch 8 (PyTorch, ``LD_PRELOAD``). A process's share is
measured twice where it can be: the device time the interposer reported (the token server's
records: ``[start, start + busy]`` per token) over the run, and its throughput over its
throughput alone at quota 1.0. ``max_abs_share_error_pp`` is the worst |share - expected| in
percentage points (device time); ``max_over_limit_pp`` the worst excess of one scheduler window's
device time over a process's limit. On the stub the figures are reported without a verdict: the
stub's accuracy on a loaded 2-core host is tests/native's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gshare.gpukit.parts.common import (
    Deadline,
    KitContext,
    Proc,
    add_client,
    check,
    deployment_env,
    last_json,
    part_main,
    probe_argv,
    skipped,
    start,
    stub_env,
    token_env,
    token_server,
    workload_argv,
)
from gshare.gpukit.results import Figure, PartResult, judge

WARMUP_S = 0.5
"""Left out of the measurement: the first windows are a transient (kernels not yet timed)."""


def charged(records: Sequence[Any], client: str, t0: float, t1: float) -> float:
    """Seconds of device time charged to ``client`` inside [t0, t1]."""
    total = 0.0
    for r in records:
        if r.client_id == client:
            a, b = r.start_s, r.start_s + r.busy_ms / 1000.0
            total += max(0.0, min(b, t1) - max(a, t0))
    return total


def window_shares(
    records: Sequence[Any], client: str, t0: float, t1: float, epoch_s: float, window_s: float
) -> list[float]:
    """The client's charged device time per whole scheduler window inside [t0, t1], as a
    fraction of the window (windows aligned to the server's ``epoch_s``)."""
    k0 = int((t0 - epoch_s) / window_s) + 1
    k1 = int((t1 - epoch_s) / window_s)
    return [
        charged(records, client, epoch_s + k * window_s, epoch_s + (k + 1) * window_s) / window_s
        for k in range(k0, k1)
    ]


def _group(
    ctx: KitContext,
    work: Path,
    scene: str,
    clients: dict[str, tuple[float, float]],
    argv: Callable[[str], list[str]],
    env_extra: dict[str, str],
    seconds: float,
    ready_s: float,
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """Run one saturating process per client at once; returns each one's output words or
    JSON, its device share (charged / wall) and its worst window excess over its limit (pp)."""
    with token_server(work, f"c-{scene}") as ts:
        procs: dict[str, Proc] = {}
        for cid, (req, lim) in clients.items():
            add_client(ts, cid, req, lim)
            env = deployment_env(ctx, "preload", **token_env(ts, cid), **env_extra)
            procs[cid] = start(f"c-{scene}-{cid}", argv(cid), env, work)
        try:
            for p in procs.values():
                p.expect("ready", ready_s)
            t0 = ts._clock()  # noqa: SLF001 -- the server's clock (time.monotonic)
            for p in procs.values():
                p.go()
            outs = {cid: p.finish(seconds + 120) for cid, p in procs.items()}
            t1 = ts._clock()  # noqa: SLF001
        finally:
            for p in procs.values():
                if p.popen.poll() is None:
                    p.popen.kill()
        records = ts.token_records()
        epoch, w = ts.epoch_s, ts.config.window_ms / 1000.0
    m0, m1 = t0 + WARMUP_S, min(t1, t0 + seconds)
    shares = {c: charged(records, c, m0, m1) / (m1 - m0) for c in clients}
    over = {
        c: max([0.0, *(x - clients[c][1] for x in window_shares(records, c, m0, m1, epoch, w))])
        * 100.0
        for c in clients
    }
    return outs, shares, over


PROBE_KERNEL_US = 500
"""The probe's kernel length in the share scenes (its ``saturate`` mode)."""
PROBE_BATCH = 16
"""Kernels the probe launches between two synchronisations (one burst)."""


def _probe_argv(ctx: KitContext, seconds: float) -> Callable[[str], list[str]]:
    return lambda _cid: probe_argv(
        ctx, "saturate", f"{seconds:g}", str(PROBE_KERNEL_US), str(PROBE_BATCH)
    )


def _launches(out: str) -> int:
    words = out.split()
    return int(words[words.index("launches") + 1]) - int(words[-1])


SCENES: dict[str, tuple[dict[str, tuple[float, float]], dict[str, float]]] = {
    # scene: (clients (request, limit), expected share)
    "pair": ({"q03": (0.3, 0.3), "q06": (0.6, 0.6)}, {"q03": 0.3, "q06": 0.6}),
    "lone": ({"lone": (0.2, 0.5)}, {"lone": 0.5}),
    "three": (
        {"e1": (0.2, 0.6), "e2": (0.2, 0.6), "e3": (0.2, 0.6)},
        {"e1": 1 / 3, "e2": 1 / 3, "e3": 1 / 3},
    ),
}


def _figures(
    scene: str,
    label: str,
    shares: dict[str, float],
    over: dict[str, float],
    expected: dict[str, float],
    on: str,
    verdict: bool,
    thr_shares: dict[str, float] | None = None,
) -> list[Figure]:
    err = max(abs(shares[c] - expected[c]) * 100.0 for c in expected)
    worst_over = max(over.values())
    note = ", ".join(f"{c} {shares[c]:.3f} (expected {expected[c]:.3f})" for c in expected)
    note += f"; together {sum(shares.values()):.3f} of the device"
    tgt_err = 3.0
    figs = [
        check(f"max_abs_share_error_pp_{label}", round(err, 2), "<=", tgt_err, "pp", on, note),
        check(
            f"max_over_limit_pp_{label}",
            round(worst_over, 2),
            "<=",
            0.0,
            "pp",
            on,
            "worst window's device time over the limit",
        ),
    ]
    if thr_shares:
        terr = max(abs(thr_shares[c] - expected[c]) * 100.0 for c in expected)
        figs.append(
            Figure(
                f"max_abs_share_error_pp_throughput_{label}",
                round(terr, 2),
                "<= 3",
                None,
                "pp",
                on,
                ", ".join(f"{c} {thr_shares[c]:.3f}" for c in expected) + " (throughput / alone)",
            )
        )
    if not verdict:
        for f in figs:
            f.passed = None
            f.note += "; the targets apply on a GPU"
    return figs


def run(ctx: KitContext, budget_s: float) -> PartResult:
    dl = Deadline(budget_s)
    work = Path(ctx.work)
    figs: list[Figure] = []
    seconds = 3.0
    stub = stub_env(ctx, gk_busy=500)
    alone: float | None = None
    try:
        outs, _, _ = _group(
            ctx, work, "alone", {"alone": (1.0, 1.0)}, _probe_argv(ctx, 2.0), stub, 2.0, 60
        )
        alone = _launches(outs["alone"]) / 2.0
    except RuntimeError as e:
        figs.append(skipped("probe_alone_launches_per_s", str(e), ctx.on))
    for scene, (clients, expected) in SCENES.items():
        if not dl.enough(seconds + 15):
            figs.append(skipped(f"max_abs_share_error_pp_probe_{scene}", "no time left", ctx.on))
            continue
        try:
            outs, shares, over = _group(
                ctx, work, scene, clients, _probe_argv(ctx, seconds), stub, seconds, 60
            )
        except RuntimeError as e:
            figs.append(skipped(f"max_abs_share_error_pp_probe_{scene}", str(e), ctx.on))
            continue
        thr = {c: _launches(outs[c]) / seconds / alone for c in clients} if alone else None
        figs += _figures(scene, f"probe_{scene}", shares, over, expected, ctx.on, ctx.gpu, thr)
    if not ctx.gpu:
        figs.append(skipped("max_abs_share_error_pp_resnet50_pair", ctx.no_gpu_reason()))
        return judge(figs, False, ctx.no_gpu_reason())
    if not dl.enough(45):
        figs.append(skipped("max_abs_share_error_pp_resnet50_pair", "no time left"))
        return judge(figs, True, "")
    secs = max(4.0, min(8.0, (dl.left() - 35) / 2))

    def wl(_cid: str) -> list[str]:
        return workload_argv(
            ctx,
            "resnet50",
            "--mode",
            "saturate",
            "--batch",
            "8",
            "--seconds",
            f"{secs:g}",
            "--wait-go",
        )

    try:
        outs, _, _ = _group(ctx, work, "r50-alone", {"alone": (1.0, 1.0)}, wl, {}, secs, 120)
        r_alone = last_json(outs["alone"])["items_per_s"]
        outs, shares, over = _group(ctx, work, "r50-pair", SCENES["pair"][0], wl, {}, secs, 120)
        thr = {c: last_json(outs[c])["items_per_s"] / r_alone for c in SCENES["pair"][0]}
        figs += _figures("pair", "resnet50_pair", shares, over, SCENES["pair"][1], "gpu", True, thr)
    except (RuntimeError, KeyError, ValueError) as e:
        figs.append(skipped("max_abs_share_error_pp_resnet50_pair", str(e)))
    return judge(figs, True, "")


if __name__ == "__main__":
    part_main(run)
