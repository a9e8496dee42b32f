"""Helpers for tests of gshare — this project's, and your own tests of functions you deploy.

    from gshare.testing import serve, wait_until

    def test_my_function(tmp_path):
        with serve(state_dir=tmp_path / "state") as srv:     # a real `gshare serve`, ready
            c = srv.client()                                   # gshare.Client with its token
            c.deploy("my-function.yaml")
            wait_until(lambda: c.get("my-fn")["availableReplicas"], 120, "my-fn to be ready")
            assert c.invoke("my-fn", {"x": 1}) == {"y": 2}
        # stopped: SIGTERM, a clean shutdown; its process group killed only if it hung

* ``wait_until(predicate, timeout_s, what)`` polls until ``predicate()`` is truthy and returns
  that value; on timeout it raises ``WaitTimeout`` (an ``AssertionError`` and a
  ``TimeoutError``) naming ``what`` and the predicate's last value or exception.
* ``ServeProcess`` / ``serve(...)`` run ``python -m gshare.cli serve`` as a real subprocess:
  its own session (process group), a state directory (a temporary one unless given), any free
  port (``--port 0``: the server writes the URL it bound to ``server.json``), its stdout and
  stderr in a log file whose tail is in every error. Extra ``gshare serve`` options are passed
  as arguments (``serve("--launcher", "ray", "--placer", "best-fit")``); ``env=``,
  ``pythonpath=`` (directories of your handler modules), ``cwd=`` and ``tiny_models=True``
  (the built-in models at test size) shape its environment.

Readiness is checked one way everywhere (tests, benches, ``make demo``): the process is alive,
``server.json`` in its state directory names *this* process's pid (a file left by an earlier
server on the same directory does not count), ``GET /v2/health/ready`` on that URL answers 200
(the node agents — and Ray with ``--cluster ray`` —, the controller and the gateway are up)
and the control-API token is readable from the state directory. Only then does ``start()`` return.

``stop()`` sends SIGTERM (or the signal given), waits for the exit, SIGKILLs the process group
and the rest of the server's process tree if it hangs, then reports (``Stopped``) its exit code
and any process of its tree still running afterwards — a clean stop is code 0 with nothing
left. Leftovers are killed after being reported, so a failed test leaks nothing.

This module is a front end (layer 3, docs/DESIGN.md §1): it imports the runtime's client, never
the other way round.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import psutil

from gshare.runtime.client import Client
from gshare.runtime.control.state import read_token
from gshare.runtime.server import SERVER_FILE

T = TypeVar("T")

TINY_MODELS_ENV: Mapping[str, str] = {"GSHARE_TINY_MODELS": "1"}
"""Environment that makes the built-in models test-sized (``runtime.instance.models.TINY_ENV``):
for a ``Launcher`` or an instance started outside ``ServeProcess(tiny_models=True)``."""

START_TIMEOUT_S = 180.0
"""How long ``ServeProcess.start`` waits for readiness by default (the embedded default is ready
in about a second; Ray's start, with ``--cluster ray``, takes several)."""

LOG_TAIL_CHARS = 6000


class WaitTimeout(AssertionError, TimeoutError):
    """``wait_until`` gave up: a failed assertion for pytest, a ``TimeoutError`` for others."""


class ServeStartError(RuntimeError):
    """``gshare serve`` exited or was not ready in time; the message holds its log's tail."""


def shared_with_tenants(path: Path) -> Path:
    """Make a test's directory usable by the handlers of a server it started: they run under
    their functions' own uids (``runtime.instance.walls``), so the directory becomes
    world-writable and its ancestors traversable (pytest's are 0700). Returns ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    for d in path.resolve().parents:
        with contextlib.suppress(OSError):
            mode = d.stat().st_mode
            if not mode & 0o001:
                d.chmod((mode & 0o7777) | 0o001)
    return path


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Polls at first every millisecond, backing off (doubling) to every ``interval_s``, so a
    condition that holds soon is seen soon and a slow one costs few calls. An exception raised
    by ``predicate`` counts as "not yet" (a server still starting, a list still empty). When
    ``timeout_s`` has passed — after one last call — raises ``WaitTimeout`` naming ``what``,
    the time waited and the predicate's last value or exception (chained as the cause).
    """
    deadline = time.monotonic() + timeout_s
    delay = min(0.001, interval_s)
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        final = time.monotonic() >= deadline
        try:
            value = predicate()
        except Exception as e:
            last_exc, last = e, None
        else:
            if value:
                return value
            last_exc, last = None, value
        if final:
            seen = (
                f"last error: {type(last_exc).__name__}: {last_exc}"
                if last_exc
                else f"last value: {last!r}"
            )
            raise WaitTimeout(
                f"timed out after {timeout_s:g} s waiting for {what} ({seen})"
            ) from last_exc
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, interval_s)


