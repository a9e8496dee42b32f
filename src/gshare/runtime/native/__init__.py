"""The GPU frontend's native part: building, locating and configuring ``libgshare_cuda.so``.

``libgshare_cuda.so`` (C, ``native/gshare_cuda.c``) is a CUDA driver-API interposer (FaST-GShare
§3.3's hook library). It gates every kernel launch and graph launch on a time token from the
node's token server (the same Unix-socket protocol and ``policy.tokens`` as the Python
``TokenClient``), measures device busy time with events around bursts (Gemini), caps device
memory at the instance's limit (allocations, pools and VMM ``cuMemCreate``), and identifies
kernels (FIKIT §3.2); while a stream capture is in progress it lets launches through (they
record a CUDA graph; the graph's launches are gated). docs/DESIGN.md ("GPU frontend") has the
design.

Two deployments (``Deployment``), chosen for a node's CUDA instances by
``GSHARE_CUDA_DEPLOYMENT`` (default ``preload``):

* ``"preload"``: ``LD_PRELOAD=libgshare_cuda.so``. Governs what reaches the driver through the
  exported symbols, ``dlsym`` and ``cuGetProcAddress``; a runtime that reaches the driver
  another way is not governed.
* ``"shim"``: a directory holding a ``libcuda.so.1`` built from the interposer and forwarders to
  every other function of the node's real driver (``shim.build_shim``), first on
  ``LD_LIBRARY_PATH``; the real driver is loaded by absolute path (``GSHARE_REAL_LIBCUDA``).
  Everything that loads ``libcuda.so.1`` gets the shim. x86-64 only.

The stats JSON (``GSHARE_CUDA_STATS``) says which deployment a process ran under and through
which entry points its launches came (``launches_by_entry``): the check that interception
works on a given stack.

This module is the Python side:

* ``build()`` runs ``make -C native`` (the project's ``make native``): one line of output, and a
  skip (not an error) without a C compiler or the toolkit's ``cuda.h``;
* ``library_path()`` / ``preload_env()`` / ``instance_env()`` locate the library and give the
  ``LD_PRELOAD`` that the node agent puts in the environment of processes that run CUDA
  instances (the fork template, or a Ray actor), with the token server's window epoch;
* ``find_real_libcuda()``, ``build_shim()``, ``shim_env()`` (``shim``) make the shim deployment;
  ``deployment_env(kind, ...)`` gives either deployment's environment, ``prepare_shim()`` builds
  (or reuses) a shim for the node's driver, and ``cuda_deployment_env()`` is what the node agent
  calls: the environment of the deployment ``GSHARE_CUDA_DEPLOYMENT`` names;
* ``configure_interposer()`` is called by a CUDA instance before it touches CUDA: it hands the
  interposer the token socket, the instance id, its secret (never in the environment) and its
  memory cap, through the library's exported ``gshare_cuda_configure``. It returns False when
  the library is not loaded in this process (then the PyTorch hook governs, as on the CPU);
* ``NativeTokens`` stands in for the instance's ``TokenClient`` when the interposer governs (the
  interposer holds the instance's one token connection; the server accepts one per id);
* ``read_kernel_profile()`` reads the measurement mode's output (``GSHARE_CUDA_PROFILE``) as a
  ``policy.priority.KernelProfile``.

What has been tested: everything above against a stub driver (``tests/native``), in both
deployments; nothing here has run on a GPU or with a real ``libcuda``.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gshare.policy.priority.profile import KernelProfile
from gshare.runtime.native.toolchain import (  # re-exported: part of this module's API
    ENV_LIBRARY,
    LIBRARY_NAME,
    NATIVE_DIR,
    build_skip_reason,
    cuda_include_dir,
)


@dataclass(frozen=True)
class BuildResult:
    built: bool
    message: str
    """The build's one line (``native: built ...`` or ``native: skipped: <reason>``)."""
    path: Path | None


