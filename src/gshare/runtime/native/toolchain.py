"""Where the interposer's sources and toolchain are: its library name, the ``native/`` folder,
the CUDA toolkit's headers, and whether it can be built here. Shared by ``runtime.native`` (the
build and the preload deployment) and ``runtime.native.shim`` (the shim deployment), which
both import it: neither imports the other's module for these.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LIBRARY_NAME = "libgshare_cuda.so"
ENV_LIBRARY = "GSHARE_CUDA_INTERPOSER"
"""Path of a prebuilt interposer (else ``native/build/`` of the source tree)."""
NATIVE_DIR = Path(__file__).resolve().parents[4] / "native"
"""The C sources and their Makefile (present in a source checkout)."""


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


__all__ = ["ENV_LIBRARY", "LIBRARY_NAME", "NATIVE_DIR", "build_skip_reason", "cuda_include_dir"]
