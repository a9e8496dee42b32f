"""The CUDA driver-API interposer (``libgshare_cuda.so``) against a stub driver (DESIGN §13).

Real processes: ``cuda_app.c`` (a CUDA driver-API program) runs with the interposer -- preloaded
(``LD_PRELOAD``), or as the ``libcuda.so.1`` shim built from the stub (``LD_LIBRARY_PATH``; the
app is linked with RUNPATH, which the library path overrides) -- against ``stub_cuda.c`` built
as ``libcuda.so.1`` -- a simulated device whose streams run
kernels FIFO in real time for the durations the test passes, and which logs every kernel's
device interval (CLOCK_MONOTONIC, the token server's clock). A real ``TokenServer`` of
``gshare.runtime.tokens`` governs them. Nothing here has run on a GPU: the figures hold for the
stub device (docs/DESIGN.md, "GPU frontend").

Shares are device time (the stub's log) per scheduler window (aligned to the server's
``epoch_s``), so over-limit is judged in the scheduler's own unit. No assertion is on how fast
anything runs: timings are bench/interposer.py's. Skipped only without gcc or ``cuda.h``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gshare.policy.priority.kernel_id import KernelId
from gshare.policy.tokens import LIVE_TOKEN_CONFIG, ClientSpec, TokenConfig
from gshare.runtime import native
from gshare.runtime.tokens import TokenClient, TokenServer
from gshare.testing import WaitTimeout, wait_until

HERE = Path(__file__).parent
MIB = 1 << 20
NOT_PERMITTED = 800  # CUDA_ERROR_NOT_PERMITTED: a launch without a token
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
W_MS = LIVE_TOKEN_CONFIG.window_ms

_SKIP = native.build_skip_reason()
pytestmark = [
    pytest.mark.skipif(_SKIP is not None, reason=f"interposer not buildable: {_SKIP}"),
    pytest.mark.serial,  # measures shares and kernel times: `make test` runs it alone
]


_SHIM_SKIP = native.shim_skip_reason()
DEPLOYMENTS = [
    "preload",
    pytest.param("shim", marks=pytest.mark.skipif(_SHIM_SKIP is not None, reason=f"{_SHIM_SKIP}")),
]


@dataclass(frozen=True)
class Native:
    lib: Path
    stub_dir: Path
    app: Path
    shim_dir: Path | None
    """The shim built from the stub as the real driver (None: not buildable here)."""

    @property
    def real(self) -> Path:
        return self.stub_dir / "libcuda.so.1"


def _cc(*args: str) -> None:
    inc = str(native.cuda_include_dir())
    cmd = ["gcc", "-std=c11", "-O2", "-g", "-Wall", "-Wno-unused-parameter", "-I", inc, *args]
    subprocess.run(cmd, check=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Native:
    result = native.build()
    assert result.built and result.path is not None, result.message
    d = tmp_path_factory.mktemp("stubcuda")
    # -Bsymbolic: like a real libcuda, the stub's own references (its cuGetProcAddress table)
    # are to itself, not to the interposer's exported wrappers.
    _cc("-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
        "-o", str(d / "libcuda.so.1"), str(HERE / "stub_cuda.c"), "-lpthread")  # fmt: skip
    (d / "libcuda.so").symlink_to("libcuda.so.1")
    # RUNPATH (new dtags), not RPATH: LD_LIBRARY_PATH comes first, so the shim can be found
    _cc("-o", str(d / "cuda_app"), str(HERE / "cuda_app.c"), f"-L{d}", "-lcuda", "-ldl",
        f"-Wl,-rpath,{d}", "-Wl,--enable-new-dtags")  # fmt: skip
    shim = None
    if _SHIM_SKIP is None:
        shim = native.build_shim(d / "libcuda.so.1", tmp_path_factory.mktemp("shim"))
    return Native(result.path, d, d / "cuda_app", shim)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TokenServer]:
    ts = TokenServer(str(tmp_path / "t.sock"), LIVE_TOKEN_CONFIG, record_tokens=100_000)
    ts.start()
    yield ts
    ts.stop()


def _env(
    nat: Native,
    tmp: Path,
    name: str,
    server: TokenServer | None,
    deployment: str = "preload",
    **extra: str,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GSHARE_", "STUB_CUDA"))}
    env.pop("LD_PRELOAD", None)
    env.pop("LD_LIBRARY_PATH", None)
    if deployment == "shim":
        assert nat.shim_dir is not None
        env.update(native.deployment_env("shim", shim_dir=nat.shim_dir, real_libcuda=nat.real))
    else:
        env.update(LD_LIBRARY_PATH=str(nat.stub_dir), LD_PRELOAD=str(nat.lib))
    env.update(
        STUB_CUDA_LOG=str(tmp / f"{name}.log"),
        GSHARE_CUDA_STATS=str(tmp / f"{name}.json"),
    )
    if server is not None:
        env.update(
            GSHARE_TOKEN_SOCKET=server.socket_path,
            GSHARE_CLIENT_ID=name,
            GSHARE_TOKEN_EPOCH_S=repr(server.epoch_s),
        )
    env.update(extra)
    return env


def _spans(tmp: Path, name: str) -> list[tuple[float, float]]:
    """The stub device's kernel intervals (seconds, CLOCK_MONOTONIC)."""
    lines = (tmp / f"{name}.log").read_text().splitlines()
    return [(int(a) / 1e9, int(b) / 1e9) for a, b, _ in (x.split() for x in lines if x[0] != "#")]