def alive(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` that still run (zombies count as gone)."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def process_tree(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and every descendant of it, parents first (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def stop_process(
    proc: subprocess.Popen[Any], timeout_s: float = 60.0, sig: int = signal.SIGTERM
) -> int:
    """Stop a process started with ``start_new_session=True`` (any server: ``gshare serve``, a
    baseline's): send ``sig``, wait ``timeout_s``, then SIGKILL its whole process group.
    Returns its exit code (negative: the signal that killed it)."""
    return _stop(proc, timeout_s, sig)[0]


def _stop(proc: subprocess.Popen[Any], timeout_s: float, sig: int) -> tuple[int, bool]:
    """``stop_process``, and whether the process group had to be killed."""
    killed = False
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, killed


def run_cli(
    *args: str,
    url: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    text: bool = True,
    timeout_s: float = 180.0,
    input: str | bytes | None = None,
) -> subprocess.CompletedProcess[Any]:
    """Run ``python -m gshare.cli ARGS [--url URL] [--state DIR]`` (output captured, not
    checked: look at ``returncode``, ``stdout``, ``stderr``; ``input``: its standard input)."""
    extra = (["--url", url] if url else []) + (
        ["--state", str(state_dir)] if state_dir is not None else []
    )
    return subprocess.run(
        [sys.executable, "-m", "gshare.cli", *args, *extra],
        capture_output=True,
        text=text,
        cwd=cwd,
        timeout=timeout_s,
        input=input,
    )


@dataclass(frozen=True)
class Stopped:
    """How a ``ServeProcess`` ended (``ServeProcess.stop``)."""

    code: int
    """Exit code (0: a clean shutdown; negative: killed by that signal)."""
    killed: bool
    """It did not exit within the stop timeout and was SIGKILLed with its process group."""
    left: list[psutil.Process] = field(default_factory=list)
    """Processes of its tree (agents, templates, instances; with Ray its GCS, raylet, workers)
    still running ``gone_timeout_s`` after it exited; reported, then killed."""

    @property
    def clean(self) -> bool:
        return self.code == 0 and not self.killed and not self.left


class ServeProcess:
    """One ``gshare serve`` subprocess (see the module doc). Use as a context manager, or call
    ``start()`` and ``stop()``.

    ``args``: extra ``gshare serve`` options. ``state_dir``: its state directory (default: a new
    temporary directory, removed by a clean ``stop``). ``log_path``: where its stdout and stderr
    go (default: beside the state directory). ``env``: variables set (a value of None unsets
    one) over this process's environment, from which ``RAY_ADDRESS`` is removed (a server with
    ``--cluster ray`` starts its own local Ray unless ``--address`` is given). ``pythonpath``:
    directories put in front of ``PYTHONPATH`` (handler modules of yours). ``tiny_models``: the
    built-in models at test size. ``cwd``: its working directory (the controller also lets
    instances import handler modules from there). ``port``: 0 = any free port.
    """

    def __init__(
        self,
        *args: str,
        state_dir: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        tiny_models: bool = False,
        cwd: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.args = list(args)
        self._own_dir: Path | None = None
        if state_dir is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="gshare-serve-"))
            state_dir = self._own_dir / "state"
        self.state_dir = Path(state_dir)
        self.log_path = (
            Path(log_path)
            if log_path is not None
            else self.state_dir.parent / f"{self.state_dir.name}-serve.log"
        )
        self.env = dict(env or {})
        self.pythonpath = [str(p) for p in pythonpath]
        self.tiny_models = tiny_models
        self.cwd = None if cwd is None else Path(cwd)
        self.host = host
        self.requested_port = port
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.stopped: Stopped | None = None
        self._log: IO[bytes] | None = None

    # -- start -------------------------------------------------------------------------------------

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        env["PYTHONUNBUFFERED"] = "1"
        if self.tiny_models:
            env.update(TINY_MODELS_ENV)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                [*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])]
            )
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def start(self) -> ServeProcess:
        """Start the server and wait until it is ready (module doc); raises ``ServeStartError``
        (with the log's tail) if it exits first or is not ready within ``start_timeout_s``."""
        if self.proc is not None:
            raise RuntimeError("this ServeProcess was already started")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # An earlier server's server.json stays: a server that was killed is reclaimed by the
        # next start from it, and _ready only believes the one naming our pid.
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gshare.cli",
                "serve",
                "--host",
                self.host,
                "--port",
                str(self.requested_port),
                "--state",
                str(self.state_dir),
                *self.args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            env=self._environ(),
            start_new_session=True,
        )
        proc = self.proc
        try:
            wait_until(
                lambda: proc.poll() is not None or self._ready(),
                self.start_timeout_s,
                "gshare serve to be ready",
                interval_s=0.3,
            )
        except WaitTimeout:
            self.stop(timeout_s=30)
            raise ServeStartError(
                f"gshare serve not ready after {self.start_timeout_s:g} s "
                f"(log {self.log_path}):\n{self.log()}"
            ) from None
        if not self.url:
            self.stop(timeout_s=30)
            raise ServeStartError(
                f"gshare serve exited with code {proc.returncode} before it was ready "
                f"(log {self.log_path}):\n{self.log()}"
            )
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        try:
            doc = json.loads((self.state_dir / SERVER_FILE).read_text())
        except (OSError, ValueError):
            return False
        if doc.get("pid") != self.proc.pid:
            return False
        url = str(doc["url"])
        try:
            ok = httpx.get(url + "/v2/health/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
        if ok and read_token(self.state_dir):
            self.url = url
            return True
        return False

    # -- use ---------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("gshare serve was not started")
        return self.proc.pid

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        return int(self.url.rsplit(":", 1)[1])

    @property
    def token(self) -> str:
        """The control-API bearer token, read from the state directory."""
        tok = read_token(self.state_dir)
        if tok is None:
            raise RuntimeError(f"no control-API token in {self.state_dir}")
        return tok

    def client(self, **kw: Any) -> Client:
        """A ``gshare.Client`` of this server (its token from the state directory)."""
        return Client(self.url, state_dir=self.state_dir, **kw)

    def cli(
        self,
        *args: str,
        auth: bool = True,
        text: bool = True,
        timeout_s: float = 180.0,
        input: str | bytes | None = None,
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``gshare ARGS`` against this server (``--url``; ``--state`` too when ``auth``;
        ``input``: the command's standard input)."""
        return run_cli(
            *args,
            url=self.url,
            state_dir=self.state_dir if auth else None,
            cwd=self.cwd,
            text=text,
            timeout_s=timeout_s,
            input=input,
        )

    def log(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of its log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def tree(self) -> list[psutil.Process]:
        """The server process and every descendant (the agent, its template, instances; with
        Ray its GCS, raylet and workers)."""
        return process_tree(self.proc.pid) if self.proc is not None else []

    # -- stop --------------------------------------------------------------------------------------

    def stop(
        self, sig: int = signal.SIGTERM, timeout_s: float = 120.0, gone_timeout_s: float = 30.0
    ) -> Stopped:
        """Shut the server down with ``sig`` (SIGTERM; SIGINT is Ctrl-C) and report how it ended
        (``Stopped``; module doc). Idempotent: a second call returns the first result."""
        if self.stopped is not None:
            return self.stopped
        if self.proc is None:
            raise RuntimeError("gshare serve was not started")
        procs = self.tree()  # before the signal: its children are reparented once it is gone
        code, killed = _stop(self.proc, timeout_s, sig)
        left: list[psutil.Process] = []
        if killed:
            for p in reversed(alive(procs)):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        else:
            with contextlib.suppress(WaitTimeout):
                wait_until(
                    lambda: not alive(procs),
                    gone_timeout_s,
                    "the server's processes to exit",
                    interval_s=0.3,
                )
            left = alive(procs)
            for p in reversed(left):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        if self._log is not None:
            self._log.close()
        self.stopped = Stopped(code, killed, left)
        if self._own_dir is not None and self.stopped.clean:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        return self.stopped

    def __enter__(self) -> ServeProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()


@contextlib.contextmanager
def serve(*args: str, **kw: Any) -> Iterator[ServeProcess]:
    """``with serve("--launcher", "ray", tiny_models=True) as srv: ...`` — a started
    ``ServeProcess`` (same arguments), stopped on exit."""
    with ServeProcess(*args, **kw) as srv:
        yield srv


def payload_bytes(url: str) -> dict[tuple[str, str], float]:
    """A server's ``gshare_instance_payload_bytes`` counters by (direction, path), read from
    its ``/metrics`` (path ``lane``: through shared memory, ``instance.lanes``)."""
    out: dict[tuple[str, str], float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("gshare_instance_payload_bytes_total{"):
            labels, value = line.rsplit(" ", 1)
            d = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))
            out[(d["direction"].strip('"'), d["path"].strip('"'))] = float(value)
    return out


__all__ = [
    "START_TIMEOUT_S",
    "TINY_MODELS_ENV",
    "ServeProcess",
    "ServeStartError",
    "Stopped",
    "WaitTimeout",
    "alive",
    "payload_bytes",
    "process_tree",
    "run_cli",
    "serve",
    "stop_process",
    "wait_until",
]
