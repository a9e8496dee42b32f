"""Private directories of a node: the run directory (instance sockets, logs) and its parent.

Who calls it: ``NodeAgent`` creates the run directory with ``ensure_private_dir`` (docs/DESIGN.md
§12.4: it was created 0755 under a shared ``/tmp`` without checking who owned it, so another
user could pre-create ``/tmp/gshare-UID`` and read or redirect the instances' sockets and logs).

What holds: every directory created is 0700; one that exists already must be a real directory
(not a symbolic link), owned by this user, and not writable by others — else ``PermissionError``
naming the path and what is wrong. A group/other read or search bit on a directory of ours is
removed (an old 0755 run directory is tightened, not refused).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def ensure_private_dir(path: str | os.PathLike[str], levels: int = 2) -> Path:
    """Create ``path`` (and up to ``levels`` - 1 missing parents) 0700, or check the ones that
    exist (module doc). Returns the path."""
    p = Path(path)
    chain = [p]
    for _ in range(levels - 1):
        chain.append(chain[-1].parent)
    for d in reversed(chain):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        _check_owned_dir(d)
    return p


def _check_owned_dir(d: Path) -> None:
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"{d} is a symbolic link; gshare will not use it (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{d} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{d} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): another user "
            "may have created it; remove it or set TMPDIR"
        )
    if st.st_mode & 0o077:
        os.chmod(d, stat.S_IMODE(st.st_mode) & 0o700)


DEFAULT_STORE_ROOT = "/dev/shm/gshare-<uid>"
"""The model store's default directory (``model_store.DEFAULT_ROOT``): one per user and node."""


def store_dir(root: str) -> Path:
    """The model store's directory for ``root`` (``model_store.DEFAULT_ROOT`` is
    ``/dev/shm/gshare-<uid>``: ``<uid>`` becomes the user id, ``/dev/shm`` the temporary
    directory where there is none). Light: the node agent asks without importing torch."""
    if "<uid>" in root:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        root = root.replace("/dev/shm", base, 1).replace("<uid>", str(os.getuid()))
    return Path(root)