def _named_spans(tmp: Path, name: str) -> list[tuple[str, str, str]]:
    lines = (tmp / f"{name}.log").read_text().splitlines()
    return [(a, b, n) for a, b, n in (x.split() for x in lines if x[0] != "#")]


def _stats(tmp: Path, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((tmp / f"{name}.json").read_text())
    return out


def _run(nat: Native, env: dict[str, str], *args: str) -> str:
    p = subprocess.run([str(nat.app), *args], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _busy_in(spans: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)


def _saturate(
    nat: Native, tmp: Path, server: TokenServer, clients: dict[str, tuple[float, float]],
    mode: str, seconds: float, kernel_us: int = 500, batch: int = 16,
    deployment: str = "preload", graph: bool = False,
) -> tuple[float, float]:  # fmt: skip
    """Register ``clients`` (id -> (request, limit)), run one saturating ``cuda_app`` each at
    the same time (kernels of ``kernel_us`` -- or launches of a graph of ``kernel_us`` -- in
    batches of ``batch`` between synchronisations); returns the wall interval they all ran."""
    procs = {}
    for cid, (req, lim) in clients.items():
        server.add_client(ClientSpec(cid, 100.0, req, lim))
        extra = {"STUB_CUDA_GRAPH_US": str(kernel_us)} if graph else {}
        procs[cid] = subprocess.Popen(
            [str(nat.app), "run", mode, str(seconds), str(kernel_us), str(batch)]
            + (["graph"] if graph else []),
            env=_env(nat, tmp, cid, server, deployment, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for p in procs.values():
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = server._clock()  # noqa: SLF001 -- the server's clock: time.monotonic
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for cid, p in procs.items():
        out, _ = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0, f"{cid}: {out}"
        assert out.split()[-1] == "0", f"{cid}: launches failed: {out}"
    return t0, t0 + seconds


def _late_allowance(stats: dict[str, float]) -> float:
    """The share of a window that a kernel delayed by a preempted host can run past the token
    (``max_late_us``, counted by the interposer; 0 when no launch came late)."""
    return stats["max_late_us"] / 1000.0 / W_MS if stats["late_launches"] else 0.0


def _windows(
    server: TokenServer, spans: Sequence[tuple[float, float]], t0: float, t1: float
) -> list[float]:
    """Device time per whole scheduler window inside [t0, t1], as fractions of the window."""
    w = W_MS / 1000.0
    k0 = int((t0 - server.epoch_s) / w) + 1
    k1 = int((t1 - server.epoch_s) / w)
    return [
        _busy_in(spans, server.epoch_s + k * w, server.epoch_s + (k + 1) * w) / w
        for k in range(k0, k1)
    ]


# -- no launch without a token --------------------------------------------------------------


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_an_unregistered_or_wrong_secret_client_launches_nothing(
    built: Native, server: TokenServer, tmp_path: Path, deployment: str
) -> None:
    out = _run(built, _env(built, tmp_path, "stranger", server, deployment), "once", "direct")
    assert out.split() == ["launch", str(NOT_PERMITTED)]
    assert _spans(tmp_path, "stranger") == []
    assert _stats(tmp_path, "stranger")["deployment"] == deployment
    out = _run(built, _env(built, tmp_path, "graphs", server, deployment), "graph", "gpa", "2")
    assert out.split() == ["graph", str(NOT_PERMITTED)] * 2  # nor a graph
    assert _spans(tmp_path, "graphs") == []
    server.add_client(ClientSpec("owner", 100.0, 0.5, 1.0), secret="s3cret")
    env = _env(built, tmp_path, "owner", server, deployment, GSHARE_TOKEN_SECRET="guess")
    assert _run(built, env, "once", "gpa").split() == ["launch", str(NOT_PERMITTED)]
    assert _spans(tmp_path, "owner") == []
    env["GSHARE_TOKEN_SECRET"] = "s3cret"
    assert _run(built, env, "once", "gpa").split() == ["launch", "0"]
    assert len(_spans(tmp_path, "owner")) == 1


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
@pytest.mark.parametrize("mode", ["direct", "gpa"])
def test_a_launch_waits_for_the_token_held_by_another_client(
    built: Native, tmp_path: Path, mode: str, deployment: str
) -> None:
    cfg = TokenConfig(window_ms=4000.0, max_token_ms=2000.0, idle_token_ms=2000.0)
    with TokenServer(str(tmp_path / "t.sock"), cfg, record_tokens=100) as server:
        server.add_client(ClientSpec("holder", 100.0, 0.5, 1.0))
        server.add_client(ClientSpec("app", 100.0, 0.5, 1.0))
        holder = TokenClient(server.socket_path, "holder", timeout_s=20)
        holder.acquire()
        p = subprocess.Popen(
            [str(built.app), "once", mode],
            env=_env(built, tmp_path, "app", server, deployment),
            stdout=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: server.snapshot()["app"].waiting, 20, "the app asking for a token")
        assert p.poll() is None  # blocked in its launch while the holder has the token
        holder.release(1.0)
        out, _ = p.communicate(timeout=30)
        holder.close()
        released = next(r.end_s for r in server.token_records() if r.client_id == "holder")
    assert out.split() == ["launch", "0"]
    ((start, _end),) = _spans(tmp_path, "app")
    assert start >= released  # on the device, the kernel ran only after the token changed hands


# -- busy time, a lone client's limit, and both entry paths ----------------------------------


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
@pytest.mark.parametrize(
    "mode, graph",
    [("direct", False), ("gpa", False), ("gpa", True)],
    ids=["direct", "gpa", "graph"],
)
def test_a_lone_client_stays_at_its_limit_and_reports_device_busy_time(
    built: Native, server: TokenServer, tmp_path: Path, mode: str, graph: bool, deployment: str
) -> None:
    # request 0.2, limit 0.5: alone, it may take idle time beyond its request, up to its limit
    t0, t1 = _saturate(
        built, tmp_path, server, {"lone": (0.2, 0.5)}, mode, 2.5,
        deployment=deployment, graph=graph,
    )  # fmt: skip
    spans = _spans(tmp_path, "lone")
    device_ms = sum(b - a for a, b in spans) * 1000.0
    stats = _stats(tmp_path, "lone")

    def reported() -> float:
        return sum(r.busy_ms for r in server.token_records() if r.client_id == "lone")

    # the client's last release may still be on its way to the server thread when the client
    # has exited: what the server records must reach what the client says it reported
    with contextlib.suppress(WaitTimeout):  # the assert below then says by how much
        wait_until(
            lambda: reported() == pytest.approx(stats["busy_ms_reported"], rel=1e-6),
            10,
            "the server to record every release the client sent",
        )
    reported_ms = reported()
    assert stats["tokens"] > 10 and stats["fast_path"] > 0 and stats["revoked"] > 0
    # every launch came through the one door it was made through, and was counted there
    entry = "cuGraphLaunch" if graph else "cuLaunchKernel"
    assert stats["deployment"] == deployment
    assert stats["launches_by_entry"][entry] == stats["launches"] == len(spans)
    assert sum(stats["launches_by_entry"].values()) == stats["launches"]
    assert stats["graph_launches"] == (len(spans) if graph else 0)
    assert {name for *_, name in _named_spans(tmp_path, "lone")} == {
        "graph" if graph else "gshare_test_kernel"
    }
    assert reported_ms == pytest.approx(stats["busy_ms_reported"], rel=1e-6)
    assert abs(reported_ms - device_ms) <= 0.01 * device_ms, (reported_ms, device_ms)
    shares = _windows(server, spans, t0 + 0.3, t1)
    # never past its limit in device time -- unless the host was preempted between a token
    # check and its launch (the interposer counts it), by at most that delay
    assert max(shares) <= 0.5 + _late_allowance(stats) + 1e-9, (max(shares), stats)
    share = _busy_in(spans, t0 + 0.3, t1) / (t1 - t0 - 0.3)
    print(
        f"lone[{deployment}/{mode}/{graph}]: busy reported/device "
        f"{reported_ms:.1f}/{device_ms:.1f} ms, share {share}"
    )
    # and it gets about it: 1.25 pp below by kernel granularity (39 x 0.5 ms fit a 19.9-ms
    # cap), and a VM stall of the host can take a few more (0.477 seen); the bound that
    # matters is the one above
    assert 0.43 <= share <= 0.5 + _late_allowance(stats) + 1e-9, share


# -- two clients ------------------------------------------------------------------------------


def test_two_clients_at_quota_03_and_06_reach_their_shares(
    built: Native, server: TokenServer, tmp_path: Path
) -> None:
    quotas = {"a": 0.3, "b": 0.6}
    t0, t1 = _saturate(
        built, tmp_path, server, {c: (q, q) for c, q in quotas.items()}, "gpa", seconds=3.0
    )
    m0 = t0 + 0.3  # the first windows are a transient (first kernels not yet measured)
    errors, over, lates, raw = [], [], [], []
    for cid, q in quotas.items():
        spans = _spans(tmp_path, cid)
        errors.append(abs(_busy_in(spans, m0, t1) / (t1 - m0) - q) * 100.0)
        allowed = q + _late_allowance(_stats(tmp_path, cid))
        raw.append(max(0.0, max(_windows(server, spans, m0, t1)) - q) * 100.0)
        over.append(max(0.0, max(_windows(server, spans, m0, t1)) - allowed) * 100.0)
        lates.append(_stats(tmp_path, cid)["late_launches"])
    a, b = _spans(tmp_path, "a"), _spans(tmp_path, "b")
    overlap = sum(_busy_in(b, s, e) for s, e in a)
    print(f"errors_pp={errors} over_limit_pp={over} raw={raw} late launches={lates}")
    assert max(errors) <= 3.0, errors
    assert max(over) <= 1e-6, over  # (float noise)
    assert overlap == 0.0  # time-shared: never both on the device at once


# -- memory cap -------------------------------------------------------------------------------


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
@pytest.mark.parametrize("mode", ["direct", "gpa"])
def test_allocations_past_the_cap_fail_and_nothing_else_does(
    built: Native, tmp_path: Path, mode: str, deployment: str
) -> None:
    env = _env(built, tmp_path, "mem", None, deployment, GSHARE_CUDA_MEM_LIMIT_MB="64")
    results = dict(line.split(maxsplit=1) for line in _run(built, env, "alloc", mode).splitlines())
    failed = {k for k, v in results.items() if not k.startswith("info") and v != "0"}
    # the VMM API (cuMemCreate: PyTorch's expandable segments) and pool allocations count
    # against the same cap; cuMemRelease and the frees give their bytes back
    vmm = {"vmm30", "pool30", "vmm1"}
    assert failed == {"alloc30", "managed30", "async30", "alloc1", *vmm}
    assert {results[k] for k in failed} == {str(OOM)}
    assert int(results["info_total"]) == 64 * MIB  # the instance sees its cap as the device
    assert int(results["info_free"]) == 0  # 40 + 24 MiB: exactly full
    stats = _stats(tmp_path, "mem")
    assert stats["mem_peak_bytes"] == 64 * MIB
    assert stats["oom_refusals"] == 7
    # what the process still held at exit (3 MiB allocated, 2 MiB cuMemCreate'd) ...
    assert stats["mem_live_bytes"] == 5 * MIB
    assert stats["vmm_bytes_live"] == 2 * MIB  # (part of mem_live_bytes)
    tail = (tmp_path / "mem.log").read_text().splitlines()[-1].split()
    assert int(tail[2]) == 5 * MIB  # ... is what the device's own account holds
    assert int(tail[4]) == 0  # and the device itself never refused anything


# -- kernel identity (FIKIT) ------------------------------------------------------------------


def test_kernel_ids_are_stable_across_runs_and_measured(built: Native, tmp_path: Path) -> None:
    profiles = []
    for run, no_func_name in enumerate(["0", "0", "1"]):
        path = tmp_path / f"profile{run}.json"
        env = _env(
            built, tmp_path, f"ids{run}", None,
            GSHARE_CUDA_PROFILE=str(path), GSHARE_CUDA_TASK_KEY="fn",
            STUB_CUDA_NO_FUNC_NAME=no_func_name,
        )  # fmt: skip
        _run(built, env, "ids", "gpa" if run else "direct")
        profiles.append(native.read_kernel_profile(path))
    expected = {
        KernelId.gpu("gshare_test_kernel", (8, 1, 1), (128, 1, 1)): 2.0,
        KernelId.gpu("gemm_tile", (16, 1, 1), (256, 1, 1)): 3.0,
        KernelId.gpu("gemm_tile", (32, 1, 1), (256, 1, 1)): 3.0,
        KernelId.gpu("softmax_rows", (4, 2, 1), (64, 1, 1)): 1.0,
    }
    for p in profiles:  # the same IDs in every run, with or without cuFuncGetName
        assert p.task_key == "fn"
        stats = {s.kernel: s for s in p.kernels()}
        assert set(stats) == set(expected)
        for kid, ms in expected.items():
            assert stats[kid].count == 3
            # the stub's durations, less the host's launch latency when the stream was idle:
            # within half their 1-ms separation either way, so the IDs' profiles cannot be
            # confused. The host is preempted between the event and the launch on a busy 2-core
            # host (one sample 0.22 ms off seen), hence kernels of milliseconds
            assert stats[kid].mean_ms == pytest.approx(ms, abs=0.49)
        assert sum(s.gap_count for s in stats.values()) == 11  # every kernel but the last
        # within a burst the kernels ran back to back: no idle gap after them
        assert stats[KernelId.gpu("gshare_test_kernel", (8, 1, 1), (128, 1, 1))].gap_mean_ms < 0.5


def test_preload_env_and_configure(built: Native) -> None:
    env = native.preload_env({"LD_PRELOAD": "/x/libother.so"})
    assert env["LD_PRELOAD"].split(":") == [str(built.lib), "/x/libother.so"]
    assert not native.interposer_loaded()  # not preloaded into pytest itself
    assert native.configure_interposer("/tmp/sock", "x") is False
    code = (
        "from gshare.runtime import native; print(native.configure_interposer('/s', 'i', 'k', 64))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "LD_PRELOAD": str(built.lib)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "True"


# -- the libcuda.so.1 shim ---------------------------------------------------------------------

shim_only = pytest.mark.skipif(_SHIM_SKIP is not None, reason=f"{_SHIM_SKIP}")


@shim_only
@pytest.mark.parametrize("mode", ["direct", "gpa"])
def test_the_shim_forwards_what_it_does_not_intercept(
    built: Native, tmp_path: Path, mode: str
) -> None:
    assert built.shim_dir is not None
    env = _env(built, tmp_path, "info", None, "shim")
    lines = dict(line.split(maxsplit=1) for line in _run(built, env, "info", mode).splitlines())
    assert lines["version"] == "0 13000"  # the stub's, through a forwarder
    assert lines["name"] == "0 gshare stub device"
    if mode == "direct":  # the app's own symbol is the shim's (LD_LIBRARY_PATH beat RUNPATH)
        assert Path(lines["from"]).resolve() == (built.shim_dir / "libcuda.so.1").resolve()
    assert _stats(tmp_path, "info")["deployment"] == "shim"
    manifest = json.loads((built.shim_dir / native.MANIFEST).read_text())
    assert manifest["real_libcuda"] == str(built.real.resolve())
    assert "cuLaunchKernel" in manifest["intercepted"]
    assert "cuGraphLaunch" in manifest["intercepted"] and "cuMemCreate" in manifest["intercepted"]
    real = native.read_elf_symbols(built.real)
    shim = native.read_elf_symbols(built.shim_dir / "libcuda.so.1")
    assert set(real.functions) <= set(shim.functions)  # nothing the driver exports is missing
    assert manifest["forwarded"] == len(set(real.functions) - set(manifest["intercepted"]))
    assert "dlsym" not in shim.functions  # the shim does not interpose dlsym


@shim_only
def test_the_shim_refuses_itself_or_a_missing_driver_as_the_real_one(
    built: Native, tmp_path: Path
) -> None:
    assert built.shim_dir is not None
    shim_lib = built.shim_dir / "libcuda.so.1"
    assert native.is_shim(shim_lib) and native.is_shim(built.lib)
    assert not native.is_shim(built.real)
    found = native.find_real_libcuda()
    assert found is None or not native.is_shim(found)
    with pytest.raises(native.ShimError, match="gshare library"):
        native.build_shim(shim_lib, tmp_path / "again")
    with pytest.raises(native.ShimError, match="absolute"):
        native.build_shim(Path("libcuda.so.1"), tmp_path / "rel")
    (tmp_path / "text.so").write_text("not a library")
    with pytest.raises(native.ShimError, match="ELF"):
        native.build_shim(tmp_path / "text.so", tmp_path / "bad")
    # at run time too: pointed at itself, or at nothing, the shim governs nothing and runs
    # nothing (every call fails), instead of recursing into itself or finding another driver
    for real, what in [(shim_lib, "gshare library"), (tmp_path / "none.so", "cannot load")]:
        env = _env(built, tmp_path, "self", None, "shim", GSHARE_REAL_LIBCUDA=str(real))
        p = subprocess.run(
            [str(built.app), "once", "direct"], env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 4, p  # cuInit failed: setup() exits 4
        assert p.stderr.count(what) == 1, p.stderr  # said once, at load


@shim_only
def test_a_versioned_driver_gets_a_shim_with_the_same_versions(
    built: Native, tmp_path: Path
) -> None:
    d = tmp_path / "versioned"
    d.mkdir()
    (d / "v.map").write_text("LIBCUDA_TEST_1 {\n  global: cu*;\n};\n")
    _cc("-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
        f"-Wl,--version-script={d / 'v.map'}", "-o", str(d / "libcuda.so.1"),
        str(HERE / "stub_cuda.c"), "-lpthread")  # fmt: skip
    (d / "libcuda.so").symlink_to("libcuda.so.1")
    _cc("-o", str(d / "cuda_app"), str(HERE / "cuda_app.c"), f"-L{d}", "-lcuda", "-ldl",
        f"-Wl,-rpath,{d}", "-Wl,--enable-new-dtags")  # fmt: skip
    assert native.read_elf_symbols(d / "libcuda.so.1").versions["cuInit"] == "LIBCUDA_TEST_1"
    shim = native.build_shim(d / "libcuda.so.1", tmp_path / "vshim")
    assert native.read_elf_symbols(shim / "libcuda.so.1").versions["cuInit"] == "LIBCUDA_TEST_1"
    env = {**os.environ, **native.shim_env(shim, d / "libcuda.so.1")}
    env.pop("LD_PRELOAD", None)
    env["GSHARE_CUDA_STATS"] = str(tmp_path / "v.json")
    # an app that needs cu*@LIBCUDA_TEST_1 loads against the shim, and is served by it
    p = subprocess.run(
        [str(d / "cuda_app"), "info", "direct"], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    # (against an unversioned shim, ld.so would only warn: "no version information available")
    assert "version" not in p.stderr, p.stderr
    lines = dict(line.split(maxsplit=1) for line in p.stdout.splitlines())
    assert Path(lines["from"]).resolve() == (shim / "libcuda.so.1").resolve()
    assert lines["version"] == "0 13000"
    assert _stats(tmp_path, "v")["deployment"] == "shim"


def test_deployment_environments(built: Native, tmp_path: Path) -> None:
    base = {"LD_LIBRARY_PATH": "/opt/a:/opt/b", "LD_PRELOAD": f"/x/libother.so:{built.lib}"}
    env = native.shim_env(tmp_path, Path("/drv/libcuda.so.1"), base)
    assert env["LD_LIBRARY_PATH"].split(":") == [str(tmp_path.resolve()), "/opt/a", "/opt/b"]
    assert env["GSHARE_REAL_LIBCUDA"] == "/drv/libcuda.so.1"
    assert env["LD_PRELOAD"] == "/x/libother.so"  # never both deployments at once
    assert native.deployment_env("shim", shim_dir=tmp_path, real_libcuda=Path("/d"), base=base)
    assert native.deployment_env("preload", base=base)["LD_PRELOAD"].split(":") == [
        str(built.lib),
        "/x/libother.so",
    ]
    with pytest.raises(ValueError, match="shim_dir"):
        native.deployment_env("shim")
    assert native.deployment_kind("") == "preload" and native.deployment_kind("shim") == "shim"
    with pytest.raises(ValueError, match="GSHARE_CUDA_DEPLOYMENT"):
        native.deployment_kind("ld_preload")
    assert native.cuda_deployment_env(tmp_path, "preload") == native.preload_env()


@shim_only
def test_the_agent_deployment_builds_the_shim_once_and_instances_configure_it(
    built: Native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GSHARE_REAL_LIBCUDA", str(built.real))
    monkeypatch.delenv("GSHARE_CUDA_SHIM_DIR", raising=False)
    env = native.cuda_deployment_env(tmp_path, "shim")
    shim_lib = tmp_path / "cuda-shim" / "libcuda.so.1"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(shim_lib.parent.resolve())
    assert env["GSHARE_REAL_LIBCUDA"] == str(built.real.resolve())
    first = shim_lib.stat().st_mtime_ns
    assert native.cuda_deployment_env(tmp_path, "shim") == env
    assert shim_lib.stat().st_mtime_ns == first  # reused, not rebuilt
    # an instance process in the shim deployment: configure_interposer finds the shim
    code = (
        "from gshare.runtime import native; print(native.configure_interposer('/s', 'i', 'k', 64))"
    )
    run_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**run_env, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "True"


@shim_only
def test_find_real_libcuda_skips_shims_and_foreign_libraries(
    built: Native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert built.shim_dir is not None
    (tmp_path / "notelf.so.1").write_text("text")
    ldconfig = tmp_path / "bin" / "ldconfig"
    ldconfig.parent.mkdir()
    entries = [built.shim_dir / "libcuda.so.1", tmp_path / "notelf.so.1", built.real]
    ldconfig.write_text(
        "#!/bin/sh\necho '3 libs found in cache'\n"
        + "".join(f"echo '\tlibcuda.so.1 (libc6,x86-64) => {p}'\n" for p in entries)
    )
    ldconfig.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ldconfig.parent}:{os.environ['PATH']}")
    assert native.find_real_libcuda() == built.real.resolve()


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_a_stream_capture_is_left_alone_and_its_graph_is_gated(
    built: Native, server: TokenServer, tmp_path: Path, deployment: str
) -> None:
    # PyTorch's CUDA graphs capture in the global mode: an event query or synchronisation by
    # the gate while the capture is in progress (the reaper giving back an expired token, a
    # revocation) would invalidate it. The capture outlasts several windows here.
    server.add_client(ClientSpec("cap", 100.0, 0.5, 0.5))
    env = _env(built, tmp_path, "cap", server, deployment)
    sleep_ms = str(int(3 * W_MS))
    out = _run(built, env, "capture", "gpa", sleep_ms).split()
    assert out == ["begin", "0", "launch", "0", "launch", "0", "end", "0", "graph", "0"]
    stats = _stats(tmp_path, "cap")
    assert stats["launches_while_capturing"] == 2  # passed through, counted
    assert stats["graph_launches"] == 1 and stats["launches"] == 3
    assert stats["tokens"] >= 1  # the graph's launch took one
    # only the graph ran (the captured kernels were recorded, not run)
    assert [n for *_, n in _named_spans(tmp_path, "cap")] == ["graph"]
