"""``make gpu-bundle``: the wheels a GPU machine without a network lacks, fetched here.

The target (docs/gpu/MACHINE.md) has Python 3.12 with PyTorch, transformers, numpy, scipy,
psutil, grpcio, httpx, typer, rich and prometheus-client, and no network. What gshare needs
beyond that is computed, not listed by hand: the dependency closure of ``ROOTS`` (as installed
in this checkout's venv, so the versions are the tested ones) minus the closure of
``TARGET_HAS`` (what the target's own packages already pulled in). Ray is never bundled (79 MB):
the live part runs ``gshare serve`` in its embedded default. The wheels are downloaded for
CPython 3.12 on manylinux x86-64 (``pip download --no-deps --only-binary=:all:``) into
``.gpu-bundle/`` with a ``bundle.json`` manifest; the bundle must stay under 40 MiB (the
device machine carries 64 MiB with the repository).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOTS = (
    "pydantic",
    "fastapi",
    "uvicorn",
    "httptools",
    "uvloop",
    "orjson",
    "tritonclient",
    "protobuf",
    "PyYAML",
    "networkx",
    "safetensors",
)
"""What ``gshare serve`` and the kit import beyond the target's packages."""
TARGET_HAS = (
    "torch",
    "transformers",
    "numpy",
    "scipy",
    "psutil",
    "grpcio",
    "httpx",
    "typer",
    "rich",
    "prometheus-client",
    "pytest",
)
"""What the target machine has installed (and, with it, their dependencies). pytest is there
too, with plugins that a bundled pytest of another version could break: it is not bundled."""
NEVER = frozenset({"ray", "torch", "nvidia-*", "triton"})
MAX_MIB = 40.0
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: str) -> list[str]:
    """The names ``dist`` requires unconditionally on Linux CPython 3.12 (no extras)."""
    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for r in reqs:
        name, _, marker = r.partition(";")
        if "extra" in marker:
            continue
        if marker.strip() and not _marker_true(marker):
            continue
        out.append(re.split(r"[ <>=!~\[(]", name.strip(), maxsplit=1)[0])
    return out


def _marker_true(marker: str) -> bool:
    try:
        from packaging.markers import Marker

        return bool(
            Marker(marker).evaluate(
                {
                    "python_version": "3.12",
                    "python_full_version": "3.12.0",
                    "sys_platform": "linux",
                    "platform_system": "Linux",
                    "platform_machine": "x86_64",
                    "implementation_name": "cpython",
                }
            )
        )
    except Exception:  # noqa: BLE001 -- an unparsable marker: include the requirement
        return True


def closure(names: tuple[str, ...] | list[str]) -> set[str]:
    """``names`` and everything they require, transitively (normalised names)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = _norm(todo.pop())
        if n in seen:
            continue
        seen.add(n)
        todo += _requires(n)
    return seen


def wanted() -> dict[str, str]:
    """Distribution -> the version installed here, for every wheel the target lacks."""
    need = closure(list(ROOTS)) - closure(list(TARGET_HAS))
    out = {}
    for n in sorted(need):
        if n in NEVER or any(n.startswith(p[:-1]) for p in NEVER if p.endswith("*")):
            continue
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"gpu-bundle: {n} is needed but not installed here: run make venv"
            ) from None
    return out


def download(dest: Path, dists: dict[str, str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "-d",
        str(dest),
        "-q",
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += [f"{n}=={v}" for n, v in dists.items()]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=Path(".gpu-bundle"))
    ap.add_argument("--list", action="store_true", help="print what would be bundled and stop")
    a = ap.parse_args()
    dists = wanted()
    if a.list:
        print(json.dumps(dists, indent=1))
        return
    a.dest.mkdir(parents=True, exist_ok=True)
    for old in a.dest.glob("*.whl"):
        old.unlink()
    print(f"gpu-bundle: downloading {len(dists)} wheels for CPython 3.12 x86-64 into {a.dest}")
    download(a.dest, dists)
    wheels = sorted(a.dest.glob("*.whl"))
    files = [
        {
            "file": w.name,
            "bytes": w.stat().st_size,
            "sha256": hashlib.sha256(w.read_bytes()).hexdigest(),
        }
        for w in wheels
    ]
    total = sum(f["bytes"] for f in files) / (1 << 20)
    (a.dest / "bundle.json").write_text(
        json.dumps(
            {"python": "3.12", "dists": dists, "wheels": files, "mib": round(total, 2)}, indent=1
        )
    )
    print(f"gpu-bundle: {len(wheels)} wheels, {total:.1f} MiB (limit {MAX_MIB:g})")
    if total > MAX_MIB:
        raise SystemExit(f"gpu-bundle: {total:.1f} MiB is over the {MAX_MIB:g}-MiB limit")


if __name__ == "__main__":
    main()
