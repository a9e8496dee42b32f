"""``runtime.node.files.ensure_private_dir`` (docs/DESIGN.md §12.4: the run directory was 0755 and
created without an ownership check)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gshare.runtime.node.files import ensure_private_dir


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_creates_both_levels_private(tmp_path: Path) -> None:
    d = ensure_private_dir(tmp_path / "gshare-0" / "session")
    assert d.is_dir() and mode(d) == 0o700 and mode(d.parent) == 0o700


def test_tightens_a_directory_of_ours(tmp_path: Path) -> None:
    (tmp_path / "gshare-0").mkdir(mode=0o755)
    os.chmod(tmp_path / "gshare-0", 0o755)
    ensure_private_dir(tmp_path / "gshare-0" / "s")
    assert mode(tmp_path / "gshare-0") == 0o700


def test_refuses_a_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "gshare-0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="symbolic link"):
        ensure_private_dir(tmp_path / "gshare-0" / "s")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_refuses_a_directory_another_user_made(tmp_path: Path) -> None:
    (tmp_path / "gshare-0").mkdir()
    os.chown(tmp_path / "gshare-0", 54321, -1)
    with pytest.raises(PermissionError, match="belongs to uid 54321"):
        ensure_private_dir(tmp_path / "gshare-0" / "s")
