"""The ``libcuda.so.1`` shim: the interposer and a forwarder for everything else the driver exports.

``LD_PRELOAD`` only governs what reaches the driver through the dynamic linker's global scope
(plus what the interposer's ``dlsym``/``cuGetProcAddress`` hooks catch). A process whose CUDA
runtime reaches the driver another way -- a reproduction of LithOS found PyTorch on CUDA 12.8
doing so, with nothing intercepted -- is governed only by a library that *is* ``libcuda.so.1``:
put first on ``LD_LIBRARY_PATH``, it is the library every ``dlopen("libcuda.so.1")`` and every
``-lcuda`` link finds. The shim is that library:

* ``native/gshare_cuda.c`` compiled with ``-DGSHARE_SHIM`` (the interposer: same wrappers, same
  gate; no ``dlsym`` export, nothing to redirect), with the real driver's path baked in as the
  default of ``GSHARE_REAL_LIBCUDA`` (which, set, overrides it);
* a generated x86-64 assembly file with one trampoline, ``jmp *slot(%rip)``, for every other
  function the real driver exports (read from its ``.dynsym`` by the small ELF reader below, no
  dependency), the slots filled by a constructor from ``dlopen(real, RTLD_LOCAL)`` + ``dlsym``
  (a function the real driver lacks returns ``CUDA_ERROR_NOT_FOUND``; all of them return
  ``CUDA_ERROR_SHARED_OBJECT_INIT_FAILED`` when it cannot be loaded);
* linked as ``DIR/libcuda.so.1`` (soname ``libcuda.so.1``, ``-Bsymbolic-functions``), with a
  ``libcuda.so`` link beside it and ``gshare_shim.json`` (what was forwarded, from where).

The real driver is loaded by absolute path, never by the name ``libcuda.so.1`` (which is the
shim), and locally (its symbols never enter the global scope). Symbol versions: a driver whose
exports carry versions gets a version script that gives the shim's symbols the same versions
(NVIDIA's driver exports them unversioned, as far as we know; the stub tests both).
x86-64 only: elsewhere ``build_shim`` refuses with one clear error (use the preload deployment).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gshare.runtime.native.toolchain import (
    LIBRARY_NAME,
    NATIVE_DIR,
    build_skip_reason,
    cuda_include_dir,
)

SHIM_NAME = "libcuda.so.1"
MANIFEST = "gshare_shim.json"
OWN_SYMBOL = "gshare_cuda_configure"
"""Exported by the interposer in both deployments: how a shim is told from a real driver."""

_EM_X86_64, _EM_AARCH64 = 62, 183
_MACHINES = {"x86_64": _EM_X86_64, "amd64": _EM_X86_64, "aarch64": _EM_AARCH64}
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_SHT_GNU_VERDEF, _SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFF
_STT_OBJECT, _STT_FUNC, _STT_TLS, _STT_GNU_IFUNC = 1, 2, 6, 10
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMON_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
)


class ShimError(RuntimeError):
    """The shim cannot be built here (the message says why, in one line)."""


@dataclass(frozen=True)
class ElfSymbols:
    """The defined, exported symbols of an ELF file (its ``.dynsym``, or ``.symtab`` for an
    object file)."""

    machine: int
    functions: tuple[str, ...]
    objects: tuple[str, ...]
    """Exported data (cannot be forwarded by a trampoline)."""
    versions: dict[str, str] = field(default_factory=dict)
    """Symbol -> its default version, for the symbols that have one (empty: unversioned)."""


def read_elf_symbols(path: str | Path, table: str = "dynsym") -> ElfSymbols:
    """Exported symbols of a 64-bit little-endian ELF file (default or protected visibility,
    global/weak/unique binding, defined). ``table``: ``"dynsym"`` (a shared library) or
    ``"symtab"`` (an object file). Raises ``ShimError`` when it is not such a file."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ShimError(f"{path}: not a 64-bit little-endian ELF file")
    machine = struct.unpack_from("<H", data, 18)[0]
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if not shoff or not shnum:
        raise ShimError(f"{path}: no section headers")
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    want = _SHT_DYNSYM if table == "dynsym" else _SHT_SYMTAB
    symtab = next((i for i, s in enumerate(sections) if s[1] == want), None)
    if symtab is None:
        raise ShimError(f"{path}: no .{table}")
    _, _, _, _, off, size, link, _, _, entsize = sections[symtab]
    str_off = sections[link][4]

    def cstr(base: int, at: int) -> str:
        end = data.index(b"\0", base + at)
        return data[base + at : end].decode("ascii", "replace")

    versym: list[int] = []
    vnames: dict[int, str] = {}
    if want == _SHT_DYNSYM:
        for s in sections:
            if s[1] == _SHT_GNU_VERSYM:
                versym = list(struct.unpack_from(f"<{s[5] // 2}H", data, s[4]))
            elif s[1] == _SHT_GNU_VERDEF:
                vstr = sections[s[6]][4]
                at = s[4]
                for _ in range(s[7]):  # sh_info: the number of definitions
                    _ver, flags, ndx, cnt, _hash, aux, nxt = struct.unpack_from(
                        "<HHHHIII", data, at
                    )
                    if cnt and not flags & 1:  # VER_FLG_BASE: the file's own name, no version
                        vnames[ndx] = cstr(vstr, struct.unpack_from("<I", data, at + aux)[0])
                    if not nxt:
                        break
                    at += nxt
    functions: dict[str, None] = {}
    objects: dict[str, None] = {}
    versions: dict[str, str] = {}
    for i in range(1, size // (entsize or 24)):
        name_off, info, other, shndx, _value, _size = struct.unpack_from(
            "<IBBHQQ", data, off + i * (entsize or 24)
        )
        bind, kind = info >> 4, info & 0xF
        if shndx == 0 or bind not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            continue
        if other & 3 not in (0, 3):  # hidden or internal
            continue
        if versym and i < len(versym):
            if versym[i] & 0x8000:  # a non-default (hidden) version: dlsym never returns it
                continue
            vname = vnames.get(versym[i] & 0x7FFF)
        else:
            vname = None
        name = cstr(str_off, name_off)
        if not _IDENT.fullmatch(name):
            continue
        if kind in (_STT_FUNC, _STT_GNU_IFUNC):
            functions[name] = None
        elif kind in (_STT_OBJECT, _STT_TLS):
            objects[name] = None
        else:
            continue
        if vname:
            versions[name] = vname
    return ElfSymbols(machine, tuple(functions), tuple(objects), versions)


def _driver_candidate(path: Path) -> bool:
    """A real driver for this machine: a 64-bit ELF library of its architecture, not gshare's
    (``ldconfig -p`` also lists 32-bit and foreign-architecture copies)."""
    try:
        syms = read_elf_symbols(path)
    except (OSError, ShimError, struct.error, ValueError):
        return False
    want = _MACHINES.get(platform.machine().lower())
    return (want is None or syms.machine == want) and OWN_SYMBOL not in syms.functions


def is_shim(path: str | Path) -> bool:
    """Whether ``path`` is a gshare library (a shim, or the interposer), not a real driver."""
    try:
        return OWN_SYMBOL in read_elf_symbols(path).functions
    except (OSError, ShimError, struct.error, ValueError):
        return False


def find_real_libcuda() -> Path | None:
    """The node's real ``libcuda.so.1``: ``ldconfig -p``'s entries, then the usual driver
    folders; the first that is a 64-bit library of this machine's architecture and not a
    gshare library (a shim) -- resolved. None when there is none (no NVIDIA driver)."""
    candidates: list[str] = []
    ldconfig = shutil.which("ldconfig") or (
        "/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None
    )
    if ldconfig:
        try:
            out = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            name, _, target = line.strip().partition(" => ")
            if name.startswith("libcuda.so.1 ") and target:
                candidates.append(target.strip())
    candidates.extend(_COMMON_PATHS)
    for c in candidates:
        p = Path(c)
        if p.is_file() and _driver_candidate(p):
            return p.resolve()
    return None


def shim_skip_reason() -> str | None:
    """Why no shim can be built on this machine (None: it can)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return (
            f"the libcuda.so.1 shim's forwarders are x86-64 assembly; this machine is {machine}: "
            "use the preload deployment"
        )
    return build_skip_reason()


def _assembly(names: list[str], real: Path) -> str:
    out = [
        f"# gshare libcuda.so.1 shim: {len(names)} forwarders to {real} (generated)",
        "\t.text",
    ]
    for i, n in enumerate(names):
        out += [
            f"\t.globl {n}",
            f"\t.type {n}, @function",
            "\t.p2align 4",
            f"{n}:",
            f"\tjmp *gshare_fwd_slots+{8 * i}(%rip)",
            f"\t.size {n}, .-{n}",
        ]
    out += ["\t.data", "\t.p2align 3", "\t.globl gshare_fwd_slots", "\t.hidden gshare_fwd_slots"]
    out += ["gshare_fwd_slots:"] + ["\t.quad gshare_fwd_unresolved"] * len(names)
    if not names:
        out.append("\t.quad 0")
    out += ["\t.section .rodata", "\t.globl gshare_fwd_names", "\t.hidden gshare_fwd_names"]
    out += ["gshare_fwd_names:"] + [f'\t.asciz "{n}"' for n in names] + ["\t.byte 0"]
    out += ["\t.p2align 2", "\t.globl gshare_fwd_count", "\t.hidden gshare_fwd_count"]
    out += ["gshare_fwd_count:", f"\t.long {len(names)}"]
    out += ['\t.section .note.GNU-stack,"",@progbits', ""]
    return "\n".join(out)


def _version_script(versions: Mapping[str, str], exported: list[str]) -> str:
    """One node per version of the real driver, holding the shim's symbols of that version."""
    nodes: dict[str, list[str]] = {}
    for n in exported:
        if n in versions:
            nodes.setdefault(versions[n], []).append(n)
    return "".join(f"{v} {{\n  global:\n    {'; '.join(ns)};\n}};\n" for v, ns in nodes.items())


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise ShimError(
            f"shim build failed: {' '.join(cmd[:2])} ...: {err[-1] if err else p.returncode}"
        )


def build_shim(real_libcuda: Path, out_dir: Path) -> Path:
    """Build ``out_dir/libcuda.so.1``: the interposer + forwarders to ``real_libcuda`` (an
    absolute path to the real driver). Returns ``out_dir``. Raises ``ShimError`` (one line)
    when it cannot: not x86-64, no gcc or ``cuda.h``, the real library missing, not an x86-64
    ELF shared library, or itself a gshare library."""
    reason = shim_skip_reason()
    if reason is not None:
        raise ShimError(f"cannot build the libcuda.so.1 shim: {reason}")
    real = Path(real_libcuda)
    if not real.is_absolute():
        raise ShimError(f"the real driver must be an absolute path, got {real}")
    if not real.is_file():
        raise ShimError(f"no real driver at {real}")
    real = real.resolve()
    syms = read_elf_symbols(real)
    if syms.machine != _EM_X86_64:
        raise ShimError(f"{real} is not an x86-64 library (ELF machine {syms.machine})")
    if OWN_SYMBOL in syms.functions:
        raise ShimError(
            f"{real} is a gshare library (a shim or the interposer), not the real driver"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "gcc")
    inc = str(cuda_include_dir())
    src = NATIVE_DIR / "gshare_cuda.c"
    real_c = json.dumps(str(real))  # a C string literal (the path is printable)
    cflags = [
        "-std=c11", "-O2", "-g", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra",
        "-Wno-unused-parameter", "-Wno-format-truncation", "-DGSHARE_SHIM",
        f"-DGSHARE_SHIM_REAL={real_c}", "-I", inc,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gshare-shim-") as tmp:
        t = Path(tmp)
        obj = t / "gshare_cuda.o"
        _run([cc, *cflags, "-c", "-o", str(obj), str(src)])
        own = read_elf_symbols(obj, "symtab").functions
        names = [n for n in syms.functions if n not in own]
        asm = t / "forward.S"
        asm.write_text(_assembly(names, real))
        link = [cc, "-shared", "-fPIC", f"-Wl,-soname,{SHIM_NAME}", "-Wl,-Bsymbolic-functions"]
        if syms.versions:
            vs = t / "versions.map"
            vs.write_text(_version_script(syms.versions, [*names, *own]))
            link.append(f"-Wl,--version-script={vs}")
        tmp_out = out_dir / f".{SHIM_NAME}.{os.getpid()}.tmp"
        _run([*link, "-o", str(tmp_out), str(obj), str(asm), "-ldl", "-lpthread"])
        tmp_out.replace(out_dir / SHIM_NAME)  # atomic: a running process keeps its old copy
    dev = out_dir / "libcuda.so"
    if not dev.is_symlink():
        dev.unlink(missing_ok=True)
        dev.symlink_to(SHIM_NAME)
    manifest = {
        "real_libcuda": str(real),
        "intercepted": sorted(n for n in own if n in syms.functions),
        "intercepted_absent_from_real": sorted(n for n in own if n not in syms.functions),
        "forwarded": len(names),
        "not_forwarded_data": list(syms.objects),
        "versioned": bool(syms.versions),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out_dir


def shim_env(
    shim_dir: Path, real_libcuda: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment entries that make a new process load the shim: ``LD_LIBRARY_PATH`` with
    ``shim_dir`` first (its other entries kept, after it) and ``GSHARE_REAL_LIBCUDA``. The
    interposer is not preloaded as well: ``LD_PRELOAD`` (when ``base``, default ``os.environ``,
    has one) is returned without ``libgshare_cuda.so``."""
    env = os.environ if base is None else base
    d = str(Path(shim_dir).resolve())
    old = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != d]
    out = {"LD_LIBRARY_PATH": ":".join([d, *old]), "GSHARE_REAL_LIBCUDA": str(real_libcuda)}
    if "LD_PRELOAD" in env:
        pre = env["LD_PRELOAD"].replace(":", " ").split()
        out["LD_PRELOAD"] = ":".join(p for p in pre if Path(p).name != LIBRARY_NAME)
    return out


__all__ = [
    "MANIFEST",
    "SHIM_NAME",
    "ElfSymbols",
    "ShimError",
    "build_shim",
    "find_real_libcuda",
    "is_shim",
    "read_elf_symbols",
    "shim_env",
    "shim_skip_reason",
]
