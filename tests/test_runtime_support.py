"""Support for the runtime tests (no tests here): a real ``gshare serve`` in a subprocess.

``ServerProcess`` starts ``python -m gshare.cli serve --port 0 --state DIR`` (an ephemeral
port, a temporary state directory, tiny built-in models), waits until it is ready, and gives
the tests its URL, a ``gshare.Client``, a way to run CLI commands against it and its process
tree (to check that a shutdown leaves nothing behind). Nothing of ours is mocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from gshare.runtime.client import Client

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0


class ServerProcess:
    """One ``gshare serve`` process (see the module doc)."""

    def __init__(self, state_dir: Path, *args: str, log_path: Path | None = None) -> None:
        self.state_dir = state_dir
        self.args = list(args)
        self.log_path = log_path or state_dir.parent / f"{state_dir.name}-serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServerProcess:
        env = dict(os.environ, GSHARE_TINY_MODELS="1", PYTHONUNBUFFERED="1")
        env.pop("RAY_ADDRESS", None)
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "server.json").unlink()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gshare.cli", "serve", "--port", "0", "--state", str(self.state_dir), *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        t0 = time.monotonic()
        info = self.state_dir / "server.json"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gshare serve exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() - t0 > START_TIMEOUT_S:
                self.kill()
                raise RuntimeError(f"gshare serve not ready after {START_TIMEOUT_S:.0f} s:\n{self.log()}")
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(info.read_text())
                if doc.get("pid") == self.proc.pid:
                    self.url = doc["url"]
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(self.url + "/v2/health/ready", timeout=5).status_code == 200:
                            return self
            time.sleep(0.2)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def client(self, **kw: Any) -> Client:
        return Client(self.url, state_dir=self.state_dir, **kw)

    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def cli(self, *args: str, auth: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        extra = ["--url", self.url] + (["--state", str(self.state_dir)] if auth else [])
        return subprocess.run(
            [sys.executable, "-m", "gshare.cli", *args, *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=timeout,
        )

    def tree(self) -> list[psutil.Process]:
        """The server process and every descendant (Ray's GCS, raylet, agents, instances)."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"gshare serve did not stop within {timeout:.0f} s:\n{self.log()}") from None
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """Last resort (a failed test): SIGKILL the server's own process tree, by pid."""
        for p in reversed(self.tree()):
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(10)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` that still run (zombies count as gone)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def wait_until(pred: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    t0 = time.monotonic()
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
