"""Hide the server's state directory from the functions' code (Linux Landlock).

Who calls it: ``InstanceServer`` applies ``hide_paths`` in the instance process before it
imports and loads the function's handler; the server lists what to hide in ``HIDE_ENV`` (its
state directory: the control token, the state database, ``server.json``) before Ray starts,
so every process it starts inherits the list.

Why: an instance runs as the server's user, so its handler could read the control token and
then deploy, delete or reconfigure any tenant's function (docs/DESIGN.md §12.4). Landlock (Linux
≥ 5.13, unprivileged) lets a process give up filesystem access for itself and its children,
for good: after ``hide_paths`` the handler cannot open a file under a hidden directory, by any
path.

How: Landlock grants access by allow-lists over file hierarchies, so "everything but P" is
built from its parts. For each directory ``A`` on the way from ``/`` to ``P``: ``A`` itself
may be listed (``READ_DIR``, which covers the hierarchy below, so names under ``P`` can be
listed but not read), and every entry of ``A`` except the next step towards ``P`` gets every
right. What this costs, and what must hold:

* new entries made directly in one of ``P``'s ancestors after the sandbox (by anyone) are not
  reachable by the instance, and the instance cannot make one there — so its ``TMPDIR`` is
  moved to a private directory in the run directory (``tmp_dir``) first;
* files that existed are reachable as before (siblings keep every right), devices and
  ``/proc`` included;
* without Landlock (an old kernel, a kernel without it, a seccomp profile that refuses the
  calls) nothing is hidden, and ``hide_paths`` says so in ``Sandbox.detail`` (logged): the
  token is then protected only by file permissions, which the same user passes.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

HIDE_ENV = "GSHARE_HIDE_PATHS"
"""``os.pathsep``-separated directories instances may not read (set by the server)."""

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_O_PATH = 0o10000000

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | (1 << 14) | (1 << 15)
"""The rights a rule on a non-directory may carry (execute, write, read, truncate, ioctl)."""


class SandboxState(enum.Enum):
    APPLIED = "landlock"
    UNAVAILABLE = "unavailable"
    NOTHING_TO_HIDE = "nothing-to-hide"


@dataclass(frozen=True, slots=True)
class Sandbox:
    state: SandboxState
    hidden: tuple[str, ...] = ()
    detail: str = ""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none."""
    try:
        r = int(_libc().syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(r, 0)


def _rights(abi: int) -> int:
    return _ABI_RIGHTS[max(k for k in _ABI_RIGHTS if k <= abi)]


def _add(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return  # gone, or not ours to open: nothing to grant
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        attr = struct.pack("=Qi", rights, fd)
        buf = ctypes.create_string_buffer(attr, len(attr))
        libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, buf, 0)
    finally:
        os.close(fd)


def tmp_dir(run_dir: str) -> str:
    """A private temporary directory for the instance (``TMPDIR`` after the sandbox)."""
    d = os.path.join(run_dir, f"tmp-{os.getpid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def hide_paths(paths: list[str], tmp: str | None = None) -> Sandbox:
    """Make ``paths`` unreadable to this process and its children for good (module doc);
    ``tmp``: the directory to use as ``TMPDIR`` from now on. Never raises."""
    targets = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})
    targets = [t for t in targets if t != "/"]
    if not targets:
        return Sandbox(SandboxState.NOTHING_TO_HIDE)
    abi = landlock_abi()
    if abi < 1:
        return Sandbox(SandboxState.UNAVAILABLE, detail="the kernel has no Landlock")
    libc = _libc()
    rights = _rights(abi)
    attr = struct.pack("=Q", rights)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, buf, len(attr), 0))
    if ruleset < 0:
        return Sandbox(
            SandboxState.UNAVAILABLE,
            detail=f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}",
        )
    try:
        hidden = set(targets)
        on_way: set[str] = set()
        for t in targets:
            p = Path(t)
            on_way.update(str(a) for a in p.parents)
            on_way.add(t)
        for a in sorted(on_way - hidden):
            _add(libc, ruleset, a, READ_DIR)
            try:
                entries = list(os.scandir(a))
            except OSError:
                continue
            for e in entries:
                if e.path in on_way or e.path in hidden or e.is_symlink():
                    continue  # a link is reached through its target's own rule (it may point
                    # back up the way to a hidden directory: pytest's ``pytest-current`` does)
                _add(libc, ruleset, e.path, rights)
        if tmp is not None:
            os.environ["TMPDIR"] = tmp
            tempfile.tempdir = tmp
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return Sandbox(SandboxState.UNAVAILABLE, detail="prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            return Sandbox(
                SandboxState.UNAVAILABLE,
                detail=f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}",
            )
    finally:
        os.close(ruleset)
    return Sandbox(SandboxState.APPLIED, tuple(targets))
