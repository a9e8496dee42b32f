"""Fixtures shared by the tests (pytest loads this file for every test under ``tests/``, in any
sub-folder). The helpers behind them are public, in ``gshare.testing``; tests import
``wait_until`` and the rest from there.

* ``served`` — one real ``gshare serve`` per test module (module scope: the server starts
  once per module; modules never share a server), with the test defaults below plus
  ``--max-body-mb 1 --request-timeout-s 90``. Its teardown checks the shutdown: exit code 0
  and no process of its tree left behind.
* ``start_gshare`` — a factory for tests that need servers of their own (a restart on the
  same state directory, other ``--launcher`` / ``--placer`` options):
  ``srv = start_gshare("--launcher", "ray", state_dir=tmp_path / "a")`` starts one (same
  keywords as ``ServeProcess``) and waits until it is ready; whatever the test did not stop is
  stopped at its end.
* ``short_tmp`` — a private directory with a short path under ``/tmp``, removed afterwards:
  Unix socket paths are limited to 107 bytes and pytest's ``tmp_path`` is often longer.

Test defaults of a served gshare: the built-in models at test size (``tiny_models``), the
repository root as working directory (relative spec paths, handler modules found from there),
the log beside the state directory (its tail is in every start error).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gshare.testing import ServeProcess

REPO = Path(__file__).resolve().parent.parent
SERVED_ARGS = ("--max-body-mb", "1", "--request-timeout-s", "90")
"""``served``'s options: a small body limit (the 413 test) and a request timeout below
the tests' own HTTP timeouts (a stuck request is a 504, not a hung test)."""


def _serve(*args: str, state_dir: Path, **kw: Any) -> ServeProcess:
    kw.setdefault("tiny_models", True)
    kw.setdefault("cwd", REPO)
    return ServeProcess(*args, state_dir=state_dir, **kw).start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    srv = _serve(*SERVED_ARGS, state_dir=tmp_path_factory.mktemp("gshare-serve") / "state")
    try:
        yield srv
    finally:
        stopped = srv.stop()
        assert stopped.code == 0 and not stopped.killed, f"{stopped}\n{srv.log()}"
        assert not stopped.left, f"processes left behind: {stopped.left}"


@pytest.fixture
def start_gshare(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(*args: str, state_dir: Path | None = None, **kw: Any) -> ServeProcess:
        srv = _serve(*args, state_dir=state_dir or tmp_path / f"state-{len(started)}", **kw)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop(timeout_s=60)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    d = tempfile.mkdtemp(prefix="gs-", dir="/tmp")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