def build() -> BuildResult:
    """Build ``native/build/libgshare_cuda.so`` (``make -C native``)."""
    reason = build_skip_reason()
    if reason is not None:
        return BuildResult(False, f"native: skipped: {reason}", None)
    proc = subprocess.run(
        ["make", "-s", "-C", str(NATIVE_DIR)], capture_output=True, text=True, check=False
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    path = NATIVE_DIR / "build" / LIBRARY_NAME
    ok = proc.returncode == 0 and path.is_file()
    return BuildResult(ok, lines[-1] if lines else "native: no output", path if ok else None)


def library_path() -> Path | None:
    """The built interposer, or None (not built, or no toolkit on this machine)."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return Path(env) if Path(env).is_file() else None
    path = NATIVE_DIR / "build" / LIBRARY_NAME
    return path if path.is_file() else None


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``{"LD_PRELOAD": ...}`` that loads the interposer in a new process (prepended to the
    ``LD_PRELOAD`` of ``env``, default ``os.environ``); ``{}`` when it is not built."""
    lib = library_path()
    if lib is None:
        return {}
    old = (os.environ if env is None else env).get("LD_PRELOAD", "")
    parts = [p for p in old.replace(":", " ").split() if p and Path(p).name != LIBRARY_NAME]
    return {"LD_PRELOAD": ":".join([str(lib), *parts])}


def instance_env(epoch_s: float, deployment: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a CUDA instance's process needs in its environment (``{}`` when the interposer is
    not built): the deployment's entries (``deployment``, from ``deployment_env``; default the
    ``LD_PRELOAD`` of ``preload_env()``) and the token server's ``epoch_s``
    (``time.monotonic``, the interposer's CLOCK_MONOTONIC), so that its work on a token stops
    at the window's end."""
    env = preload_env() if deployment is None else dict(deployment)
    if env:
        env["GSHARE_TOKEN_EPOCH_S"] = repr(epoch_s)
    return env


# -- deployments ----------------------------------------------------------------------------

Deployment = Literal["preload", "shim"]
DEPLOYMENTS: tuple[Deployment, ...] = ("preload", "shim")
ENV_DEPLOYMENT = "GSHARE_CUDA_DEPLOYMENT"
"""Which deployment a node agent gives its CUDA instances (default ``preload``)."""
ENV_SHIM_DIR = "GSHARE_CUDA_SHIM_DIR"
"""Where a node agent builds (or finds, already built) its shim."""
ENV_REAL_LIBCUDA = "GSHARE_REAL_LIBCUDA"
"""The real driver (else ``find_real_libcuda()``); the shim reads it too."""


def deployment_kind(setting: str | None = None) -> Deployment:
    """``setting`` (default ``$GSHARE_CUDA_DEPLOYMENT``, default ``"preload"``) checked."""
    value = (setting if setting is not None else os.environ.get(ENV_DEPLOYMENT, "")).strip()
    value = value or "preload"
    if value not in DEPLOYMENTS:
        raise ValueError(f"{ENV_DEPLOYMENT} must be one of {', '.join(DEPLOYMENTS)}, got {value!r}")
    return value


def deployment_env(
    kind: Deployment,
    *,
    shim_dir: Path | None = None,
    real_libcuda: Path | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment entries of a deployment for a new process: ``"preload"``:
    ``preload_env(base)`` (``{}`` when the interposer is not built); ``"shim"``:
    ``shim_env(shim_dir, real_libcuda, base)`` (both required)."""
    if kind == "preload":
        return preload_env(None if base is None else dict(base))
    if kind == "shim":
        if shim_dir is None or real_libcuda is None:
            raise ValueError("the shim deployment needs shim_dir and real_libcuda")
        return shim_env(shim_dir, real_libcuda, base)
    raise ValueError(f"unknown deployment {kind!r} (one of {', '.join(DEPLOYMENTS)})")


def prepare_shim(out_dir: Path, real_libcuda: Path | None = None) -> tuple[Path, Path]:
    """A shim for the node's real driver in ``out_dir``: reused when its manifest names the
    same driver and it is newer than the driver and the interposer's source (when there is
    one), else built.
    The driver: ``real_libcuda``, else ``$GSHARE_REAL_LIBCUDA``, else ``find_real_libcuda()``.
    Returns ``(shim_dir, real_libcuda)``; raises ``ShimError`` (one line) when it cannot."""
    real = real_libcuda
    if real is None and os.environ.get(ENV_REAL_LIBCUDA):
        real = Path(os.environ[ENV_REAL_LIBCUDA])
    if real is None:
        real = find_real_libcuda()
    if real is None:
        raise ShimError("no real libcuda.so.1 on this node (ldconfig -p, the usual folders)")
    real = Path(real).resolve()
    lib, manifest = Path(out_dir) / SHIM_NAME, Path(out_dir) / MANIFEST
    src = NATIVE_DIR / "gshare_cuda.c"  # absent where only a prebuilt shim is shipped
    try:
        fresh = (
            json.loads(manifest.read_text()).get("real_libcuda") == str(real)
            and lib.stat().st_mtime >= real.stat().st_mtime
            and (not src.is_file() or lib.stat().st_mtime >= src.stat().st_mtime)
        )
    except (OSError, ValueError, AttributeError):
        fresh = False
    if not fresh:
        build_shim(real, Path(out_dir))
    return Path(out_dir), real


def cuda_deployment_env(work_dir: Path, setting: str | None = None) -> dict[str, str]:
    """The environment of the deployment that ``setting`` (default ``$GSHARE_CUDA_DEPLOYMENT``,
    default ``preload``) names, for processes that run CUDA instances: ``preload_env()``, or
    ``shim_env`` of a shim prepared in ``$GSHARE_CUDA_SHIM_DIR`` (default
    ``work_dir/cuda-shim``). Raises ``ValueError`` for an unknown setting and ``ShimError``
    when the shim was asked for and cannot be made (never a silent fallback to ``preload``)."""
    kind = deployment_kind(setting)
    if kind == "preload":
        return deployment_env("preload")
    out = Path(os.environ.get(ENV_SHIM_DIR) or Path(work_dir) / "cuda-shim")
    shim_dir, real = prepare_shim(out)
    return deployment_env("shim", shim_dir=shim_dir, real_libcuda=real)


def _loaded() -> ctypes.CDLL | None:
    """This process's handle when the interposer is loaded in it: preloaded (the process's
    global scope has it), or, in the shim deployment (``GSHARE_REAL_LIBCUDA`` set), the
    ``libcuda.so.1`` that the library path finds is the shim (loading it here is what the
    process's first CUDA call would do)."""
    try:
        proc = ctypes.CDLL(None)
        proc.gshare_cuda_configure  # noqa: B018 -- raises AttributeError when absent
        return proc
    except (OSError, AttributeError):
        pass
    if not os.environ.get(ENV_REAL_LIBCUDA):
        return None
    try:
        lib = ctypes.CDLL(SHIM_NAME)
        lib.gshare_cuda_configure  # noqa: B018
    except (OSError, AttributeError):
        return None
    return lib


def interposer_loaded() -> bool:
    return _loaded() is not None


def configure_interposer(
    token_socket: str, client_id: str, secret: str = "", mem_limit_mb: float = 0.0
) -> bool:
    """Hand this instance's token identity and memory cap to the interposer loaded in this
    process; False (nothing done) when it is not loaded. Call before anything touches CUDA."""
    lib = _loaded()
    if lib is None or not token_socket:
        return False
    fn = lib.gshare_cuda_configure
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double]
    fn.restype = ctypes.c_int
    rc = fn(
        token_socket.encode(),
        client_id.encode(),
        secret.encode() if secret else None,
        float(mem_limit_mb),
    )
    return int(rc) == 0


