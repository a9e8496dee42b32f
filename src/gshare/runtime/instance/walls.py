"""The walls around a process that runs a tenant's code: its own uid, no capabilities, no new
privileges, a seccomp filter, a private ``/dev/shm``, a ``/proc`` that shows only its own
processes, a scrubbed environment, and a cgroup that caps its memory and its process count.

Who calls it: the node's fork template (``runtime.node.launcher``), in every child that will
run tenant code — an instance, and the deploy-time calls that import a user's handler
(``describe_handler``, ``build_weights``) — right after the fork and before that code is
imported. The node agent decides the walls (``Walls``: the function's uid, the instance's
private directory, the caps) and sends them with the launch; ``enter`` puts them up and says
what it could not (``WallsReport``), which the instance logs.

What each wall stops (docs/DESIGN.md §12.4; proven by ``tests/runtime/test_tenants.py``):

* **its own uid and gid** (one per function, ``uid_for``; supplementary groups dropped): another
  tenant's processes cannot be signalled or traced, their ``/proc/<pid>/environ`` and memory
  cannot be read, files of the server (root) that are not world-readable cannot be read or
  written — the model store's files are world-readable, never writable; the capabilities of
  root are gone with the uid;
* **no_new_privs and a seccomp filter** (x86-64): no setuid binary gives them back; ``ptrace``,
  ``process_vm_readv``/``writev``, ``mount``, namespaces (``unshare``, ``setns``, ``clone``
  with namespace flags; ``clone3`` answers ``ENOSYS`` so that the C library falls back to
  ``clone``), ``bpf``, ``perf_event_open``, the kernel keyring and module loading are refused
  with ``EPERM``;
* **a private mount namespace**: ``/dev/shm`` is a tmpfs of its own (``shm_mb``; its pages are
  charged to the instance's memory cgroup and vanish with the instance), into which the model
  store is bound read-only; ``/proc`` is a fresh procfs with ``hidepid=2`` (other users'
  processes are invisible: their command lines, where a cluster address could be read);
* **a cgroup** (``<own>/gshare-<session>/<pid>`` in the ``memory`` and ``pids`` hierarchies):
  ``memory.max`` (or ``memory.limit_in_bytes``) at the instance's cap, or ``DEFAULT_MEM_MB``
  when its function sets none; ``pids.max`` at ``pids_max``; everything the instance starts is
  in it, and the template kills what is left there when it reaps the instance
  (``kill_cgroup``);
* **a scrubbed environment**: ``RAY_*`` and every variable that names a token, secret, password
  or key is removed (the instance's own credentials arrive in its launch, not its environment).

What must hold: ``enter`` runs as root for the uid, mount and cgroup walls (the template of a
server started by root); without root those are skipped and reported, and the process keeps
the server's uid — the Landlock sandbox (``instance.sandbox``) and the channel secrets are then
what stands between tenants. Nothing here has been tried with a GPU: an MPS server serves one
uid at a time, so CUDA instances on one device would share a uid (``Walls.uid``) there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import signal
import struct
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gshare.runtime.instance.oscap import SLACK_MB, WALLS_MEMCG_ENV, CapKind, own_cgroup

DEFAULT_MEM_MB = 4096.0
"""The memory cap of an instance whose function sets none (``mem_mb``)."""
DEFAULT_PIDS_MAX = 256
"""Processes and threads an instance may have at once (torch's pools included)."""
DEFAULT_SHM_MB = 256.0
"""Size of an instance's private ``/dev/shm`` (its pages count against its memory cap too)."""
UID_BASE = 2_000_000
"""Tenant uids are ``UID_BASE + n``: far above the users of a typical host."""
UID_SPAN = 1_000_000
WALLS_ENV = "GSHARE_TENANT_WALLS"
"""``0`` turns the walls off (``gshare serve --no-tenant-walls``); anything else leaves them on."""

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SCRUB = re.compile(r"^RAY_|TOKEN|SECRET|PASSW|(^|_)KEY($|_)|CREDENTIAL", re.IGNORECASE)
_KEEP = frozenset({"GSHARE_TOKEN_SOCKET", "GSHARE_CLIENT_ID", "GSHARE_TOKEN_EPOCH_S"})


@dataclass(frozen=True, slots=True)
class Walls:
    """What the node agent asks of one tenant process (sent with its launch, as a dict)."""

    uid: int
    gid: int
    own_dir: str = ""
    """The instance's private directory (its socket, its temporary files): made the tenant's."""
    store_root: str = ""
    """The model store, bound read-only into the private ``/dev/shm`` (when it lies there)."""
    mem_mb: float = DEFAULT_MEM_MB
    pids_max: int = DEFAULT_PIDS_MAX
    shm_mb: float = DEFAULT_SHM_MB
    session: str = ""
    """Names the cgroup directory (``instance.oscap.SESSION_ENV``)."""
    reach: tuple[str, ...] = ()
    """Paths the tenant must read beyond the interpreter's (the handler's code, its weights)."""
    reach_rw: tuple[str, ...] = ()
    """Paths it must write through closed directories: its token socket, the device's board."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Walls:
        return Walls(**{k: d[k] for k in Walls.__dataclass_fields__ if k in d})


@dataclass(slots=True)
class WallsReport:
    """What ``enter`` put up, and what it could not, with the reason."""

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    memcg: str = ""

    def summary(self) -> str:
        text = "walls: " + (", ".join(self.applied) or "none")
        return text + (f"; not applied: {'; '.join(self.skipped)}" if self.skipped else "")


def uid_for(function: str) -> int:
    """The tenant uid of a function (stable across restarts and nodes; distinct functions
    collide with probability 1 in ``UID_SPAN`` per pair)."""
    return UID_BASE + zlib.crc32(function.encode()) % UID_SPAN


def supported() -> str:
    """'' when ``enter`` can put up every wall here, else why not."""
    if os.geteuid() != 0:
        return "the server does not run as root: tenants keep its uid"
    if platform.system() != "Linux":
        return "not Linux"
    return ""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def scrub_environment() -> list[str]:
    """Remove ``RAY_*`` and secret-bearing variables from this process's environment."""
    gone = [k for k in os.environ if k not in _KEEP and _SCRUB.search(k)]
    for k in gone:
        del os.environ[k]
    return gone


def _closed_ancestors(paths: list[str]) -> dict[str, set[str]]:
    """For each directory on the way to ``paths`` that other users cannot traverse (no o+x),
    the names below it that lead to those paths."""
    out: dict[str, set[str]] = {}
    for p in paths:
        parts = Path(os.path.realpath(p)).parts
        for i in range(1, len(parts)):
            d = str(Path(*parts[:i]))
            try:
                closed = not os.stat(d).st_mode & 0o001
            except OSError:
                break
            if closed:
                out.setdefault(d, set()).add(parts[i])
    return out


def unreadable(paths: list[str]) -> list[str]:
    """Those of ``paths`` that other users could not read even with every way to them open:
    a directory without o+rx, a file without o+r."""
    bad = []
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        need = 0o005 if os.path.isdir(p) else 0o004
        if mode & need != need:
            bad.append(p)
    return bad


def _open_ways(paths: list[str], r: WallsReport, rw: frozenset[str] = frozenset()) -> None:
    """Let the tenant reach ``paths`` through directories closed to other users (a Python
    under ``/root``, a test's private temporary directory): each closed directory is covered
    by a tmpfs that others may traverse (0711) into which only the entries leading to
    ``paths`` are bound, read-only. Everything else in it stays out of sight. Runs in the new
    mount namespace, as root."""
    ways = _closed_ancestors(paths)
    if not ways:
        return
    libc = _libc()
    fds = {
        f"{d}/{name}" if d != "/" else f"/{name}": os.open(
            os.path.join(d, name), os.O_PATH | os.O_NOFOLLOW
        )
        for d, names in ways.items()
        for name in names
        if os.path.lexists(os.path.join(d, name))
    }
    try:
        for d in sorted(ways, key=len):  # outer directories first
            _check(
                libc.mount(b"tmpfs", d.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0711"),
                f"cover {d}",
            )
            for name in sorted(ways[d]):
                target = os.path.join(d, name)
                src = fds.get(target)
                if src is None:
                    continue
                if os.path.isdir(f"/proc/self/fd/{src}"):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                _check(
                    libc.mount(f"/proc/self/fd/{src}".encode(), target.encode(), None, _MS_BIND, 0),
                    f"bind {target}",
                )
                if os.path.realpath(target) in rw:
                    continue
                _check(
                    libc.mount(None, target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, 0),
                    f"remount {target} read-only",
                )
        r.applied.append("reachable read-only: " + ", ".join(sorted(fds)))
    finally:
        for fd in fds.values():
            os.close(fd)


def degraded() -> str:
    """'' when this host and this installation allow every wall, else why not (not root, or an
    interpreter or import path that other users cannot read, like a clone in a 0700 directory:
    the uid wall is then skipped)."""
    why = supported()
    if not why:
        closed = unreadable(_needed(Walls(0, 0)))
        if closed:
            why = f"other users cannot read {', '.join(closed[:3])}"
    return why


def _needed(w: Walls) -> list[str]:
    """What the tenant must read: the interpreter, its import path, ``w.reach``."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    return [*roots, *(p for p in sys.path if p and os.path.exists(p)), *w.reach]


def _private_mounts(w: Walls, r: WallsReport) -> None:
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    own = [w.own_dir] if w.own_dir else []
    rw = frozenset(os.path.realpath(p) for p in (*w.reach_rw, *own))
    _open_ways([*_needed(w), *w.reach_rw, *own], r, rw)
    store = os.path.realpath(w.store_root) if w.store_root else ""
    keep = -1
    if store and store.startswith("/dev/shm/") and os.path.isdir(store):
        keep = os.open(store, os.O_PATH | os.O_DIRECTORY)  # opened in the new namespace
    if os.path.isdir("/dev/shm"):
        opts = f"size={max(1, int(w.shm_mb))}m,mode=1777".encode()
        _check(
            libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts),
            "mount tmpfs /dev/shm",
        )
        r.applied.append(f"private /dev/shm ({w.shm_mb:g} MiB)")
        if keep >= 0:
            try:
                os.makedirs(store, mode=0o711, exist_ok=True)
                src = f"/proc/self/fd/{keep}".encode()
                _check(libc.mount(src, store.encode(), None, _MS_BIND, None), "bind the store")
                _check(
                    libc.mount(
                        None, store.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None
                    ),
                    "remount the store read-only",
                )
                r.applied.append("model store read-only")
            finally:
                os.close(keep)
    _check(
        libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"hidepid=2"),
        "mount proc hidepid=2",
    )
    r.applied.append("/proc shows only its own processes")


def _cgroup_dirs(session: str) -> list[tuple[str, Path, bool]]:
    """(controller, the session's cgroup directory, cgroup v2?) for memory and pids."""
    out = []
    for ctrl in ("memory", "pids"):
        own = own_cgroup(ctrl)
        if own is not None:
            out.append((ctrl, own[1] / f"gshare-{session}", own[0] is CapKind.CGROUP_V2))
    return out


def _cgroups(w: Walls, r: WallsReport) -> None:
    if not w.session:
        r.skipped.append("cgroups: no session")
        return
    pid = str(os.getpid())
    done: set[str] = set()
    for ctrl, parent, v2 in _cgroup_dirs(w.session):
        path = parent / pid
        try:
            parent.mkdir(exist_ok=True)
            if v2:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(f"+{ctrl}")
            path.mkdir(exist_ok=True)
            if ctrl == "memory":
                cap = str(int((w.mem_mb + SLACK_MB) * (1 << 20)))
                (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(cap)
                if v2:
                    with contextlib.suppress(OSError):
                        (path / "memory.swap.max").write_text("0")
                r.memcg = str(path)
            else:
                (path / "pids.max").write_text(str(w.pids_max))
            (path / "cgroup.procs").write_text(pid)
            done.add(ctrl)
        except OSError as e:
            r.skipped.append(f"{ctrl} cgroup {path}: {e.strerror or e}")
    if "memory" in done:
        r.applied.append(f"memory cap {w.mem_mb:g} MiB (+{SLACK_MB:g}) incl. /dev/shm")
        os.environ[WALLS_MEMCG_ENV] = r.memcg
    if "pids" in done:
        r.applied.append(f"at most {w.pids_max} processes and threads")


def kill_cgroup(session: str, pid: int) -> int:
    """Kill every process left in a reaped instance's cgroups (what it started), then remove
    them; the number killed. Called by the fork template for each child it reaps."""
    killed = 0
    for _ctrl, parent, _v2 in _cgroup_dirs(session):
        path = parent / str(pid)
        if not path.is_dir():
            continue
        for _ in range(20):
            try:
                procs = [int(x) for x in (path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not procs:
                break
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
                    killed += 1
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            path.rmdir()
    return killed


def kill_session(session: str) -> int:
    """Kill what is left in every instance cgroup of ``session`` and remove them and the
    session's directories (the template, when it stops); the number killed."""
    killed = 0
    for _ctrl, parent, _v2 in _cgroup_dirs(session) if session else ():
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if child.is_dir() and child.name.isdigit():
                killed += kill_cgroup(session, int(child.name))
        with contextlib.suppress(OSError):
            parent.rmdir()
    return killed


def _seccomp_filter() -> bytes:
    """A classic-BPF program: on x86-64, refuse the calls listed in the module doc."""
    deny = (
        101,  # ptrace
        310, 311,  # process_vm_readv / writev
        165, 166, 155,  # mount, umount2, pivot_root
        272, 308,  # unshare, setns
        321, 298,  # bpf, perf_event_open
        248, 249, 250,  # add_key, request_key, keyctl
        175, 313, 176,  # init_module, finit_module, delete_module
        246, 320,  # kexec_load, kexec_file_load
        323, 304, 303,  # userfaultfd, open_by_handle_at, name_to_handle_at
        428, 429, 430, 431, 432,  # open_tree, move_mount, fsopen, fsconfig, fsmount
        442,  # mount_setattr
        167, 168, 169, 163,  # swapon, swapoff, reboot, acct
    )  # fmt: skip
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    arch_x86_64 = 0xC000003E
    ns_flags = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
    prog: list[tuple[int, int, int, int]] = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch_x86_64),
        (ret, 0, 0, allow),  # another ABI: let it be (the filter is x86-64's)
        (ld, 0, 0, 0),  # seccomp_data.nr
    ]
    for nr in deny:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, 435), (ret, 0, 0, enosys)]  # clone3: fall back to clone
    prog += [
        (jeq, 0, 3, 56),  # clone: look at its flags
        (ld, 0, 0, 16),  # seccomp_data.args[0], low 32 bits
        (jset, 0, 1, ns_flags),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    return b"".join(struct.pack("<HBBI", *i) for i in prog)


def _seccomp(r: WallsReport) -> None:
    if platform.machine() not in ("x86_64", "AMD64"):
        r.skipped.append(f"seccomp: no filter for {platform.machine()}")
        return
    code = _seccomp_filter()
    buf = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")
    r.applied.append("seccomp filter")


def enter(w: Walls) -> WallsReport:
    """Put up the walls in this (freshly forked) process, as far as this host allows; never
    raises for a wall the host does not offer (the report says which and why), but raises
    ``OSError`` when a wall that should stand fails half-way (the caller must not run the
    tenant's code then)."""
    r = WallsReport()
    gone = scrub_environment()
    r.applied.append(f"environment scrubbed ({len(gone)} removed)")
    why = supported()
    if not why:
        closed = unreadable(_needed(w))
        if closed:
            why = f"other users cannot read {', '.join(closed[:3])}: tenants keep the server's uid"
    if why:
        r.skipped.append(f"uid, mounts, cgroups: {why}")
        if w.own_dir:  # its output goes there all the same
            os.makedirs(w.own_dir, mode=0o700, exist_ok=True)
    else:
        _cgroups(w, r)
        if w.own_dir:  # before the mounts, which bind it through the closed directories
            os.makedirs(w.own_dir, mode=0o700, exist_ok=True)
            os.chown(w.own_dir, w.uid, w.gid)
            os.chmod(w.own_dir, 0o700)
        _private_mounts(w, r)
        os.setgroups([])
        os.setresgid(w.gid, w.gid, w.gid)
        parent = os.getppid()
        os.setresuid(w.uid, w.uid, w.uid)
        # a change of credentials clears the parent-death signal: die with the template again
        _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
        if os.getppid() != parent:  # the template died meanwhile
            os._exit(1)
        r.applied.append(f"uid {w.uid}, no capabilities")
    _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    r.applied.append("no_new_privs")
    try:
        _seccomp(r)
    except OSError as e:
        r.skipped.append(f"seccomp: {e}")
    return r
