"""``make gpu-check``: run the GPU kit's parts on this machine and write what they found.

``python -m gshare.gpukit [--out DIR] [--budget-s 520] [--parts a,c,...] [--dry-run]``, from
the repository root with ``PYTHONPATH=src`` (the Makefile does both). Standard library only
until the bundle is installed. Steps, all under one deadline (``--budget-s``, from the start):

1. **setup** — installs ``.gpu-bundle/*.whl`` into ``WORK/site`` with ``pip --no-deps
   --no-index --target`` (never touching the machine's PyTorch; unzipped when pip is
   missing), checks the imports gshare needs, builds ``native/`` and the probe with the
   machine's toolkit, finds the real ``libcuda.so.1`` and builds the ``libcuda.so.1`` shim
   from it, and reads the provenance (GPU, driver, CUDA, torch, gshare commit). A dry run
   builds the stub driver of ``tests/native`` instead and uses this venv's packages;
2. **parts** — each ``gshare.gpukit.parts.<part>`` in its own process (its own session, killed
   with its children past its budget + a grace), in order, going on past failures; a part gets
   ``min(its budget, what is left)``, none is started with under 10 s left;
3. **results** — ``results.json`` and ``RESULTS.md`` (``gshare.gpukit.results``), the failed
   parts' logs (``failed-logs.txt``) and the kernel table part e writes, all in ``--out`` (at
   most 8 files: what a GPU window brings back).

Exit status 0 when no part failed, 1 when one did (the results are written either way), 2 on
a bad option. The kit never changes a GPU setting.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from gshare.gpukit import PARTS, PartInfo, select_parts
from gshare.gpukit.results import SCHEMA_VERSION, read_part, render_markdown, validate

ROOT = Path(__file__).resolve().parents[3]
"""The source checkout: src/, native/, tests/."""
SRC = ROOT / "src"
PROBE_DIR = Path(__file__).resolve().parent / "probe"
GRACE_S = 15.0
MIN_PART_S = 10.0
MAX_OUT_FILES = 8
NEEDED_IMPORTS = (
    "numpy",
    "torch",
    "transformers",
    "pydantic",
    "fastapi",
    "uvicorn",
    "httptools",
    "uvloop",
    "orjson",
    "httpx",
    "psutil",
    "yaml",
    "prometheus_client",
    "pytest",
)


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 (first 16 hex digits) over the paths and contents of ``src/gshare`` (``.py``,
    ``.c``, ``.cu``) and ``native/`` (``.c``, ``Makefile``), in path order: what ran, even where
    the copy's git metadata is stale (a device tool that copies the working tree onto an older
    clone reports that clone's commit as dirty). Compare with this function at a commit."""
    h = hashlib.sha256()
    files = [
        p
        for p in sorted((root / "src" / "gshare").rglob("*")) + sorted((root / "native").glob("*"))
        if p.is_file() and (p.suffix in (".py", ".c", ".cu") or p.name == "Makefile")
    ]
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class Kit:
    """One run of the kit: its folders, its deadline, its setup notes and its context."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.deadline: float = self.t0 + float(args.budget_s)
        self.out: Path = args.out.resolve()
        self.work: Path = (args.work or ROOT / ".gpu-kit" / "work").resolve()
        self.notes: list[str] = []
        self.setup_log: list[str] = []
        self.setup_failed = False
        self.env = dict(os.environ)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, msg: str) -> None:
        print(f"gpu-check: {msg}", flush=True)
        self.notes.append(msg)

    def sh(
        self, cmd: list[str], timeout_s: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a setup command, its output kept for the failed-logs file."""
        try:
            p = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False, **kw
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            self.setup_log.append(f"$ {' '.join(cmd)}\n{type(e).__name__}: {e}")
            self.setup_failed = True
            return subprocess.CompletedProcess(cmd, 127, "", str(e))
        self.setup_log.append(
            f"$ {' '.join(cmd)}\n[exit {p.returncode}]\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
        )
        self.setup_failed |= p.returncode != 0
        return p

    # -- setup ----------------------------------------------------------------------------------

    def install_bundle(self) -> None:
        bundle = self.args.bundle.resolve()
        wheels = sorted(bundle.glob("*.whl"))
        pythonpath = [str(SRC)]
        if self.args.dry_run:
            self.note("dry run: this interpreter's packages (the bundle is not installed)")
        elif not wheels:
            self.note(f"no bundle at {bundle} (make gpu-bundle): using the machine's packages")
        else:
            site = self.work / "site"
            shutil.rmtree(site, ignore_errors=True)
            site.mkdir(parents=True)
            p = self.sh(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-deps",
                    "--no-index",
                    "--target",
                    str(site),
                    "-q",
                    *map(str, wheels),
                ],
                180,
            )
            if p.returncode != 0:
                for w in wheels:  # a wheel is a zip of its import folders
                    with zipfile.ZipFile(w) as z:
                        z.extractall(site)
                self.note(f"pip failed ({p.returncode}); unzipped {len(wheels)} wheels instead")
            else:
                self.note(f"installed {len(wheels)} bundled wheels into {site}")
            pythonpath.insert(0, str(site))
            sys.path[:0] = pythonpath
        old = self.env.get("PYTHONPATH")
        self.env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *([old] if old else [])])
        self.env["PYTHONUNBUFFERED"] = "1"
        code = (
            "import importlib.util as u; "
            f"print(' '.join(m for m in {NEEDED_IMPORTS!r} if u.find_spec(m) is None))"
        )
        p = self.sh([sys.executable, "-c", code], env=self.env)
        missing = p.stdout.strip()
        if missing:
            self.note(f"missing imports: {missing}")

    def cuda_home(self) -> str | None:
        for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
            if cand and (Path(cand) / "include" / "cuda.h").is_file():
                return cand
        nvcc = shutil.which("nvcc")
        if nvcc:
            home = Path(os.path.realpath(nvcc)).parent.parent
            if (home / "include" / "cuda.h").is_file():
                return str(home)
        return None

    def build_native(self) -> str | None:
        home = self.cuda_home()
        if home is None:
            self.note("no CUDA toolkit (cuda.h): the interposer and the probe are not built")
            return None
        self.env["CUDA_HOME"] = home
        p = self.sh(["make", "-s", "-C", str(ROOT / "native")], 180, env=self.env)
        lib = ROOT / "native" / "build" / "libgshare_cuda.so"
        self.note((p.stdout.strip().splitlines() or [f"native: exit {p.returncode}"])[-1])
        return str(lib) if p.returncode == 0 and lib.is_file() else None

    def build_probe(self) -> tuple[str | None, str | None]:
        home = self.env.get("CUDA_HOME")
        d = self.work / "probe"
        d.mkdir(parents=True, exist_ok=True)
        ptx = d / "kernels.ptx"
        nvcc = shutil.which("nvcc") or (f"{home}/bin/nvcc" if home else None)
        if nvcc and Path(nvcc).exists():
            p = self.sh(
                [nvcc, "-ptx", "-arch=compute_80", str(PROBE_DIR / "kernels.cu"), "-o", str(ptx)],
                120,
            )
            if p.returncode != 0:
                self.note("nvcc could not compile the probe's kernels")
                return None, None
        elif self.args.dry_run:
            ptx.write_text("// no nvcc here: the stub driver does not read the module\n")
        else:
            self.note("no nvcc: the probe's kernels cannot be compiled")
            return None, None
        if not home:
            return None, str(ptx)
        exe = d / "probe"
        p = self.sh(
            [
                "gcc",
                "-std=c11",
                "-O2",
                "-Wall",
                "-I",
                f"{home}/include",
                "-o",
                str(exe),
                str(PROBE_DIR / "probe.c"),
                "-ldl",
            ]
        )
        if p.returncode != 0:
            self.note("the probe did not build (gcc)")
            return None, str(ptx)
        return str(exe), str(ptx)

    def build_stub(self) -> str | None:
        home = self.env.get("CUDA_HOME")
        if not home:
            return None
        d = self.work / "stub"
        d.mkdir(parents=True, exist_ok=True)
        lib = d / "libcuda.so.1"
        p = self.sh(
            [
                "gcc",
                "-std=c11",
                "-O2",
                "-fPIC",
                "-shared",
                "-fvisibility=hidden",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic",
                "-I",
                f"{home}/include",
                "-o",
                str(lib),
                str(ROOT / "tests" / "native" / "stub_cuda.c"),
                "-lpthread",
            ]
        )
        if p.returncode != 0:
            self.note("the stub driver did not build")
            return None
        return str(lib)

    def find_libcuda(self) -> str | None:
        """The real driver: ``runtime.native.find_real_libcuda`` where this checkout has it,
        else the file the dynamic loader maps for ``libcuda.so.1`` (read back from
        ``/proc/self/maps`` of a child that loads it: whatever ldconfig or LD_LIBRARY_PATH
        say, that is the one a CUDA program gets)."""
        from gshare.runtime import native

        finder = getattr(native, "find_real_libcuda", None)
        if finder is not None:
            found = finder()
            if found is not None:
                return str(found)
        code = (
            "import ctypes; ctypes.CDLL('libcuda.so.1'); "
            "print(next(l.split()[-1] for l in open('/proc/self/maps') "
            "if l.rstrip().endswith(('libcuda.so.1',)) or '/libcuda.so.' in l))"
        )
        p = self.sh([sys.executable, "-c", code], env=self.env)
        path = p.stdout.strip()
        return path if p.returncode == 0 and path.startswith("/") else None

    def build_shim(self, real: str | None) -> tuple[str | None, str]:
        if real is None:
            return None, "no real libcuda.so.1 found"
        from gshare.runtime import native

        builder = getattr(native, "build_shim", None)
        if builder is None:
            return None, "this checkout has no shim builder (runtime.native.build_shim)"
        try:
            return str(builder(Path(real), self.work / "shim")), ""
        except Exception as e:  # noqa: BLE001 -- reported as the shim's reason, the kit goes on
            return None, f"{type(e).__name__}: {e}"

    def provenance(self, real: str | None, probe: str | None) -> dict[str, Any]:
        prov: dict[str, Any] = {
            "kit_started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "dry_run": self.args.dry_run,
            "budget_s": self.args.budget_s,
            "parts": self.args.parts or "all",
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        }
        git = self.sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
        prov["gshare_commit"] = git.stdout.strip() or "unknown (no git)"
        dirty = self.sh(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
        prov["gshare_dirty"] = bool(dirty.stdout.strip())
        prov["source_sha256"] = source_digest()
        code = (
            "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': "
            "torch.version.cuda, 'devices': torch.cuda.device_count() if "
            "torch.cuda.is_available() else 0}))"
        )
        t = self.sh([sys.executable, "-c", code], 180, env=self.env)
        try:
            tinfo = json.loads(t.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tinfo = {"torch": "not importable", "cuda": None, "devices": 0}
        prov["torch"] = tinfo["torch"]
        prov["torch_cuda"] = tinfo["cuda"]
        prov["cuda_devices"] = 0 if self.args.dry_run else tinfo["devices"]
        smi = shutil.which("nvidia-smi")
        gpu = ""
        if smi and not self.args.dry_run:
            q = self.sh(
                [
                    smi,
                    "--query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current",
                    "--format=csv,noheader",
                ]
            )
            first = (q.stdout.strip().splitlines() or [""])[0]
            fields = [x.strip() for x in first.split(",")]
            if len(fields) >= 5:
                gpu = fields[0]
                prov.update(
                    driver=fields[1],
                    gpu_memory=fields[2],
                    compute_mode=fields[3],
                    mig_mode=fields[4],
                )
            head = self.sh([smi])
            for line in head.stdout.splitlines():
                if "CUDA Version" in line:
                    prov["driver_cuda_version"] = line.split("CUDA Version:")[-1].strip(" |")
        nvcc = shutil.which("nvcc")
        if nvcc:
            v = self.sh([nvcc, "--version"])
            prov["nvcc"] = (v.stdout.strip().splitlines() or [""])[-1]
        prov["libcuda"] = real
        if probe:
            env = dict(self.env)
            if self.args.dry_run and real:
                env["LD_LIBRARY_PATH"] = str(Path(real).parent)
            info = self.sh([probe, "info"], 60, env=env)
            try:
                pinfo = json.loads(info.stdout.strip().splitlines()[-1])
                prov["driver_api_version"] = pinfo["driver_version"]
                gpu = gpu or pinfo["device"]
            except (IndexError, json.JSONDecodeError, KeyError):
                pass
        if self.args.dry_run:
            gpu = f"none (dry run on the stub driver: {gpu or 'not built'})"
        prov["gpu"] = gpu or "none found"
        prov["setup_notes"] = "; ".join(self.notes)
        return prov

    # -- parts ----------------------------------------------------------------------------------

    def run_part(self, part: PartInfo, ctx_path: Path) -> dict[str, Any]:
        left = self.left()
        if left < MIN_PART_S:
            return {
                "status": "skipped",
                "figures": [],
                "seconds": 0.0,
                "reason": f"no time left in the kit's budget ({left:.0f} s)",
            }
        budget = min(part.budget_s, left - 2.0)
        res = self.work / "parts" / f"{part.key}.json"
        res.parent.mkdir(parents=True, exist_ok=True)
        res.unlink(missing_ok=True)
        log = self.work / "logs" / f"{part.key}-{part.module}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            f"gshare.gpukit.parts.{part.module}",
            "--ctx",
            str(ctx_path),
            "--out",
            str(res),
            "--budget-s",
            f"{budget:.1f}",
        ]
        print(f"gpu-check: part {part.key} ({part.title}), budget {budget:.0f} s", flush=True)
        t0 = time.monotonic()
        out: dict[str, Any]
        with open(log, "w") as f:
            p = subprocess.Popen(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
            try:
                p.wait(timeout=budget + GRACE_S)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(p)
        secs = round(time.monotonic() - t0, 1)
        if timed_out:
            out = {
                "status": "fail",
                "figures": [],
                "reason": f"timed out: still running {budget + GRACE_S:.0f} s after its start",
            }
            if res.is_file():
                with contextlib.suppress(ValueError):
                    out["figures"] = read_part(res)["figures"]
        elif not res.is_file():
            out = {
                "status": "fail",
                "figures": [],
                "reason": f"the part exited {p.returncode} without a result",
            }
        else:
            try:
                out = read_part(res)
            except ValueError as e:
                out = {"status": "fail", "figures": [], "reason": str(e)}
        out["seconds"] = secs
        print(
            f"gpu-check: part {part.key}: {out['status']} in {secs} s"
            + (f" ({out['reason'][:200]})" if out.get("reason") else ""),
            flush=True,
        )
        return out

    def failed_logs(self, results: dict[str, dict[str, Any]]) -> str:
        chunks = []
        for part in PARTS:
            r = results.get(part.key)
            if r is None or r["status"] != "fail":
                continue
            chunks.append(f"===== part {part.key} ({part.module}): {r.get('reason', '')}")
            log = self.work / "logs" / f"{part.key}-{part.module}.log"
            chunks.append(_tail_text(log, 400))
            for extra in sorted(self.work.glob(f"{part.key}-*")):
                if extra.suffix in (".err", ".log") and extra.stat().st_size:
                    chunks.append(f"----- {extra.name}")
                    chunks.append(_tail_text(extra, 80))
        if chunks or self.setup_failed:
            chunks.append("===== setup commands")
            chunks += [x[-4000:] for x in self.setup_log]
        return "\n".join(chunks)


def _tail_text(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    """Kill the part's whole session (its measured processes with it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m gshare.gpukit", description="Run gshare's GPU kit (docs/gpu/README.md)."
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "gpu-results",
        help="the result folder (RESULTS.md, results.json, ...)",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="private build and log folder (default .gpu-kit/work)",
    )
    ap.add_argument("--budget-s", type=float, default=520.0, help="total deadline, seconds")
    ap.add_argument(
        "--parts",
        default=None,
        help="comma-separated letters or names (default: all): "
        + ", ".join(f"{p.key}={p.module}" for p in PARTS),
    )
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu-bundle")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU against the stub driver; GPU-only figures are skipped",
    )
    a = ap.parse_args(argv)
    if a.budget_s <= 0:
        ap.error(f"--budget-s must be positive, got {a.budget_s:g}")
    try:
        a.selected = select_parts(a.parts)
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv: list[str] | None = None) -> int:
    from gshare.gpukit.parts.common import KitContext

    args = parse_args(argv)
    kit = Kit(args)
    kit.work.mkdir(parents=True, exist_ok=True)
    kit.out.mkdir(parents=True, exist_ok=True)
    for old in (
        "RESULTS.md",
        "results.json",
        "failed-logs.txt",
        "fikit-kernels.csv",
        "kernel-trace.csv",
    ):
        (kit.out / old).unlink(missing_ok=True)
    kit.install_bundle()
    interposer = kit.build_native()
    probe, ptx = kit.build_probe()
    real = kit.build_stub() if args.dry_run else kit.find_libcuda()
    if real is None:
        kit.note("no libcuda.so.1 to forward to: the interposer's parts will fail")
    shim, shim_error = kit.build_shim(real)
    if shim_error:
        kit.note(f"the libcuda.so.1 shim was not built: {shim_error}")
    prov = kit.provenance(real, probe)
    ctx = KitContext(
        dry_run=args.dry_run,
        work=str(kit.work),
        out=str(kit.out),
        python=sys.executable,
        env=kit.env,
        interposer=interposer,
        real_libcuda=real,
        shim_dir=shim,
        shim_error=shim_error,
        probe=probe,
        ptx=ptx,
        cuda_devices=int(prov["cuda_devices"]),
        notes=kit.notes,
    )
    ctx_path = kit.work / "kit.json"
    ctx.save(ctx_path)
    print(f"gpu-check: setup done in {time.monotonic() - kit.t0:.1f} s; GPU: {prov['gpu']}")
    results: dict[str, dict[str, Any]] = {}
    for part in args.selected:
        results[part.key] = {
            "title": part.title,
            "module": part.module,
            **kit.run_part(part, ctx_path),
        }
    prov["wall_s"] = round(time.monotonic() - kit.t0, 1)
    prov["setup_notes"] = "; ".join(kit.notes)
    doc = {
        "schema": SCHEMA_VERSION,
        "gpu": prov["gpu"],
        "dry_run": args.dry_run,
        "provenance": prov,
        "parts": results,
    }
    validate(doc)
    (kit.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    titles = {p.key: p.title for p in PARTS}
    (kit.out / "RESULTS.md").write_text(render_markdown(doc, titles))
    logs = kit.failed_logs(results)
    if logs:
        (kit.out / "failed-logs.txt").write_text(logs)
    files = sorted(p.name for p in kit.out.iterdir())
    if len(files) > MAX_OUT_FILES:
        print(
            f"gpu-check: warning: {len(files)} files in {kit.out} (a GPU window brings back "
            f"{MAX_OUT_FILES}): {files}"
        )
    failed = [k for k, r in results.items() if r["status"] == "fail"]
    summary = ", ".join(f"{k} {r['status']}" for k, r in results.items())
    print(f"gpu-check: {summary}; results in {kit.out} ({prov['wall_s']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