def read_kernel_profile(path: str | Path) -> KernelProfile:
    """The measurement mode's output (``GSHARE_CUDA_PROFILE``: ``KernelProfile.to_records``)."""
    return KernelProfile.from_records(json.loads(Path(path).read_text()))


class NativeTokens:
    """The instance frontend's token client when the interposer governs the device.

    The interposer holds the instance's token connection and gates every kernel launch itself,
    so the frontend's burst protocol (``InstanceServer``) runs against this stand-in: every
    call succeeds at once, a token is always "held" and never runs out (the frontend's
    preemption-point hook is not installed). Its token-wait statistics then read 0: the wait
    happens inside launches."""

    client_id = ""
    token_ms: float | None = math.inf
    predicted_burst_ms = 0.0
    reused = 0

    def __init__(self) -> None:
        self._in_burst = False

    @property
    def in_burst(self) -> bool:
        return self._in_burst

    def acquire(self) -> float:
        return math.inf

    def release(self, busy_ms: float, completed: bool = True) -> None:
        return None

    def reusable(self) -> bool:
        return True

    def start_burst(self) -> float:
        self._in_burst = True
        return math.inf

    def begin_burst(self) -> None:
        self._in_burst = True

    def end_burst(self) -> float:
        self._in_burst = False
        return 0.0

    def release_if_held(self, completed: bool = True) -> bool:
        return False

    def renew(self) -> float:
        return math.inf

    def idle(self) -> bool:
        return False

    def token_left_ms(self) -> float:
        return math.inf

    def should_yield(self, next_kernel_ms: float) -> bool:
        return False

    def close(self) -> None:
        return None


# the shim deployment (imported last: it uses the helpers above)
from gshare.runtime.native.shim import (  # noqa: E402
    MANIFEST,
    SHIM_NAME,
    ShimError,
    build_shim,
    find_real_libcuda,
    is_shim,
    read_elf_symbols,
    shim_env,
    shim_skip_reason,
)

__all__ = [
    "DEPLOYMENTS",
    "ENV_DEPLOYMENT",
    "ENV_REAL_LIBCUDA",
    "ENV_SHIM_DIR",
    "LIBRARY_NAME",
    "MANIFEST",
    "SHIM_NAME",
    "BuildResult",
    "Deployment",
    "NativeTokens",
    "ShimError",
    "build",
    "build_shim",
    "build_skip_reason",
    "configure_interposer",
    "cuda_deployment_env",
    "cuda_include_dir",
    "deployment_env",
    "deployment_kind",
    "find_real_libcuda",
    "instance_env",
    "interposer_loaded",
    "is_shim",
    "library_path",
    "preload_env",
    "prepare_shim",
    "read_elf_symbols",
    "read_kernel_profile",
    "shim_env",
    "shim_skip_reason",
]
