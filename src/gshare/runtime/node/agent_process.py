"""The node agent as a child process of ``gshare serve``: the embedded default, without Ray.

Who uses it: the server's local cluster backend (``runtime.backends.LocalBackend``) calls
``spawn_agent`` from its main thread and talks to the child through
``runtime.control.agents.ProcessAgentHandle``; the child runs ``main`` (``python -m
gshare.runtime.node.agent_process --fd N --parent-pid P``) around the same ``NodeAgent`` that
runs as a Ray actor on a cluster.

The wire: one ``AF_UNIX`` socket pair, private to the two processes (no port, no path). Both
ways, frames of a 4-byte big-endian length and a pickle (the two ends are the same program;
nobody else holds the socket). The server sends ``(id, method, args)``; the agent answers
``(id, True, result)`` or ``(id, False, exception)``. The first request is ``(0, "init",
(kwargs,))``, sent by ``spawn_agent`` itself: the agent builds its ``NodeAgent(**kwargs)``
(token servers, template) while the server imports and wires the rest, and answers with its
``NodeInfo``.
Requests run on a thread pool (``WORKERS``), so a long one (``describe`` imports the user's
module) never holds up ``status``; answers are matched to requests by id.

What must hold:

* the agent dies with the server: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` at start, then a check
  that the parent is still the one that spawned it. The death signal follows the *thread* that
  forked, so ``spawn_agent`` must be called from a thread that lives as long as the server (its
  main thread); its template and instances die with it in turn (``node.launcher``);
* the server sees the agent die at once: its end of the socket reads EOF (nobody else holds
  the agent's end: it is passed to the agent alone and not inherited further);
* when the socket closes (the server stopped it, or died) the agent shuts its node down
  (``NodeAgent.shutdown``: instances, token servers, model store, run directory) and exits;
* Ctrl-C reaches the whole foreground process group, and a service manager's stop may signal
  the whole group: the agent ignores SIGINT and SIGTERM, and the server stops it in order (were
  the server to die instead, the death signal ends the agent).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias, cast

if TYPE_CHECKING:
    from gshare.runtime.node.agent import NodeAgent

FRAME = struct.Struct("!I")
"""A frame's header: the length of the pickle that follows."""
MAX_FRAME = 256 << 20
"""Largest frame accepted (a status of thousands of instances is far below)."""
WORKERS = 32
"""Requests an agent runs at once (what the Ray actor's ``max_concurrency`` was)."""
PR_SET_PDEATHSIG = 1

_Request: TypeAlias = "tuple[int, str, tuple[Any, ...]]"
"""``(id, method, args)``: ``NodeAgent.method(*args)``, with that method's own arguments."""


def encode(msg: object) -> bytes:
    """One frame: header and pickle."""
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(body)) + body


def answer_error(e: BaseException) -> BaseException:
    """``e`` if it pickles (the caller gets the agent's own exception), else a
    ``RuntimeError`` with its type and message."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def spawn_agent(
    init: dict[str, object], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start an agent child, send it ``(0, "init", (init,))`` (the ``NodeAgent``'s keyword
    arguments: it builds its node at once, while the caller goes on), and return it with the
    server's end of its socket pair; ``ProcessAgentHandle.open`` then waits for the answer.
    Call it from the server's main thread (the module doc: the death signal follows the
    forking thread)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gshare.runtime.node.agent_process",
                "--fd",
                str(theirs.fileno()),
                "--parent-pid",
                str(os.getpid()),
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    # a few hundred bytes: the buffer holds them; if it died at once, ``open`` reads the EOF
    with contextlib.suppress(OSError):
        ours.sendall(encode((0, "init", (init,))))
    return proc, ours


# -- the agent's side ------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> object:
    """The next frame's message, blocking; None at EOF (the other end closed, or died)."""
    head = _recv_exact(sock, FRAME.size)
    if head is None:
        return None
    (n,) = FRAME.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    body = _recv_exact(sock, n)
    return None if body is None else pickle.loads(body)


class _Served:
    """The agent's request loop over its socket (module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.agent: NodeAgent | None = None
        self.shut = False
        self.shut_lock = threading.Lock()

    def send(self, msg: object) -> None:
        data = encode(msg)
        with self.lock, contextlib.suppress(OSError):  # the server is gone: EOF ends the loop
            self.sock.sendall(data)

    def run_one(self, rid: int, method: str, args: tuple[object, ...]) -> None:
        try:
            if method == "shutdown":
                self.shutdown()
                result = None
            else:
                result = getattr(self.agent, method)(*args)
        except BaseException as e:
            self.send((rid, False, answer_error(e)))
            return
        try:
            self.send((rid, True, result))
        except Exception as e:  # an answer that does not pickle
            self.send((rid, False, RuntimeError(f"cannot send the answer to {method}: {e}")))

    def shutdown(self) -> None:
        """Stop the node once (a ``shutdown`` request, then EOF, or EOF alone)."""
        with self.shut_lock:
            if not self.shut and self.agent is not None:
                self.shut = True
                self.agent.shutdown()

    def serve(self) -> int:
        first = recv(self.sock)
        if first is None:
            return 0
        rid, method, args = cast(_Request, first)
        if method != "init":
            self.send((rid, False, RuntimeError(f"the first request must be init, not {method}")))
            return 1
        # lazy: the server imports this module (spawn_agent); only the child runs an agent
        from gshare.runtime.node.agent import NodeAgent

        try:
            self.agent = NodeAgent(**args[0])
            info = self.agent.info()
        except BaseException as e:
            self.send((rid, False, answer_error(e)))
            return 1
        self.send((rid, True, info))
        pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="gshare-agent")
        while True:
            msg = recv(self.sock)
            if msg is None:
                break
            pool.submit(self.run_one, *cast(_Request, msg))
        with contextlib.suppress(Exception):
            self.shutdown()
        return 0


def _die_with_parent(parent_pid: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the server died before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    """``python -m gshare.runtime.node.agent_process --fd N --parent-pid P`` (``spawn_agent``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts = dict(zip(args[::2], args[1::2], strict=False))
    _die_with_parent(int(opts["--parent-pid"]))
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C or a stop of the whole group: the
        signal.signal(sig, signal.SIG_IGN)  # server stops us in order (or its death kills us)
    fd = int(opts["--fd"])
    os.set_inheritable(fd, False)  # the template and instances must not hold it
    sock = socket.socket(fileno=fd)
    code = _Served(sock).serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not the interpreter's exit: it would join the request threads


if __name__ == "__main__":
    main()


__all__ = ["FRAME", "WORKERS", "answer_error", "encode", "main", "recv", "spawn_agent"]
