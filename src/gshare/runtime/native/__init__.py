"""The GPU frontend's native part: building, locating and configuring ``libgshare_cuda.so``.

``libgshare_cuda.so`` (C, ``native/gshare_cuda.c``) is a CUDA driver-API interposer loaded into
an instance process with ``LD_PRELOAD`` (FaST-GShare §3.3's hook library). It gates every
kernel launch on a time token from the node's token server (the same Unix-socket protocol and
``policy.tokens`` as the Python ``TokenClient``), measures device busy time with events around
bursts (Gemini), caps device memory at the instance's limit, and identifies kernels (FIKIT
§3.2). docs/DESIGN.md has the design; this module is the Python side:

* ``build()`` runs ``make -C native`` (the project's ``make native``): one line of output, and a
  skip (not an error) without a C compiler or the toolkit's ``cuda.h``;
* ``library_path()`` / ``preload_env()`` / ``instance_env()`` locate the library and give the
  ``LD_PRELOAD`` that the node agent puts in the environment of processes that run CUDA
  instances (the fork template, or a Ray actor), with the token server's window epoch;
* ``configure_interposer()`` is called by a CUDA instance before it touches CUDA: it hands the
  interposer the token socket, the instance id, its secret (never in the environment) and its
  memory cap, through the library's exported ``gshare_cuda_configure``. It returns False when
  the library is not loaded in this process (then the PyTorch hook governs, as on the CPU);
* ``NativeTokens`` stands in for the instance's ``TokenClient`` when the interposer governs (the
  interposer holds the instance's one token connection; the server accepts one per id);
* ``read_kernel_profile()`` reads the measurement mode's output (``GSHARE_CUDA_PROFILE``) as a
  ``policy.priority.KernelProfile``.

What has been tested: everything above against a stub driver (``tests/native``); nothing here has
run on a GPU or with a real ``libcuda``.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gshare.policy.priority.profile import KernelProfile

LIBRARY_NAME = "libgshare_cuda.so"
ENV_LIBRARY = "GSHARE_CUDA_INTERPOSER"
"""Path of a prebuilt interposer (else ``native/build/`` of the source tree)."""
NATIVE_DIR = Path(__file__).resolve().parents[4] / "native"
"""The C sources and their Makefile (present in a source checkout)."""


@dataclass(frozen=True)
class BuildResult:
    built: bool
    message: str
    """The build's one line (``native: built ...`` or ``native: skipped: <reason>``)."""
    path: Path | None


def cuda_include_dir() -> Path | None:
    """The toolkit's include folder holding ``cuda.h`` (``CUDA_HOME`` or /usr/local/cuda)."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    inc = home / "include"
    return inc if (inc / "cuda.h").is_file() else None


def build_skip_reason() -> str | None:
    """Why the interposer cannot be built here (None: it can)."""
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        return f"no C compiler ({os.environ.get('CC', 'gcc')})"
    if cuda_include_dir() is None:
        return "no cuda.h (set CUDA_HOME to the CUDA toolkit)"
    if not (NATIVE_DIR / "Makefile").is_file():
        return f"no native sources at {NATIVE_DIR}"
    return None


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


def instance_env(epoch_s: float) -> dict[str, str]:
    """What a CUDA instance's process needs in its environment (``{}`` when the interposer is
    not built): the ``LD_PRELOAD`` and the token server's ``epoch_s`` (``time.monotonic``, the
    interposer's CLOCK_MONOTONIC), so that its work on a token stops at the window's end."""
    env = preload_env()
    if env:
        env["GSHARE_TOKEN_EPOCH_S"] = repr(epoch_s)
    return env


def _loaded() -> ctypes.CDLL | None:
    """This process's handle when the interposer is loaded in it (``LD_PRELOAD``)."""
    try:
        proc = ctypes.CDLL(None)
        proc.gshare_cuda_configure  # noqa: B018 -- raises AttributeError when absent
    except (OSError, AttributeError):
        return None
    return proc


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

    def idle(self) -> bool:
        return False

    def token_left_ms(self) -> float:
        return math.inf

    def should_yield(self, next_kernel_ms: float) -> bool:
        return False

    def close(self) -> None:
        return None


__all__ = [
    "BuildResult",
    "LIBRARY_NAME",
    "NativeTokens",
    "build",
    "build_skip_reason",
    "configure_interposer",
    "cuda_include_dir",
    "instance_env",
    "interposer_loaded",
    "library_path",
    "preload_env",
    "read_kernel_profile",
]
