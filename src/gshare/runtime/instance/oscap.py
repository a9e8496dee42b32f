"""The operating system's hard cap under an instance's memory limit.

Who calls it: ``InstanceServer`` (in the instance process, once the runtime is imported and
before the model loads) calls ``apply_memory_cap``; the fork template (``node.launcher``) calls
``remove_cgroup`` when it reaps an instance, and ``remove_session_cgroups`` when it exits;
``runtime.server.reclaim_stale_server`` calls ``remove_session_cgroups`` for a dead server's
session.

Why: ``MemoryGovernor`` enforces ``mem_mb`` by sampling (every 20 ms while a batch runs): one
large allocation between two samples completes, and a node can be exhausted by one tenant. The
cap here is the kernel's, so nothing can pass it; the governor stays the *soft* limit inside it
(it grows by steps, aborts one request, answers 503), and the cap is set at the plan's largest
limit plus ``SLACK_MB`` for the runtime's own growth (thread stacks, allocator arenas).

Two mechanisms, both applied where they can be (docs/DESIGN.md §5):

* ``RLIMIT_DATA`` (always; no privilege needed): the process's private writable mappings may
  grow by at most the cap from where they are now. An allocation past it fails at once
  (``MemoryError`` in Python, ``RuntimeError: ... can't allocate memory`` in torch), the
  instance survives and answers 503 for that request. It bounds *virtual* private memory, so
  it is conservative: a mapping reserved but never touched counts.
* A memory cgroup, where the process may create one under its own cgroup (cgroup v2
  ``memory.max``; cgroup v1 ``memory.limit_in_bytes``, which is what our machines have): the
  resident pages charged after the move (the model's and the requests' memory; pages inherited
  from the template stay charged to the template) may not exceed the cap. What escapes the
  rlimit (shared anonymous mappings, page cache) is stopped here: the kernel reclaims, and
  kills the instance when it cannot (the agent restarts it; its requests are answered 502).

The cgroup of an instance is ``<own cgroup>/gshare-<session>/<pid>``; it is removed when the
instance is reaped, and the session's directory when the template exits.
"""

from __future__ import annotations

import contextlib
import enum
import os
import resource
from dataclasses import dataclass
from pathlib import Path

SLACK_MB = 128.0
"""Room above the plan's largest limit for the runtime's own growth."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
SESSION_ENV = "GSHARE_SESSION"
WALLS_MEMCG_ENV = "GSHARE_WALLS_MEMCG"
"""Set by ``instance.walls.enter`` to the memory cgroup it capped as root; ``apply_memory_cap``
then leaves the cgroup be (the instance, no longer root, could not write it)."""
_MB = 1 << 20


class CapKind(enum.Enum):
    """What enforces an instance's memory cap (``gshare describe`` shows it)."""

    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    RLIMIT = "rlimit-data"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class MemoryCap:
    """The cap applied to this process: the mechanisms (strongest first), the cap in MiB above
    what the process held when it was applied, and the cgroup directory if one was made."""

    kinds: tuple[CapKind, ...]
    cap_mb: float
    cgroup: str = ""
    detail: str = ""

    @property
    def kind(self) -> CapKind:
        return self.kinds[0] if self.kinds else CapKind.NONE


def _vm_data_bytes() -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def own_cgroup(controller: str) -> tuple[CapKind, Path] | None:
    """This process's cgroup directory for ``controller``: v2 (unified) when the controller is
    there, else v1's hierarchy of that name; None when neither is mounted. Also used by
    ``instance.walls`` (memory and pids)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = CGROUP_ROOT / "cgroup.controllers"
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and v2.exists() and controller in v2.read_text().split():
            return CapKind.CGROUP_V2, CGROUP_ROOT / path.lstrip("/")
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            base = CGROUP_ROOT / controller
            if base.is_dir():
                return CapKind.CGROUP_V1, base / path.lstrip("/")
    return None


def session_cgroup_dir(session: str) -> tuple[CapKind, Path] | None:
    """Where this session's instance cgroups live (under the caller's own cgroup)."""
    own = own_cgroup("memory")
    if own is None or not session:
        return None
    kind, path = own
    return kind, path / f"gshare-{session}"


def _apply_cgroup(session: str, cap_bytes: int) -> tuple[CapKind, str, str]:
    found = session_cgroup_dir(session)
    if found is None:
        return CapKind.NONE, "", "no memory cgroup is mounted"
    kind, parent = found
    # an instance's cgroup is named after its pid
    path = parent / str(os.getpid())
    try:
        parent.mkdir(exist_ok=True)
        if kind is CapKind.CGROUP_V2:
            with contextlib.suppress(OSError):  # delegate the controller to our children
                (parent / "cgroup.subtree_control").write_text("+memory")
            path.mkdir(exist_ok=True)
            (path / "memory.max").write_text(str(cap_bytes))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        else:
            path.mkdir(exist_ok=True)
            (path / "memory.limit_in_bytes").write_text(str(cap_bytes))
        (path / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        with contextlib.suppress(OSError):
            path.rmdir()
        return CapKind.NONE, "", f"cannot use the memory cgroup {path}: {e.strerror or e}"
    return kind, str(path), ""


def apply_memory_cap(cap_mb: float, session: str = "") -> MemoryCap:
    """Cap this process's further memory growth at ``cap_mb`` + ``SLACK_MB`` (see the module
    doc). ``cap_mb`` must be finite and positive; the session names the cgroup directory
    (``GSHARE_SESSION`` by default). Never raises: what could not be applied is in ``detail``."""
    session = session or os.environ.get(SESSION_ENV, "")
    total = int((cap_mb + SLACK_MB) * _MB)
    kinds: list[CapKind] = []
    notes: list[str] = []
    walled = os.environ.get(WALLS_MEMCG_ENV, "")
    if walled:  # the walls capped this process's cgroup already, as root
        v1 = Path(walled).is_relative_to(CGROUP_ROOT / "memory")
        kind, path, why = (CapKind.CGROUP_V1 if v1 else CapKind.CGROUP_V2), walled, ""
    else:
        kind, path, why = _apply_cgroup(session, total)
    if kind is not CapKind.NONE:
        kinds.append(kind)
    elif why:
        notes.append(why)
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        want = _vm_data_bytes() + total
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
        kinds.append(CapKind.RLIMIT)
    except (OSError, ValueError) as e:
        notes.append(f"cannot set RLIMIT_DATA: {e}")
    return MemoryCap(tuple(kinds), cap_mb + SLACK_MB, path, "; ".join(notes))


def remove_cgroup(session: str, pid: int) -> None:
    """Remove a reaped instance's cgroup (a no-op when it has none)."""
    found = session_cgroup_dir(session)
    if found is not None:
        with contextlib.suppress(OSError):
            (found[1] / str(pid)).rmdir()


def remove_session_cgroups(session: str) -> int:
    """Remove a session's instance cgroups whose processes are gone, then the session's own
    directory when empty; the number removed."""
    found = session_cgroup_dir(session)
    if found is None or not found[1].is_dir():
        return 0
    n = 0
    for child in found[1].iterdir():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()
                n += 1
    with contextlib.suppress(OSError):
        found[1].rmdir()
    return n


def is_memory_error(exc: BaseException) -> bool:
    """True for an allocation the cap refused: ``MemoryError``, or torch's ``RuntimeError``
    from its allocator."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "not enough memory" in text
    )
