"""Kernel launches through the CUDA interposer (libgshare_cuda.so) vs directly, on the stub driver.

Usage: ``python bench/interposer.py [--quick] [--json PATH] [--repeat N] [--launches N]``

Set-up: ``tests/native/stub_cuda.c`` built as ``libcuda.so.1`` (a simulated device, no GPU) and
``tests/native/cuda_app.c``, whose ``bench`` mode times N back-to-back ``cuLaunchKernel`` calls
of 0-us kernels on the host (best of 5 loops; the device drains the queue after the loop, not
timed). The stub's launch is itself a mutex, a queue append and a condition-variable signal,
so "direct" is a cheap driver, not a real one: the figure of interest is the difference.

Cases (alternated in every one of ``--repeat`` runs, so machine drift spreads over all):

* ``direct`` -- no interposer;
* ``preloaded, ungoverned`` -- LD_PRELOAD, no token server configured (pass-through);
* ``token held, direct`` / ``token held, cuGetProcAddress`` -- LD_PRELOAD and a real
  ``TokenServer`` (this process) granting 10-s tokens to a client alone with request = limit =
  1: after the first launch every launch takes the fast path (the token is held and the kernel
  fits) -- the cost FaST-GShare and HAMi pay per launch. The interposer's own counters
  (``GSHARE_CUDA_STATS``) give the fast-path fraction;
* ``token held, shim`` -- the same, in the shim deployment: no ``LD_PRELOAD``; the
  ``libcuda.so.1`` built from the interposer and the stub (``native.build_shim``) first on
  ``LD_LIBRARY_PATH`` (x86-64 only; the case is left out elsewhere).

With ``strace`` on the machine, one extra run of ``direct`` and ``token held`` under
``strace -f -c`` counts system calls per launch: the fast path must add none (a mutex that is
not contended, a vDSO clock read and a hash lookup; 1 launch in 64 records two sampling events,
which the stub turns into two more queue appends).

Summary: ``added_ns_per_launch_token_held`` (median over runs of held - direct, same run;
target <= 1000 ns), ``..._gpa``, ``..._shim``, ``added_ns_per_launch_ungoverned``,
``launches_per_s_direct``, ``launches_per_s_token_held``, ``fast_path_fraction``,
``syscalls_per_launch_direct`` / ``..._token_held`` (all calls; futex wake-ups of the stub's
device thread vary with how often it sleeps, which the loop's pace changes) and
``non_futex_syscalls_per_launch_*``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import bench_parser, machine_load, print_table, write_json
from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.runtime import native
from gshare.runtime.tokens import TokenServer

ROOT = Path(__file__).resolve().parents[1]
LONG = TokenConfig(window_ms=10_000.0, max_token_ms=10_000.0, idle_token_ms=10_000.0)


def compile_stub(d: Path) -> Path:
    """libcuda.so.1 (the stub) and cuda_app in ``d``; returns the app."""
    inc = str(native.cuda_include_dir())
    src = ROOT / "tests" / "native"
    cc = ["gcc", "-std=c11", "-O2", "-Wall", "-Wno-unused-parameter", "-I", inc]
    subprocess.run(
        [*cc, "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1",
         "-Wl,-Bsymbolic", "-o", str(d / "libcuda.so.1"), str(src / "stub_cuda.c"), "-lpthread"],
        check=True,
    )  # fmt: skip
    (d / "libcuda.so").symlink_to("libcuda.so.1")
    subprocess.run(
        [*cc, "-o", str(d / "cuda_app"), str(src / "cuda_app.c"), f"-L{d}", "-lcuda", "-ldl",
         f"-Wl,-rpath,{d}", "-Wl,--enable-new-dtags"],
        check=True,
    )  # fmt: skip
    return d / "cuda_app"


def _strace_calls(table: str) -> dict[str, int]:
    """System call -> calls, from ``strace -c``'s table."""
    out: dict[str, int] = {}
    for line in table.splitlines():
        f = line.split()
        if len(f) in (5, 6) and f[-1] != "total" and f[3].isdigit():
            out[f[-1]] = int(f[3])
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--launches", type=int, default=200_000)
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.launches = 3, 20_000
    reason = native.build_skip_reason()
    if reason:
        sys.exit(f"interposer: cannot build here: {reason}")
    built = native.build()
    if not built.built or built.path is None:
        sys.exit(built.message)
    lib = str(built.path)
    tmp = Path(tempfile.mkdtemp(prefix="gshare-interposer-"))
    app = compile_stub(tmp)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GSHARE_", "STUB_CUDA"))}
    base["LD_LIBRARY_PATH"] = str(tmp)
    server = TokenServer(str(tmp / "t.sock"), LONG)
    server.start()
    server.add_client(ClientSpec("bench", 100.0, 1.0, 1.0))
    held = {
        **base,
        "LD_PRELOAD": lib,
        "GSHARE_TOKEN_SOCKET": server.socket_path,
        "GSHARE_CLIENT_ID": "bench",
        "GSHARE_CUDA_STATS": str(tmp / "stats.json"),
    }
    cases = {
        "direct": (base, "direct"),
        "preloaded, ungoverned": ({**base, "LD_PRELOAD": lib}, "direct"),
        "token held, direct": (held, "direct"),
        "token held, cuGetProcAddress": (held, "gpa"),
    }
    if native.shim_skip_reason() is None:
        shim = native.build_shim(tmp / "libcuda.so.1", tmp / "shim")
        shim_held = {k: v for k, v in held.items() if k != "LD_PRELOAD"}
        shim_held.update(native.shim_env(shim, tmp / "libcuda.so.1", base=shim_held))
        cases["token held, shim"] = (shim_held, "direct")
    ns: dict[str, list[float]] = {c: [] for c in cases}
    fast: list[float] = []
    try:
        for _ in range(args.repeat):
            for case, (env, mode) in cases.items():
                out = subprocess.run(
                    [str(app), "bench", mode, str(args.launches)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=600,
                ).stdout
                ns[case].append(float(out.split()[-1]))
                if "GSHARE_CLIENT_ID" in env:
                    st = json.loads((tmp / "stats.json").read_text())
                    fast.append(st["fast_path"] / st["launches"])
        sys_per_launch: dict[str, float] = {}
        if shutil.which("strace"):
            n = min(args.launches, 20_000)
            for case in ("direct", "token held, direct"):
                env, mode = cases[case]
                log = tmp / "strace.txt"
                subprocess.run(
                    ["strace", "-f", "-c", "-o", str(log), str(app), "bench", mode, str(n)],
                    env=env,
                    capture_output=True,
                    check=True,
                    timeout=600,
                )
                calls = _strace_calls(log.read_text())
                sys_per_launch[case] = sum(calls.values()) / (5 * n)
                sys_per_launch[case + " non-futex"] = sum(
                    v for k, v in calls.items() if k != "futex"
                ) / (5 * n)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def added(case: str) -> float:
        return statistics.median(a - d for a, d in zip(ns[case], ns["direct"], strict=True))

    rows = [
        [
            case,
            f"{statistics.median(v):.0f}",
            f"{min(v):.0f}",
            "" if case == "direct" else f"{added(case):+.0f}",
            f"{1e9 / statistics.median(v) / 1e6:.2f}",
        ]
        for case, v in ns.items()
    ]
    print_table(
        f"cuLaunchKernel on the stub driver ({args.launches} launches x best of 5, "
        f"{args.repeat} runs)",
        ["case", "ns/launch p50", "min", "added ns (vs direct, same run)", "M launches/s"],
        rows,
    )
    summary: dict[str, object] = {
        "added_ns_per_launch_token_held": added("token held, direct"),
        "added_ns_per_launch_token_held_gpa": added("token held, cuGetProcAddress"),
        "added_ns_per_launch_token_held_shim": (
            added("token held, shim") if "token held, shim" in ns else float("nan")
        ),
        "added_ns_per_launch_ungoverned": added("preloaded, ungoverned"),
        "ns_per_launch_direct": statistics.median(ns["direct"]),
        "launches_per_s_direct": 1e9 / statistics.median(ns["direct"]),
        "launches_per_s_token_held": 1e9 / statistics.median(ns["token held, direct"]),
        "fast_path_fraction": min(fast) if fast else float("nan"),
        "syscalls_per_launch_direct": sys_per_launch.get("direct", float("nan")),
        "syscalls_per_launch_token_held": sys_per_launch.get("token held, direct", float("nan")),
        "non_futex_syscalls_per_launch_direct": sys_per_launch.get(
            "direct non-futex", float("nan")
        ),
        "non_futex_syscalls_per_launch_token_held": sys_per_launch.get(
            "token held, direct non-futex", float("nan")
        ),
        "target_added_ns": 1000.0,
    }
    summary.update(machine_load())
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    write_json(args.json, summary, rows=[{"case": c, "ns_per_launch": v} for c, v in ns.items()])


if __name__ == "__main__":
    main()
