"""What every part of the GPU kit shares: its context, its entry point, the interposer's two
deployments, the token server, and the processes it measures.

The orchestrator (``gshare.gpukit.check``) writes a ``KitContext`` JSON and starts each part as
``python -m gshare.gpukit.parts.<part> --ctx FILE --out FILE --budget-s S``; ``part_main``
parses that, calls the part's ``run(ctx, budget_s) -> PartResult`` and writes the result (a part
that raises is written as ``fail`` with the error, so the kit goes on). A part must end within
its budget: it scales its own durations to it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gshare.gpukit.analysis import percentile
from gshare.gpukit.results import Figure, PartResult

DEPLOYMENTS = ("preload", "shim")
"""How the interposer is put in a process: ``LD_PRELOAD``, or a ``libcuda.so.1`` shim first on
``LD_LIBRARY_PATH`` that loads the real driver by path."""


@dataclass
class KitContext:
    dry_run: bool
    work: str
    """The kit's private folder (builds, logs, the bundle's site folder)."""
    out: str
    """Where the results go (a part may add one file there, named in its figures)."""
    python: str
    env: dict[str, str]
    """The environment every measured process starts from (PYTHONPATH with the bundle)."""
    interposer: str | None
    """``libgshare_cuda.so`` (None: it did not build; parts that need it skip)."""
    real_libcuda: str | None
    """The driver the interposer forwards to (the stub's ``libcuda.so.1`` in a dry run)."""
    shim_dir: str | None
    """A folder holding the ``libcuda.so.1`` shim (None: not built; ``shim_error`` says why)."""
    shim_error: str = ""
    probe: str | None = None
    """The driver-API probe (``gpukit/probe/probe.c``)."""
    ptx: str | None = None
    """The probe's kernels (``kernels.cu`` compiled to PTX)."""
    cuda_devices: int = 0
    """How many CUDA devices torch sees (0 in a dry run)."""
    notes: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> bool:
        """Whether there is a real GPU to measure on."""
        return not self.dry_run and self.cuda_devices > 0

    @property
    def on(self) -> str:
        """Where the driver-level figures are measured: ``gpu`` or ``stub``."""
        return "gpu" if self.gpu else "stub"

    def no_gpu_reason(self) -> str:
        if self.dry_run:
            return "dry run: no GPU (stub driver and CPU torch)"
        return "no CUDA device visible to torch"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> KitContext:
        return cls(**json.loads(path.read_text()))


def part_main(run: Callable[[KitContext, float], PartResult]) -> None:
    """A part's ``__main__``: run it and write its result, whatever happens."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, required=True)
    args = ap.parse_args()
    ctx = KitContext.load(args.ctx)
    try:
        result = run(ctx, args.budget_s)
    except Exception as e:  # noqa: BLE001 -- the kit goes on: the part is a failure, logged
        traceback.print_exc()
        result = PartResult("fail", f"the part raised {type(e).__name__}: {e}")
    args.out.write_text(json.dumps(result.to_json(), indent=1))


class Deadline:
    """A part's remaining time (``time.monotonic``)."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()

    def enough(self, seconds: float) -> bool:
        return self.left() >= seconds


def skipped(name: str, reason: str, on: str = "gpu") -> Figure:
    """A figure that could not be measured, and why."""
    return Figure(name, None, None, None, on=on, note=reason)


def check(
    name: str,
    measured: float | None,
    op: str,
    bound: float,
    unit: str = "",
    on: str = "gpu",
    note: str = "",
) -> Figure:
    """A figure with a numeric target ``measured OP bound`` (``<=``, ``>=``, ``==``)."""
    if measured is None:
        return Figure(name, None, f"{op} {bound:g}", None, unit, on, note or "not measured")
    ok = {"<=": measured <= bound, ">=": measured >= bound, "==": measured == bound}[op]
    return Figure(name, measured, f"{op} {bound:g}", bool(ok), unit, on, note)


# -- the interposer's deployments -------------------------------------------------------------


def deployment_env(ctx: KitContext, deployment: str, **extra: str) -> dict[str, str]:
    """The environment of a process governed by the interposer in ``deployment`` (``extra``
    on top), built by ``runtime.native.deployment_env`` — what the node agent gives CUDA
    instances — over ``driver_env``. Raises ``RuntimeError`` when that deployment was not
    built."""
    env = driver_env(ctx)
    for k in list(env):
        if k.startswith("GSHARE_CUDA") or k.startswith("GSHARE_TOKEN") or k == "GSHARE_CLIENT_ID":
            del env[k]
    if ctx.real_libcuda:
        env["GSHARE_REAL_LIBCUDA"] = ctx.real_libcuda
    if deployment not in (*DEPLOYMENTS, "none"):
        raise ValueError(f"unknown deployment {deployment!r}: {DEPLOYMENTS}")
    if deployment == "preload" and not ctx.interposer:
        raise RuntimeError("the interposer did not build")
    if deployment == "shim" and not (ctx.shim_dir and ctx.real_libcuda):
        raise RuntimeError(f"the libcuda.so.1 shim did not build: {ctx.shim_error}")
    if deployment != "none":  # the runtime's own recipe, as the node agent uses it
        from gshare.runtime import native

        env.update(
            native.deployment_env(
                "shim" if deployment == "shim" else "preload",
                shim_dir=Path(ctx.shim_dir) if ctx.shim_dir else None,
                real_libcuda=Path(ctx.real_libcuda) if ctx.real_libcuda else None,
                base=env,
            )
        )
    env.update(extra)
    return env


def driver_env(ctx: KitContext) -> dict[str, str]:
    """The environment of an ungoverned process: in a dry run the stub is the driver."""
    env = dict(ctx.env)
    if ctx.dry_run and ctx.real_libcuda:
        stub_dir = str(Path(ctx.real_libcuda).parent)
        env["LD_LIBRARY_PATH"] = ":".join(x for x in (stub_dir, env.get("LD_LIBRARY_PATH")) if x)
    return env


def token_env(server: Any, client_id: str) -> dict[str, str]:
    """The interposer's token settings for ``client_id`` of a running ``TokenServer``."""
    return {
        "GSHARE_TOKEN_SOCKET": server.socket_path,
        "GSHARE_CLIENT_ID": client_id,
        "GSHARE_TOKEN_EPOCH_S": repr(server.epoch_s),
    }


@contextmanager
def token_server(work: Path, name: str, record_tokens: int = 200_000) -> Iterator[Any]:
    """A real ``gshare.runtime.tokens.TokenServer`` with the live configuration."""
    from gshare.policy.tokens import LIVE_TOKEN_CONFIG
    from gshare.runtime.tokens import TokenServer

    sock = work / f"{name}.sock"
    if sock.exists():
        sock.unlink()
    ts = TokenServer(str(sock), LIVE_TOKEN_CONFIG, record_tokens=record_tokens)
    ts.start()
    try:
        yield ts
    finally:
        ts.stop()


def add_client(server: Any, client_id: str, request: float, limit: float) -> None:
    from gshare.policy.tokens import ClientSpec

    server.add_client(ClientSpec(client_id, 100.0, request, limit))


def read_stats(path: Path) -> dict[str, Any]:
    """The interposer's counters (``GSHARE_CUDA_STATS``), ``{}`` when it wrote none."""
    try:
        out: dict[str, Any] = json.loads(path.read_text())
        return out
    except (OSError, json.JSONDecodeError):
        return {}


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Proc:
    """A measured process started with ``start``: its stdout is read line by line."""

    name: str
    popen: subprocess.Popen[str]
    log: Path

    def expect(self, word: str, timeout_s: float) -> list[str]:
        """Wait for a line ``word`` on its stdout and return the lines before it (raises
        ``RuntimeError`` with its log). The time-out is checked between lines."""
        assert self.popen.stdout is not None
        end = time.monotonic() + timeout_s
        before: list[str] = []
        while time.monotonic() < end:
            line = self.popen.stdout.readline()
            if not line:
                break
            if line.strip() == word:
                return before
            before.append(line.rstrip("\n"))
        self.popen.kill()
        raise RuntimeError(f"{self.name} did not say {word!r}: {tail(self.log)}")

    def go(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()

    def finish(self, timeout_s: float) -> str:
        """Its remaining stdout once it exits (raises ``RuntimeError`` on failure)."""
        try:
            out, _ = self.popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.communicate()
            raise RuntimeError(
                f"{self.name} ran past {timeout_s:.0f} s: {tail(self.log)}"
            ) from None
        if self.popen.returncode != 0:
            raise RuntimeError(f"{self.name} exited {self.popen.returncode}: {tail(self.log)}")
        return out


def start(name: str, argv: Sequence[str], env: Mapping[str, str], work: Path) -> Proc:
    """Start ``argv`` with a pipe on stdin and stdout; stderr goes to ``work/NAME.err``."""
    log = work / f"{name}.err"
    with open(log, "w") as err:
        p = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    return Proc(name, p, log)


def tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def run_json(
    name: str, argv: Sequence[str], env: Mapping[str, str], work: Path, timeout_s: float
) -> dict[str, Any]:
    """Run a process that prints one JSON object as its last stdout line; return it."""
    p = start(name, argv, env, work)
    out = p.finish(timeout_s)
    try:
        return last_json(out)
    except ValueError as e:
        raise RuntimeError(f"{name}: {e} {tail(p.log)}") from None


def last_json(out: str) -> dict[str, Any]:
    """The last line of ``out`` that is a JSON object (a measured process's report); raises
    ``ValueError`` when there is none."""
    lines = [x for x in out.strip().splitlines() if x.startswith("{")]
    if not lines:
        raise ValueError(f"printed no JSON: {out[-500:]!r}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def workload_argv(ctx: KitContext, *args: str) -> list[str]:
    """``python -m gshare.gpukit.parts.workload ARGS`` (one model on CUDA: parts.workload)."""
    return [ctx.python, "-m", "gshare.gpukit.parts.workload", *args]


def probe_argv(ctx: KitContext, *args: str) -> list[str]:
    """The probe with the kit's PTX: ``probe CMD PTX ARGS`` (``info`` takes no PTX)."""
    if not ctx.probe or not ctx.ptx:
        raise RuntimeError("the probe did not build (see the kit's setup notes)")
    cmd, *rest = args
    return [ctx.probe, cmd] if cmd == "info" else [ctx.probe, cmd, ctx.ptx, *rest]


def stub_env(ctx: KitContext, **kernel_us: int) -> dict[str, str]:
    """In a dry run: the stub's kernel durations (``name=us``); on a GPU nothing."""
    if not ctx.dry_run:
        return {}
    return {"STUB_CUDA_KERNEL_US": ",".join(f"{k}={v}" for k, v in kernel_us.items())}


def python_has(module: str) -> bool:
    """Whether this interpreter imports ``module`` (the target lacks some: the bundle)."""
    try:
        __import__(module)
        return True
    except ImportError:
        return False


__all__ = [
    "DEPLOYMENTS",
    "Deadline",
    "KitContext",
    "Proc",
    "add_client",
    "check",
    "last_json",
    "deployment_env",
    "driver_env",
    "part_main",
    "percentile",
    "probe_argv",
    "python_has",
    "read_stats",
    "run_json",
    "skipped",
    "start",
    "stub_env",
    "tail",
    "token_env",
    "token_server",
    "workload_argv",
]
