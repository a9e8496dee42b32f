"""The instance launcher: a pre-imported template process (a "zygote") that forks instances.

Why: an instance process that imports Python, torch and transformers itself carries about
300 MB of private import heap (measured by ``bench/model_sharing.py``, the "runtime only"
rows) and spends seconds importing before it loads its model. The model store already makes
N instances share ONE copy of the weights (FaST-GShare §3.5); forking them from a template
that imported the runtime once makes them share its import heap too (copy-on-write), and
cuts a cold start to the model load itself. This is the forkserver pattern (Android's
zygote, ``multiprocessing``'s ``forkserver``), written here because ``multiprocessing``'s
forkserver cannot report an instance's pid, keep it running detached from a pool, or fork
one-off calls whose results are JSON.

Who uses what:

* ``NodeAgent`` (``agent.py``) owns one ``Launcher`` per node (``launcher="fork"``, the
  default of ``gshare serve``). ``Launcher.start()`` runs ``python -m gshare.runtime.node.launcher``
  with ``TEMPLATE_ENV`` in its environment (OpenMP reads
  it once, when torch loads libgomp: threads of an instance waiting for its token must not
  spin on the cores of another instance's partition). The agent then calls
  ``launch(launch_dict, log_path)`` → the instance's pid, and ``call("module:function", args)``
  → the JSON result of the function run in a forked child (building a model's weights into the
  store; describing a handler) so that no Ray worker of the node keeps torch imported.
* The template (``main``): imports ``gshare.runtime.instance.server`` and torch
  (``PRELOAD_MODULES``), the ``transformers`` classes of a built-in model when the agent first
  starts one (``preload``, ``MODEL_MODULES``), and freezes the garbage collector's view of them
  (``gc.freeze``: the collector then never writes to those pages, which stay shared). It
  never runs a tensor operation and never starts a thread: a fork copies only the calling
  thread, and libgomp's pool does not survive a fork, so the template must have neither. It
  serves JSON lines on stdin/stdout, one request at a time, and reports every child's exit
  (``{"event": "exit", "pid", "code"}``). When stdin closes (the agent stopped or died) it
  kills its children and exits: nothing is left behind.
* An instance child: dies with the template (``PR_SET_PDEATHSIG``), writes its stdout and
  stderr to ``log_path``, builds ``InstanceServer(launch)`` (partition, model, token client,
  data path — everything ``instance.py`` documents), then writes ``<uds_path>.ready`` (its
  ``info()`` as JSON, atomically) or, if the start failed, ``<uds_path>.exit`` (the error) and
  exits 1. SIGTERM stops it. CUDA: the agent's launch env (the MPS thread percentage) is put
  in ``os.environ`` by ``InstanceServer`` before anything touches CUDA, and the template never
  initialises CUDA, so the share is set before the instance's CUDA context exists.

What must hold: the template has one thread and no OpenMP or CUDA state when it forks
(``main`` checks the thread count and says so on stderr if an import started one); requests
and answers are one JSON object per line; ``launch`` answers with the pid before the instance
is ready (readiness is the ``.ready`` file).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any

from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.instance.oscap import SESSION_ENV, remove_cgroup, remove_session_cgroups
from gshare.runtime.instance.walls import Walls, enter, kill_cgroup, kill_session

LAUNCHERS = ("fork", "ray")
"""How instance processes start (``gshare serve --launcher``): ``fork`` — forked from the
node's pre-imported template (this module; the default); ``ray`` — each a Ray actor of its own
(a fresh Python process that imports the runtime itself: seconds more per cold start, ~300 MB
more each)."""

PRELOAD_MODULES = (
    "numpy",
    "psutil",
    "torch",
    "gshare.runtime.instance.server",
    "gshare.runtime.instance.models",
    "gshare.runtime.instance.builtin_models",
    "gshare.runtime.instance.loading",
    "gshare.runtime.node.model_store",
    "gshare.runtime.tokens",
    "gshare.runtime.oip.header",
    "gshare.runtime.node.partition",
    "gshare.spec",
)
"""What the template imports before it reports ready: the instance runtime (a handler's own
imports happen in the child, after the fork)."""
MODEL_MODULES = {
    "resnet50": ("transformers.models.resnet.modeling_resnet",),
    "bert-base": ("transformers.models.bert.modeling_bert",),
    "bert-large": ("transformers.models.bert.modeling_bert",),
    "vit-base": ("transformers.models.vit.modeling_vit",),
}
"""What the template imports the first time an instance of a built-in model starts
(``Launcher.preload``): its ``transformers`` classes — over a second of imports and ~100 MB
that a node without such a model (the ``mlp``, handlers of the user's) never pays. Imported
in the template, they are shared by every instance forked after."""

TEMPLATE_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "KMP_BLOCKTIME": "0",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}
"""Settings read once, when the libraries load, so they are set for the template: OpenMP's
passive waits (torch's libgomp); numpy's OpenBLAS without its thread pool (it would start one
at import, and the template must have one thread when it forks; instances compute with torch,
whose intra-op threads ``partition.apply_cpu_partition`` sizes after the fork); and
``torch.cuda.is_available()`` answered by NVML, without ``cuInit``, if an import asks: CUDA
initialised before a fork is unusable in the children (PyTorch: "Cannot re-initialize CUDA in
forked subprocess"), so the template must never initialise it (``main`` checks)."""

START_TIMEOUT_S = 120.0
"""How long ``Launcher.start`` waits for the template to finish importing."""
STOP_GRACE_S = 2.0
"""How long the template waits for its children after SIGTERM before it SIGKILLs them."""
PR_SET_PDEATHSIG = 1


class LauncherError(RuntimeError):
    """The template is not running, died, or refused a request; the message says which."""


# -- the agent's side -----------------------------------------------------------------------------


class Launcher:
    """The agent's handle on its node's template process (see the module doc).

    Thread-safe: ``launch`` and ``call`` may be used from several threads at once; answers are
    matched to requests by id by one reader thread. ``exit_code(pid)`` is the exit status the
    template reported for a child (None while it runs or when unknown). Must hold: a pid the
    kernel hands out again does not carry an earlier child's exit into the new instance (the
    template answers a launch before it can report that child's exit, so the reader drops the
    old exit when the answer comes)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = env
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, tuple[Future[Any], bool]] = {}
        """Requests not answered yet, by id: their future, and whether it is a launch (whose
        answer is a new child's pid)."""
        self._exits: dict[int, int] = {}
        self._reader: threading.Thread | None = None
        self._preloaded: set[str] = set()
        """Models whose modules this template imported (``preload``)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the template and wait until it has imported the runtime."""
        env = {**os.environ, **TEMPLATE_ENV, **(self._env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "gshare.runtime.node.launcher"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        ready: Future[dict[str, Any]] = Future()

        def first_line() -> None:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            with contextlib.suppress(Exception):
                ready.set_result(json.loads(line) if line else {})

        threading.Thread(target=first_line, daemon=True).start()
        try:
            hello = ready.result(timeout=timeout_s)
        except Exception:
            proc.kill()
            proc.wait()
            raise LauncherError(
                f"the instance template did not start within {timeout_s:.0f} s"
            ) from None
        if hello.get("event") != "ready":
            code = proc.wait()
            raise LauncherError(
                f"the instance template exited ({code}) before it was ready; see stderr"
            )
        with self._lock:
            self._proc = proc
            self._preloaded = set()
            self._reader = threading.Thread(
                target=self._read, args=(proc,), name="gshare-launcher", daemon=True
            )
            self._reader.start()

    def ensure_started(self) -> None:
        """Start the template if it is not running (first use, or it died)."""
        if not self.alive():
            self.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == "exit":
                with self._lock:
                    self._exits[int(msg["pid"])] = int(msg["code"])
                continue
            with self._lock:
                fut, is_launch = self._pending.pop(int(msg.get("id", -1)), (None, False))
                if is_launch and isinstance(msg.get("result"), int):
                    # the new child's pid: an exit recorded under it was an earlier child's
                    self._exits.pop(int(msg["result"]), None)
            if fut is None:
                continue
            if "error" in msg:
                fut.set_exception(LauncherError(str(msg["error"])))
            else:
                fut.set_result(msg.get("result"))
        # EOF: the template is gone; fail whatever still waits.
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            fut.set_exception(LauncherError("the instance template exited"))

    def _request(self, msg: dict[str, Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None or proc.stdin is None:
                raise LauncherError("the instance template is not running")
            self._next_id += 1
            msg["id"] = self._next_id
            self._pending[self._next_id] = (fut, msg.get("op") == "launch")
            try:
                proc.stdin.write(json.dumps(msg) + "\n")
                proc.stdin.flush()
            except (OSError, ValueError) as e:
                self._pending.pop(self._next_id, None)
                raise LauncherError(f"the instance template is not running ({e})") from None
        return fut

    def launch(
        self,
        launch: dict[str, Any],
        log_path: str,
        timeout_s: float = 30.0,
        walls: dict[str, Any] | None = None,
        secrets_path: str = "",
    ) -> int:
        """Fork an instance from the template; return its pid (it is not ready yet: its
        ``.ready`` file says when it is). ``walls`` (``instance.walls.Walls.to_dict``) are put
        up in the child before the instance starts; ``secrets_path`` names a file (root's,
        0600) with the launch's secrets, which the child reads and removes before the walls
        go up, so that the template never holds them."""
        msg = {"op": "launch", "launch": launch, "log": log_path, "walls": walls}
        pid: int = self._request({**msg, "secrets": secrets_path}).result(timeout_s)
        return pid

    def preload(self, model: str, timeout_s: float = 120.0) -> None:
        """Import the modules of built-in ``model`` in the template (``MODEL_MODULES``; nothing
        for another name), once: instances forked after share them."""
        mods = MODEL_MODULES.get(model, ())
        with self._lock:
            if not mods or model in self._preloaded:
                return
        self._request({"op": "preload", "modules": list(mods)}).result(timeout_s)
        with self._lock:
            self._preloaded.add(model)

    def call(
        self,
        target: str,
        args: list[Any],
        timeout_s: float = 600.0,
        walls: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``target`` (``"module:function"``) with ``args`` in a forked child of the template
        and return its JSON result; its exception becomes a ``LauncherError`` with its message.
        With ``walls`` the child puts them up first (a call that imports a tenant's code)."""
        msg = {"op": "call", "target": target, "args": args, "walls": walls}
        return self._request(msg).result(timeout_s)

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the template's stdin: it kills its children and exits."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the template's side --------------------------------------------------------------------------


def _set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Die with the parent (Linux ``prctl(PR_SET_PDEATHSIG)``); elsewhere a no-op."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _resolve(target: str) -> Callable[..., Any]:
    mod, _, name = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(mod), name)
    return fn


def _child_setup(parent_pid: int, close_fds: list[int], log_path: str | None) -> None:
    """In a fresh child: default signals, die with the template, drop its pipes."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us
    _set_pdeathsig()
    if os.getppid() != parent_pid:  # the template died before prctl took effect
        os._exit(1)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    else:  # a call: its prints go where the template's errors go (the agent's log)
        os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the child's stdin for its whole life
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _enter_walls(walls: dict[str, Any] | None) -> None:
    """(In a forked child, before any tenant code) ``instance.walls.enter``; logs what stands."""
    if not walls:
        return
    report = enter(Walls.from_dict(walls))
    print(report.summary(), file=sys.stderr, flush=True)


def _read_secrets(launch: dict[str, Any], path: str) -> dict[str, Any]:
    """The launch with its secrets from ``path`` (``Launcher.launch``), which is removed."""
    if not path:
        return launch
    with open(path) as f:
        secrets = json.load(f)
    os.unlink(path)
    return {**launch, **secrets}


def run_instance(
    launch: dict[str, Any], walls: dict[str, Any] | None = None, secrets_path: str = ""
) -> None:
    """(In a forked child) Serve one instance until SIGTERM; never returns."""
    try:
        launch = _read_secrets(launch, secrets_path)
        _enter_walls(walls)
    except BaseException as e:
        traceback.print_exc()
        with contextlib.suppress(OSError):
            _write_atomic(str(launch.get("uds_path")) + ".exit", f"the walls failed: {e}"[:500])
        os._exit(1)
    # lazy: the instance runtime; the template preloads it, the agent must not import it
    from gshare.runtime.instance.server import InstanceServer

    il = InstanceLaunch(**launch)
    try:
        server = InstanceServer(il)
        _write_atomic(il.uds_path + ".ready", json.dumps(server.info()))
    except BaseException as e:
        traceback.print_exc()
        reason = f"failed to start: {type(e).__name__}: {e}".splitlines()[0][:500]
        with contextlib.suppress(OSError):
            _write_atomic(il.uds_path + ".exit", reason)
        sys.stderr.flush()
        os._exit(1)

    def on_term(_sig: int, _frame: Any) -> None:
        with contextlib.suppress(Exception):
            server.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        signal.pause()


class _Template:
    """The template's request loop (see the module doc)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.sel = selectors.DefaultSelector()
        self.children: set[int] = set()
        self.run_dir_of: dict[int, str] = {}
        """The run directory of each instance forked (its ``tmp-<pid>`` is removed on reap)."""
        self.calls: dict[int, tuple[int, int, list[bytes]]] = {}  # fd -> (request id, pid, chunks)
        self.pid = os.getpid()

    def send(self, msg: dict[str, Any]) -> None:
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def fork(self, log_path: str | None, keep_fd: int | None = None) -> int:
        pid = os.fork()
        if pid == 0:
            close = [0, 1, *(fd for fd in self.calls if fd != keep_fd)]
            with contextlib.suppress(Exception):
                close.append(self.sel.fileno())
            _child_setup(self.pid, close, log_path)
        else:
            self.children.add(pid)
        return pid

    def handle(self, msg: dict[str, Any]) -> None:
        rid = int(msg.get("id", 0))
        op = msg.get("op")
        if op == "launch":
            pid = self.fork(msg.get("log"))
            if pid == 0:
                try:
                    run_instance(msg["launch"], msg.get("walls"), str(msg.get("secrets") or ""))
                finally:
                    os._exit(1)
            self.run_dir_of[pid] = os.path.dirname(str(msg["launch"].get("uds_path", "")))
            self.send({"id": rid, "result": pid})
        elif op == "preload":
            for name in msg.get("modules", []):
                _preload(str(name))
            gc.collect()
            gc.freeze()
            self.send({"id": rid, "result": _thread_count()})
        elif op == "call":
            r, w = os.pipe()
            pid = self.fork(None, keep_fd=w)
            if pid == 0:
                os.close(r)
                try:
                    _enter_walls(msg.get("walls"))
                    result = {"result": _resolve(msg["target"])(*msg.get("args", []))}
                except BaseException as e:
                    result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
                try:
                    with os.fdopen(w, "w") as f:
                        f.write(json.dumps(result))
                finally:
                    os._exit(0)
            os.close(w)
            os.set_blocking(r, False)
            self.calls[r] = (rid, pid, [])
            self.sel.register(r, selectors.EVENT_READ, "call")
        else:
            self.send({"id": rid, "error": f"unknown op {op!r}"})

    def read_call(self, fd: int) -> None:
        rid, pid, chunks = self.calls[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if data:
            chunks.append(data)
            return
        self.sel.unregister(fd)
        os.close(fd)
        del self.calls[fd]
        try:
            result = json.loads(b"".join(chunks) or b"null")
        except ValueError:
            result = None
        if not isinstance(result, dict):
            result = {"error": f"the call's process {pid} died without an answer"}
        self.send({"id": rid, **result})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            kill_cgroup(os.environ.get(SESSION_ENV, ""), pid)  # what it started: walls
            remove_cgroup(os.environ.get(SESSION_ENV, ""), pid)  # instance.oscap
            self.remove_tmp(pid)  # instance.sandbox.tmp_dir
            self.send({"event": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def remove_tmp(self, pid: int) -> None:
        """Remove a reaped instance's private temporary directory (``sandbox.tmp_dir``)."""
        run_dir = self.run_dir_of.pop(pid, None)
        if run_dir:
            shutil.rmtree(os.path.join(run_dir, f"tmp-{pid}"), ignore_errors=True)

    def kill_children(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while self.children and time.monotonic() < deadline:
                with contextlib.suppress(BrokenPipeError, OSError):
                    self.reap()
                time.sleep(0.02)
            if not self.children:
                break
        kill_session(os.environ.get(SESSION_ENV, ""))  # what instances started: walls
        remove_session_cgroups(os.environ.get(SESSION_ENV, ""))

    def serve(self, stdin: IO[str]) -> None:
        os.set_blocking(stdin.fileno(), False)
        self.sel.register(stdin.fileno(), selectors.EVENT_READ, "stdin")
        buf = b""
        while True:
            for key, _ in self.sel.select(timeout=0.2):
                if key.data == "call":
                    self.read_call(int(key.fd))
                    continue
                try:
                    data = os.read(int(key.fd), 1 << 16)
                except BlockingIOError:
                    continue
                if not data:  # the agent closed our stdin: stop everything
                    self.kill_children()
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    try:
                        msg = json.loads(line)
                    except ValueError as e:
                        self.send({"id": 0, "error": f"malformed request: {e}"})
                        continue
                    self.handle(msg)
            self.reap()


def _preload(name: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError as e:  # an optional model family missing: its children import it
        print(f"gshare launcher: cannot preload {name}: {e}", file=sys.stderr)


def main() -> None:
    """The template process (``python -m gshare.runtime.node.launcher``)."""
    out = sys.stdout
    for name in PRELOAD_MODULES:
        _preload(name)
    gc.collect()
    gc.freeze()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print(
            "gshare launcher: CUDA was initialised by an import; forked instances cannot use it",
            file=sys.stderr,
        )
    threads = _thread_count()
    if threads != 1:
        print(
            f"gshare launcher: {threads} threads after the imports; forking them is unsafe",
            file=sys.stderr,
        )
    t = _Template(out)

    def on_term(_sig: int, _frame: Any) -> None:
        t.kill_children()
        os._exit(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent stops us by closing stdin
    signal.signal(signal.SIGTERM, on_term)
    t.send({"event": "ready", "pid": os.getpid(), "threads": threads})
    t.serve(sys.stdin)


if __name__ == "__main__":
    main()
