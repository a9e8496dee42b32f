"""Model sharing: memory (PSS) of N instance processes of one model, with and without the store.

What it measures (FaST-GShare §3.5, docs/DESIGN.md §5 "model sharing"): the joint memory footprint
of N = 1 and N = 4 instance processes serving one model with >= 1 GB of weights (bert-large,
335 M parameters, 1.34 GB fp32). The required rows run the runtime's own path: the node's
template process (``gshare.runtime.node.launcher.Launcher``, what the agent uses by default) forks
N real ``InstanceServer`` processes (token client on a ``TokenServer`` in this process, the
data path on a Unix socket), and each answers one request on the model's example input:

* ``fork-shared``   — the weights are put ONCE in the node's model store (``/dev/shm``) by a
  one-off child (``node.tasks.put_weights``, the agent's job); each instance builds the model
  on the meta device and maps the stored tensors;
* ``fork-unshared`` — no store: each instance initialises its own copy of the weights.

The template's PSS is counted with its instances (it holds the import heap they share
copy-on-write). For comparison, the same without the template — N processes that each import
the runtime themselves, as with ``gshare serve --launcher ray`` (one Ray actor each; Ray's own
per-worker memory not counted) — ``--no-spawn`` skips them:

* ``spawn-shared`` / ``spawn-unshared`` — as above, in separately started processes;
* ``spawn-runtime`` — processes that import the same runtime (torch, transformers, the model
  class) but load no weights: the per-process cost that sharing weights alone cannot remove.

The bench sums ``psutil.Process(pid).memory_full_info().pss`` over the processes (PSS: a page
shared by k processes counts 1/k in each, so the sum is their real joint footprint; the store's
pages are pre-faulted by every mapper, so none is left out). Every instance uses 1 intra-op
thread so that the modes differ only in how weights and imports are held.

    .venv/bin/python bench/model_sharing.py [--quick] [--json PATH] [--instances 4] [--no-spawn]

``--quick`` uses bert-base (110 M parameters, 0.44 GB) instead and says so. Writes
``{"summary": {"ratio_4_vs_1_shared", "ratio_4_vs_1_unshared", "pss_mb", ...}, "rows": [...]}``
(the required ratios are the ``fork-`` rows); targets: shared <= 1.5, unshared >= 3.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from _common import bench_parser, print_table, write_json

MB = float(1 << 20)
HERE = Path(__file__).resolve()


# -- the measured processes ----------------------------------------------------------------------


def child(mode: str, model: str, root: str) -> None:
    """One process: import, load (``mode``), infer once, report, wait for stdin to close."""
    import torch

    torch.set_num_threads(1)
    from gshare.runtime.instance.builtin_models import BUILTIN_HANDLERS
    from gshare.runtime.instance.loading import load_handler, state_dict_for, weights_key
    from gshare.runtime.instance.models import build_on_meta, shares_weights
    from gshare.runtime.node.model_store import ModelStore
    from gshare.spec import load_function_spec

    spec = load_function_spec({"name": "bench", "model": model, "device": "cpu"})
    t0 = time.perf_counter()
    info: dict[str, Any] = {"mode": mode}
    if mode == "build":  # the agent's job: weights into the store once, then exit
        store = ModelStore(root)
        store.put(weights_key(spec), state_dict_for(spec))
        info["store_bytes"] = store.nbytes(weights_key(spec))
        print(json.dumps(info), flush=True)
        return
    if mode == "runtime":  # same imports and model class, no weights (a meta skeleton)
        build_on_meta(BUILTIN_HANDLERS[model]().build)
    else:
        store = ModelStore(root) if mode == "shared" else None
        h = load_handler(spec, store=store)
        info["load_s"] = time.perf_counter() - t0
        out = h.predict([h.example_input()])
        info["output"] = out[0]
        module = h.module  # type: ignore[attr-defined]
        info["params_m"] = sum(p.numel() for p in module.parameters()) / 1e6
        if store is not None:
            info["zero_copy"] = shares_weights(module, store.get(weights_key(spec)))
    print(json.dumps(info), flush=True)
    sys.stdin.read()


# -- the driver ----------------------------------------------------------------------------------


def _measure(pids: list[int]) -> list[Any]:
    return [psutil.Process(pid).memory_full_info() for pid in pids]


def _row(mode: str, n: int, mems: list[Any], infos: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "mode": mode,
        "instances": n,
        "processes": len(mems),
        "pss_mb": sum(m.pss for m in mems) / MB,
        "uss_mb": sum(m.uss for m in mems) / MB,
        "rss_mb": sum(m.rss for m in mems) / MB,
        "load_s_max": max((i.get("load_s", 0.0) for i in infos), default=0.0),
        "zero_copy": all(i.get("zero_copy", True) for i in infos),
        "params_m": next((i["params_m"] for i in infos if i.get("params_m")), None),
        "outputs_agree": len({json.dumps(i.get("output")) for i in infos}) == 1,
    }


def run_fork_group(shared: bool, model: str, root: str, n: int, work: str) -> dict[str, Any]:
    """The runtime's path: the node's template forks ``n`` real instances (``InstanceServer``),
    each answers one request on the model's example input; measured with the template."""
    from gshare.policy.tokens import ClientSpec, TokenConfig
    from gshare.runtime.instance import protocol as P
    from gshare.runtime.instance.launch import InstanceLaunch, launch_to_dict
    from gshare.runtime.node.launcher import Launcher
    from gshare.runtime.tokens import TokenServer

    mode = "fork-shared" if shared else "fork-unshared"
    spec = {"name": "bench", "model": model, "device": "cpu"}
    ts = TokenServer(f"{work}/tokens.sock", TokenConfig())
    ts.start()
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GSHARE_TINY_MODELS": ""}
    lau = Launcher(env)
    lau.start()
    try:
        lau.preload(model)  # the model's classes in the template, as the agent does
        key = lau.call("gshare.runtime.node.tasks:put_weights", [root, spec]) if shared else None
        launches = []
        for k in range(n):
            iid = f"{mode}-{n}-{k}"
            ts.add_client(ClientSpec(iid, 100.0, 1.0, 1.0))
            launches.append(
                InstanceLaunch(
                    instance_id=iid,
                    function="bench",
                    spec=spec,
                    sm_pct=100.0 / (os.cpu_count() or 1),  # one core: one intra-op thread
                    quota_request=1.0,
                    quota_limit=1.0,
                    mem_mb=0.0,
                    priority=0,
                    max_batch=1,
                    max_wait_ms=0.0,
                    token_socket=ts.socket_path,
                    uds_path=f"{work}/{iid}.sock",
                    model_key=key,
                    store_root=root,
                )
            )
        t0 = time.perf_counter()
        pids = [lau.launch(launch_to_dict(la), f"{work}/{la.instance_id}.log") for la in launches]
        infos: list[dict[str, Any]] = []
        for la, pid in zip(launches, pids, strict=True):
            ready = Path(la.uds_path + ".ready")
            while not ready.exists():
                if lau.exit_code(pid) is not None:
                    log = Path(f"{work}/{la.instance_id}.log").read_text()[-2000:]
                    raise RuntimeError(f"{mode} instance {pid} died:\n{log}")
                time.sleep(0.05)
            status, out = P.call_once(la.uds_path, P.OP_EXAMPLE, P.ENC_RAW, b"", 600)
            if status != P.ST_OK:
                raise RuntimeError(f"{mode} instance {pid}: {out.decode(errors='replace')}")
            infos.append({"load_s": time.perf_counter() - t0, "output": json.loads(out)})
        assert lau.pid is not None
        mems = _measure([lau.pid, *pids])
    finally:
        lau.stop()
        ts.stop()
    return _row(mode, n, mems, infos)


