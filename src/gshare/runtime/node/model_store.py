"""Model store: a function's weights live ONCE per node; instances map them (FaST-GShare §3.5).

NOTE — how the sharing works (and why this mechanism)
----------------------------------------------------
FaST-GShare's Model Storage Server allocates each tensor once (cuMemAlloc), exports a CUDA IPC
handle, and instances wrap the handle in a tensor (``STORE()`` / ``GET()``, §3.5, Fig. 7).
gshare does the same in two tiers:

* **Host tier (every node, CPU and GPU).** ``put`` writes the state dict once into a file on
  ``/dev/shm`` (tmpfs: RAM, never disk) in the safetensors layout — an 8-byte header length, a
  JSON header (dtype, shape, byte range per tensor), then the raw bytes, each tensor aligned
  to its element size, the data start aligned to 64 bytes. ``get`` maps the file with
  ``mmap(MAP_SHARED | MAP_POPULATE, PROT_READ)`` (pre-faulted: no page faults on the first
  requests) and wraps each byte range with ``torch.frombuffer`` — no copy, no
  deserialisation. Every process that maps the file shares the same physical pages,
  so N instances cost one copy (Linux PSS charges each mapper 1/N of the page). Pages are
  mapped read-only: a handler that writes to a weight in place gets SIGSEGV instead of
  corrupting the weights of every instance on the node.
  Instances then build the model skeleton on the meta device and adopt the mapped tensors
  with ``load_state_dict(assign=True)`` (``gshare.runtime.instance.models.load_weights``), which
  keeps the given storage and dtype and is checked afterwards not to have copied anything.

  Why not Ray's object store? It also gives zero-copy numpy views of shared memory (plasma),
  but only to Ray workers, only while an ``ObjectRef`` is held somewhere, and its objects may
  be spilled or evicted under pressure; a file on tmpfs is owned by the node (the agent
  decides when to ``drop`` it), survives agent restarts, is readable by any process of the
  user (tests, tools, the ``safetensors`` library itself), and needs no running Ray. Ray still
  places the agent and instances; it need not carry the weights.

* **Device tier (CUDA, node agent).** ``export_cuda(key, device)`` copies a stored state into
  ONE device allocation (256-byte aligned slices) and exports a CUDA IPC handle for it with
  PyTorch's own reduction (``torch.multiprocessing.reductions.reduce_tensor``, i.e.
  ``cudaIpcGetMemHandle`` on the caching allocator's block, with PyTorch's reference-counting
  and event synchronisation); the handle and the layout are written next to the host file.
  ``get(key, device="cuda:0")`` in another process opens it (``rebuild_cuda_tensor`` →
  ``cudaIpcOpenMemHandle``) and slices the same views: one copy per GPU. Rules from the CUDA
  documentation: the exporting process must stay alive while any consumer uses the memory
  (the agent keeps the tensor until ``drop``), a process cannot open its own handles (the
  exporter gets its tensors directly), and exporter and consumers must enumerate devices
  alike (same ``CUDA_VISIBLE_DEVICES``). This path needs a GPU and is tested only there.

Concurrency: ``put`` is atomic (write to a temporary file, ``rename``) and serialised per key
with ``flock`` so that concurrent first instances write once; ``drop`` unlinks the file —
processes that mapped it keep valid mappings, the memory is freed when the last one unmaps.
Who calls it: the node agent (``put``/``get_or_put`` when a function is deployed,
``export_cuda`` on GPU nodes, ``drop`` when its last instance is gone) and instance processes
(``get``, through ``gshare.runtime.instance.loading.load_handler``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import pickle
import re
import struct
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import torch

from gshare.runtime.node.files import DEFAULT_STORE_ROOT, store_dir

__all__ = ["DEFAULT_ROOT", "ModelStore", "StoreError"]

DEFAULT_ROOT: Final[str] = DEFAULT_STORE_ROOT
"""Default store directory; ``<uid>`` is replaced by the user id (one store per user and
node). Falls back to the temp directory where ``/dev/shm`` does not exist."""

_SUFFIX: Final[str] = ".safetensors"
_DATA_ALIGN: Final[int] = 64
_CUDA_ALIGN: Final[int] = 256
_ALIASES_META: Final[str] = "gshare.aliases"
_KEY_META: Final[str] = "gshare.key"
_SHA256_META: Final[str] = "gshare.sha256"
"""SHA-256 of the data section, written by ``put``; ``verify`` checks a file against it."""
_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,119}$")

# safetensors dtype names (https://github.com/huggingface/safetensors, format spec).
_DTYPES: Final[dict[str, torch.dtype]] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
_NAMES: Final[dict[torch.dtype, str]] = {v: k for k, v in _DTYPES.items()}


class StoreError(RuntimeError):
    """A store file that is missing, malformed or of the wrong kind."""


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's bytes as a flat uint8 view (no copy when already so)."""
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class _Mapped:
    """One read-only mapping of a store file and the tensors viewing it."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            self.ident = (st.st_ino, st.st_mtime_ns)
            if st.st_size < 8:
                raise StoreError(f"{path}: not a safetensors file (too short)")
            # MAP_POPULATE pre-faults the whole file: first requests take no page faults, and
            # every page of the copy shows in the instances' PSS (no hidden, unmapped part).
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mm = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the file alive
        (n,) = struct.unpack_from("<Q", self.mm, 0)
        if 8 + n > len(self.mm):
            raise StoreError(f"{path}: header length {n} beyond the end of the file")
        header = json.loads(bytes(self.mm[8 : 8 + n]))
        meta = header.pop("__metadata__", {}) or {}
        start = 8 + n
        self.tensors: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():
            # "The given buffer is not writable": deliberate, the weights are read-only.
            warnings.simplefilter("ignore", UserWarning)
            for name, info in header.items():
                dtype = _DTYPES.get(info["dtype"])
                if dtype is None:
                    raise StoreError(
                        f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}"
                    )
                shape = [int(d) for d in info["shape"]]
                lo, hi = (int(x) for x in info["data_offsets"])
                numel = 1
                for d in shape:
                    numel *= d
                if hi - lo != numel * dtype.itemsize or start + hi > len(self.mm):
                    raise StoreError(f"{path}: tensor {name!r} has an inconsistent byte range")
                if numel == 0:
                    t = torch.empty(shape, dtype=dtype)
                else:
                    t = torch.frombuffer(self.mm, dtype=dtype, count=numel, offset=start + lo)
                    t = t.view(shape)
                self.tensors[name] = t
        aliases = json.loads(meta.get(_ALIASES_META, "{}"))
        for alias, target in aliases.items():
            self.tensors[alias] = self.tensors[target]
        self.key = meta.get(_KEY_META)
        self.nbytes = len(self.mm)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.addr = torch.frombuffer(self.mm, dtype=torch.uint8, count=1).data_ptr()


class ModelStore:
    """Weights once per node, mapped read-only by every instance (see the module NOTE).

    ``put(key, state)`` writes a state dict once per key and returns its handle (the path of
    the file); ``get(key)`` returns tensors that map the shared copy (zero-copy, read-only);
    ``has``, ``drop``, ``keys``, ``nbytes``, ``get_or_put``; ``export_cuda`` / ``get(key,
    device="cuda:N")`` for the CUDA IPC tier. Instances of this class are cheap: each process
    makes its own on the same ``root``.
    """

    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        self.root = store_dir(root)
        # Tenants' instances (their own uids: instance.walls) open files by name: they may
        # traverse the directory, not list it, and read the files, never write them.
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.root, 0o711)
        self._mapped: dict[str, _Mapped] = {}
        self._cuda_owned: dict[tuple[str, str], tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        self._cuda_opened: dict[
            tuple[str, str], tuple[tuple[int, int], dict[str, torch.Tensor]]
        ] = {}

    # -- naming -------------------------------------------------------------------------------

    def _stem(self, key: str) -> str:
        if not key:
            raise ValueError("a model store key must be a non-empty string")
        if _KEY_RE.match(key):
            return key
        slug = re.sub(r"[^A-Za-z0-9_.\-]+", "_", key).strip("._-")[:80] or "key"
        return f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def path(self, key: str) -> Path:
        """The host-tier file of ``key`` (it may not exist)."""
        return self.root / (self._stem(key) + _SUFFIX)

    def _cuda_path(self, key: str, device: torch.device) -> Path:
        return self.root / f"{self._stem(key)}.{device.type}{device.index or 0}.ipc"

    # -- host tier ----------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return self.path(key).exists()

    def put(self, key: str, state: Mapping[str, torch.Tensor]) -> str:
        """Write ``state`` under ``key`` unless the key exists (then nothing is written: a
        key names one content — see ``instance.loading.weights_key``); return the handle (file
        path). Tensors on other devices are copied to the host; aliases (tied weights: the same
        storage, offset, shape and stride) are stored once."""
        final = self.path(key)
        if final.exists():
            return str(final)
        with _locked(self.root / f".{self._stem(key)}.lock"):
            if final.exists():
                return str(final)
            self._write(final, key, state)
        return str(final)

    def _write(self, final: Path, key: str, state: Mapping[str, torch.Tensor]) -> None:
        seen: dict[tuple[Any, ...], str] = {}
        aliases: dict[str, str] = {}
        entries: list[tuple[str, torch.Tensor]] = []
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"state[{name!r}] is a {type(t).__name__}, not a tensor")
            if t.dtype not in _NAMES:
                raise TypeError(f"state[{name!r}] has dtype {t.dtype}, which the store lacks")
            ident = (
                (
                    t.device,
                    t.untyped_storage().data_ptr(),
                    t.storage_offset(),
                    tuple(t.shape),
                    tuple(t.stride()),
                    t.dtype,
                )
                if t.numel()
                else None
            )
            if ident is not None and ident in seen:
                aliases[name] = seen[ident]
                continue
            if ident is not None:
                seen[ident] = name
            entries.append((name, t))
        # Largest element size first: every tensor starts aligned to its element size.
        entries.sort(key=lambda e: (-e[1].element_size(), e[0]))
        digest = hashlib.sha256()
        for _, t in entries:
            if t.numel():
                digest.update(_as_bytes(t).numpy().data)
        header: dict[str, Any] = {
            "__metadata__": {
                _KEY_META: key,
                _ALIASES_META: json.dumps(aliases),
                _SHA256_META: digest.hexdigest(),
            }
        }
        off = 0
        for name, t in entries:
            nb = t.numel() * t.element_size()
            header[name] = {
                "dtype": _NAMES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [off, off + nb],
            }
            off += nb
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((-(8 + len(text))) % _DATA_ALIGN)
        tmp = final.with_name(f".{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(struct.pack("<Q", len(text)))
                f.write(text)
                for _, t in entries:
                    if t.numel():
                        f.write(_as_bytes(t).numpy().data)
            os.chmod(tmp, 0o444)  # nobody maps it writable; every tenant may read it
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def verify(self, key: str) -> bool:
        """Whether the stored file of ``key`` still holds what ``put`` wrote: the SHA-256 of
        its data section equals the one in its header. False for a file without one (written
        by an older gshare) or a malformed one; ``KeyError`` when the key is not stored. The
        node checks this before it hands a file it did not just write to instances
        (``node.tasks.put_weights``)."""
        p = self.path(key)
        if not p.exists():
            raise KeyError(key)
        try:
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
                want = header.get("__metadata__", {}).get(_SHA256_META)
                if not want:
                    return False
                h = hashlib.sha256()
                while chunk := f.read(1 << 24):
                    h.update(chunk)
        except (OSError, ValueError, struct.error):
            return False
        return bool(h.hexdigest() == want)

    def get(self, key: str, device: str = "cpu") -> dict[str, torch.Tensor]:
        """Tensors that map the stored copy of ``key`` (read-only, zero-copy): a new dict of
        the same tensors on each call in a process (one mapping per process and file).
        ``device="cuda[:N]"`` returns the CUDA IPC tier (``export_cuda`` must have run on
        this node). ``KeyError`` when the key is not stored."""
        dev = torch.device(device)
        if dev.type == "cuda":
            return self._get_cuda(key, dev)
        if dev.type != "cpu":
            raise ValueError(f"the model store serves cpu and cuda tensors, not {device!r}")
        p = self.path(key)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise KeyError(f"model store {self.root}: no weights under key {key!r}") from None
        m = self._mapped.get(key)
        if m is None or m.ident != (st.st_ino, st.st_mtime_ns):
            try:
                m = _Mapped(p)
            except FileNotFoundError:  # dropped in between
                raise KeyError(f"model store {self.root}: no weights under key {key!r}") from None
            self._mapped[key] = m
        return dict(m.tensors)

    def get_or_put(
        self, key: str, factory: Callable[[], Mapping[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """``get(key)``, after ``put(key, factory())`` if the key is absent — the factory
        runs once per node even when several processes ask at the same time."""
        if not self.has(key):
            with _locked(self.root / f".{self._stem(key)}.lock"):
                if not self.has(key):
                    self._write(self.path(key), key, factory())
        return self.get(key)

    def drop(self, key: str) -> bool:
        """Remove ``key`` (host file, CUDA handles, this process's device copies). Mappings
        that exist stay valid until their processes unmap; call it when no instance of the
        key is left (on CUDA this is required: the exporter frees the device memory). True
        when something was removed."""
        removed = False
        for p in [self.path(key), *self.root.glob(f"{self._stem(key)}.cuda*.ipc")]:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed = True
        with contextlib.suppress(FileNotFoundError):
            (self.root / f".{self._stem(key)}.lock").unlink()
        self._mapped.pop(key, None)
        for k in [k for k in self._cuda_owned if k[0] == key]:
            del self._cuda_owned[k]
        for k in [k for k in self._cuda_opened if k[0] == key]:
            del self._cuda_opened[k]
        return removed

    def keys(self) -> list[str]:
        """The stored keys (read from the files' headers), sorted."""
        out = []
        for p in sorted(self.root.glob("*" + _SUFFIX)):
            try:
                with open(p, "rb") as f:
                    (n,) = struct.unpack("<Q", f.read(8))
                    meta = json.loads(f.read(n)).get("__metadata__", {}) or {}
                out.append(meta.get(_KEY_META) or p.name.removesuffix(_SUFFIX))
            except (OSError, ValueError, struct.error):
                continue
        return sorted(out)

    def is_mapped(self, t: torch.Tensor, key: str) -> bool:
        """True when ``t``'s memory lies inside this process's mapping of ``key`` — i.e. a
        model built from ``get(key)`` uses the shared pages rather than a copy."""
        m = self._mapped.get(key)
        if m is None or not t.numel():
            return False
        return m.addr <= t.data_ptr() < m.addr + m.nbytes

    def nbytes(self, key: str) -> int:
        """Size of the stored copy of ``key`` (header included), bytes."""
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise KeyError(f"model store {self.root}: no weights under key {key!r}") from None

    # -- CUDA IPC tier ------------------------------------------------------------------------

    def export_cuda(self, key: str, device: str = "cuda") -> str:
        """Copy the stored ``key`` into one allocation on ``device`` and publish its CUDA IPC
        handle for other processes' ``get(key, device)``; return the handle file's path.

        Called by the node agent, which must stay alive (and keep this store object) while
        instances use the memory. Idempotent per (key, device) in a process."""
        if not torch.cuda.is_available():
            raise RuntimeError("export_cuda needs a CUDA device; this process sees none")
        # lazy: torch.multiprocessing is needed only by the CUDA IPC path
        from torch.multiprocessing.reductions import reduce_tensor

        dev = _cuda_device(device)
        ck = (key, str(dev))
        path = self._cuda_path(key, dev)
        if ck in self._cuda_owned and path.exists():
            return str(path)
        host = self.get(key)
        layout: list[tuple[str, str, list[int], int, int]] = []
        off = 0
        firsts: dict[int, str] = {}
        aliases: dict[str, str] = {}
        for name, t in host.items():
            ptr = t.data_ptr() if t.numel() else -1
            if (
                ptr != -1
                and ptr in firsts
                and host[firsts[ptr]].shape == t.shape
                and host[firsts[ptr]].dtype == t.dtype
            ):
                aliases[name] = firsts[ptr]
                continue
            firsts.setdefault(ptr, name)
            nb = t.numel() * t.element_size()
            layout.append((name, _NAMES[t.dtype], list(t.shape), off, nb))
            off += -(-nb // _CUDA_ALIGN) * _CUDA_ALIGN
        flat = torch.empty(max(off, _CUDA_ALIGN), dtype=torch.uint8, device=dev)
        for name, _, _, o, nb in layout:
            if nb:
                flat[o : o + nb].copy_(_as_bytes(host[name]))
        torch.cuda.synchronize(dev)
        views = _views(flat, layout, aliases)
        _, args = reduce_tensor(flat)  # type: ignore[no-untyped-call]
        payload = {
            "version": 1,
            "device": str(dev),
            "pid": os.getpid(),
            "args": args,
            "layout": layout,
            "aliases": aliases,
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(payload, f)
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
        self._cuda_owned[ck] = (flat, views)
        return str(path)

    def has_cuda(self, key: str, device: str = "cuda") -> bool:
        """True when ``key`` was exported to ``device`` on this node."""
        dev = _cuda_device(device)
        return (key, str(dev)) in self._cuda_owned or self._cuda_path(key, dev).exists()

    def _get_cuda(self, key: str, dev: torch.device) -> dict[str, torch.Tensor]:
        dev = _cuda_device(str(dev))
        ck = (key, str(dev))
        if ck in self._cuda_owned:  # the exporter itself cannot open its own IPC handle
            return dict(self._cuda_owned[ck][1])
        path = self._cuda_path(key, dev)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise KeyError(
                f"model store {self.root}: {key!r} is not exported to {dev} "
                "(the node agent calls export_cuda first)"
            ) from None
        ident = (st.st_ino, st.st_mtime_ns)
        got = self._cuda_opened.get(ck)
        if got is not None and got[0] == ident:
            return dict(got[1])
        with open(path, "rb") as f:
            payload = pickle.load(f)  # our own file, in a 0700 directory of this user
        if payload.get("version") != 1:
            raise StoreError(f"{path}: unknown CUDA handle format")
        if payload["pid"] == os.getpid():
            raise StoreError(f"{path}: exported by this process through another store object")
        # lazy: torch.multiprocessing is needed only by the CUDA IPC path
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        # cudaIpcOpenMemHandle (once per allocation and process; PyTorch caches it):
        flat = rebuild_cuda_tensor(*payload["args"])  # type: ignore[no-untyped-call]
        views = _views(flat, payload["layout"], payload["aliases"])
        self._cuda_opened[ck] = (ident, views)
        return dict(views)


def _cuda_device(device: str) -> torch.device:
    """``cuda`` → ``cuda:<current device>`` (``cuda:0`` without CUDA), others as given."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"a CUDA device was expected, got {device!r}")
    if dev.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return dev


def _views(
    flat: torch.Tensor,
    layout: list[tuple[str, str, list[int], int, int]],
    aliases: Mapping[str, str],
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, dt, shape, off, nb in layout:
        dtype = _DTYPES[dt]
        if nb == 0:
            out[name] = torch.empty(shape, dtype=dtype, device=flat.device)
        else:
            out[name] = flat[off : off + nb].view(dtype).view(shape)
    for alias, target in aliases.items():
        out[alias] = out[target]
    return out