def run_spawn_group(mode: str, model: str, root: str, n: int) -> dict[str, Any]:
    """``spawn-*``: start ``n`` processes that each import the runtime, wait until all are
    ready, measure, stop."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("GSHARE_TINY_MODELS", None)
    cmd = [
        sys.executable,
        str(HERE),
        "--model",
        model,
        "--root",
        root,
        "--child",
        mode.removeprefix("spawn-"),
    ]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]
    try:
        infos = []
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{mode} process {p.pid} died (exit {p.wait()})")
            infos.append(json.loads(line))
        mems = _measure([p.pid for p in procs])
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=120)
    return _row(mode, n, mems, infos)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--model", default=None, help="built-in model (default: bert-large, bert-base with --quick)"
    )
    parser.add_argument("--instances", type=int, default=4, help="N of the large group")
    parser.add_argument("--child", default=None, help=argparse_hidden())
    parser.add_argument("--root", default=None, help=argparse_hidden())
    parser.add_argument(
        "--no-spawn",
        action="store_true",
        help="skip the comparison rows of separately started processes",
    )
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.model, args.root)
        return {}

    model = args.model or ("bert-base" if args.quick else "bert-large")
    n = args.instances
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    root = f"{base}/gshare-bench-{os.getuid()}-{uuid.uuid4().hex[:8]}"
    work = tempfile.mkdtemp(prefix="gsms-", dir="/tmp")  # short: Unix socket paths
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        build = subprocess.run(
            [sys.executable, str(HERE), "--child", "build", "--model", model, "--root", root],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        store_mb = json.loads(build.stdout.strip().splitlines()[-1])["store_bytes"] / MB
        build_s = time.perf_counter() - t0
        for shared in (True, False):
            for k in (1, n):
                rows.append(run_fork_group(shared, model, root, k, work))
                print(f"  {rows[-1]['mode']} N={k}: {rows[-1]['pss_mb']:,.0f} MB PSS", flush=True)
        if not args.no_spawn:
            for mode in ("spawn-runtime", "spawn-unshared", "spawn-shared"):
                for k in (1, n):
                    rows.append(run_spawn_group(mode, model, root, k))
                    print(f"  {mode} N={k}: {rows[-1]['pss_mb']:,.0f} MB PSS", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    def pss(mode: str, k: int) -> float:
        return next(r["pss_mb"] for r in rows if r["mode"] == mode and r["instances"] == k)

    ratio_shared = pss("fork-shared", n) / pss("fork-shared", 1)
    ratio_unshared = pss("fork-unshared", n) / pss("fork-unshared", 1)
    note = (
        f"--quick: {model} instead of bert-large (smaller weights, so the per-process "
        "runtime weighs more in the ratios)"
        if args.quick and args.model is None
        else ""
    )
    summary: dict[str, Any] = {
        "model": model,
        "quick": args.quick,
        "note": note,
        "instances": n,
        "params_m": next(r["params_m"] for r in rows if r["params_m"])
        if not args.no_spawn
        else None,
        "weights_mb": store_mb,
        "store_build_s": build_s,
        "pss_mb": {f"{r['mode']}_{r['instances']}": r["pss_mb"] for r in rows},
        f"ratio_{n}_vs_1_shared": ratio_shared,
        f"ratio_{n}_vs_1_unshared": ratio_unshared,
        f"saving_{n}_mb": pss("fork-unshared", n) - pss("fork-shared", n),
        # Per added instance, beyond the first (the template and one copy of the weights).
        "fork_shared_mb_per_extra_instance": (pss("fork-shared", n) - pss("fork-shared", 1))
        / (n - 1),
        "outputs_agree": all(r["outputs_agree"] for r in rows),
        "target_shared_max": 1.5,
        "target_unshared_min": 3.0,
        "pass_shared": ratio_shared <= 1.5,
        "pass_unshared": ratio_unshared >= 3.0,
    }
    if not args.no_spawn:
        runtime_per_proc = pss("spawn-runtime", n) / n
        summary.update(
            {
                f"ratio_{n}_vs_1_shared_spawn": pss("spawn-shared", n) / pss("spawn-shared", 1),
                f"ratio_{n}_vs_1_unshared_spawn": pss("spawn-unshared", n)
                / pss("spawn-unshared", 1),
                "spawn_runtime_pss_per_process_mb": runtime_per_proc,
                # The weights' part alone (PSS minus the runtime-only processes): ~1 when N
                # instances cost one copy of the weights, ~N when each has its own.
                f"weights_ratio_{n}_vs_1_shared": (pss("spawn-shared", n) - pss("spawn-runtime", n))
                / (pss("spawn-shared", 1) - pss("spawn-runtime", 1)),
                "zero_copy": all(r["zero_copy"] for r in rows),
            }
        )
    if n == 4:  # the names the brief asks for
        summary["ratio_4_vs_1_shared"] = ratio_shared
        summary["ratio_4_vs_1_unshared"] = ratio_unshared

    title = f"model sharing: {model} ({store_mb:,.0f} MB of weights)"
    print_table(
        title,
        [
            "mode",
            "N",
            "processes",
            "PSS sum MB",
            "USS sum MB",
            "RSS sum MB",
            "PSS vs N=1",
            "ready s (max)",
        ],
        [
            [
                r["mode"],
                r["instances"],
                r["processes"],
                r["pss_mb"],
                r["uss_mb"],
                r["rss_mb"],
                r["pss_mb"] / pss(r["mode"], 1),
                r["load_s_max"],
            ]
            for r in rows
        ],
    )
    print(
        f"runtime path (forked from the node's template): ratio {n} vs 1 shared "
        f"{ratio_shared:.2f} (target <= 1.5), unshared {ratio_unshared:.2f} (target >= 3); "
        f"saving at N={n}: {summary[f'saving_{n}_mb']:,.0f} MB; each extra instance costs "
        f"{summary['fork_shared_mb_per_extra_instance']:,.0f} MB"
    )
    if not args.no_spawn:
        print(
            f"separately started processes (--launcher ray): shared "
            f"{summary[f'ratio_{n}_vs_1_shared_spawn']:.2f}x, unshared "
            f"{summary[f'ratio_{n}_vs_1_unshared_spawn']:.2f}x; weights alone "
            f"{summary[f'weights_ratio_{n}_vs_1_shared']:.2f}x; the runtime (python, torch, "
            f"transformers) costs {summary['spawn_runtime_pss_per_process_mb']:,.0f} MB PSS "
            "per process there"
        )
    if note:
        print(note)
    write_json(
        args.json, summary, rows=rows, params={"model": model, "instances": n, "quick": args.quick}
    )
    return summary


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
