"""The controller's handles on node agents (``runtime.node.agent``): a child process of the
server (``ProcessAgentHandle``, the embedded default) or a Ray actor (``RayAgentHandle``).

Who uses them: the server's cluster backend (``runtime.server``) wraps every agent it starts in
one and gives it to the controller (``Controller.add_agent``); the controller only sees the
``AgentHandle`` protocol of ``runtime.messages``, so its unit tests give it a small in-process
agent instead. Every call is bounded by ``timeout_s`` (``TimeoutError``); an agent that died
raises ``AgentGone``. This module imports Ray only when a ``RayAgentHandle`` makes a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.messages import AgentGone, NodeInfo, NodeStatus
from gshare.runtime.node.agent_process import FRAME, MAX_FRAME, encode

log = logging.getLogger("gshare.controller")
_T = TypeVar("_T")

DESCRIBE_TIMEOUT_S = 300.0
"""Longest a handler's description may take (it imports the user's module in a child)."""
SHUTDOWN_TIMEOUT_S = 30.0
"""Longest an agent's shutdown may take (it stops every instance and its token servers)."""


class _AgentCalls:
    """The ``AgentHandle`` calls, the same on every transport: each is one ``_call`` of the
    agent's method of that name (a subclass provides ``_call``: bounded by its time-out,
    ``AgentGone`` when the agent died)."""

    async def _call(self, method: str, *args: object, timeout_s: float | None = None) -> object:
        raise NotImplementedError

    async def status(self) -> NodeStatus:
        return _expect(await self._call("status"), NodeStatus, "status")

    async def start_instance(self, launch: InstanceLaunch) -> None:
        await self._call("start_instance", launch)

    async def stop_instance(self, instance_id: str) -> None:
        await self._call("stop_instance", instance_id)

    async def describe(
        self, spec: Mapping[str, object], extra_sys_path: list[str]
    ) -> dict[str, object]:
        result = await self._call("describe", spec, extra_sys_path, timeout_s=DESCRIBE_TIMEOUT_S)
        return _expect(result, dict, "describe")

    async def set_share(self, instance_id: str, quota_request: float, quota_limit: float) -> None:
        await self._call("set_share", instance_id, quota_request, quota_limit)


class ProcessAgentHandle(_AgentCalls):
    """``AgentHandle`` over a ``NodeAgent`` in a child process of the server
    (``node.agent_process``: its wire, and what must hold).

    Lifecycle, all on the server's event loop: ``open()`` waits for the answer to the ``init``
    that ``spawn_agent`` sent and returns the agent's ``NodeInfo``; calls may then run
    concurrently (answers are matched by id); the first EOF on the socket (the agent exited or
    was killed) fails every waiting call with ``AgentGone``, and so does every later call, and
    ``on_gone(self)`` runs once — the backend replaces the agent at once, without waiting for a
    status poll. ``shutdown()`` stops the
    node in order and reaps the process."""

    def __init__(
        self,
        node_id: str,
        proc: subprocess.Popen[bytes],
        sock: socket.socket,
        *,
        timeout_s: float = 10.0,
        on_gone: Callable[[ProcessAgentHandle], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.proc = proc
        self.timeout_s = timeout_s
        self.on_gone = on_gone
        self.gone: str | None = None
        """Why the agent is gone (None while it answers)."""
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[object]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def open(self, timeout_s: float = 120.0) -> NodeInfo:
        """Connect to the agent and return its ``NodeInfo`` once its node is built (the answer
        to ``spawn_agent``'s ``init``; the agent's error if it could not build it). Raises
        ``AgentGone`` if it exits first, ``TimeoutError`` after ``timeout_s``."""
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._pending[0] = fut  # before the reader starts: the answer may be waiting already
        self._reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._task = asyncio.create_task(self._read(), name=f"gshare-agent-{self.node_id[:8]}")
        try:
            info = await asyncio.wait_for(fut, timeout_s)
        finally:
            self._pending.pop(0, None)
        return _expect(info, NodeInfo, "init")

    async def _read(self) -> None:
        assert self._reader is not None
        why = "its process exited"
        try:
            while True:
                head = await self._reader.readexactly(FRAME.size)
                (n,) = FRAME.unpack(head)
                if n > MAX_FRAME:
                    why = f"it sent a frame of {n} bytes"
                    break
                rid, ok, value = pickle.loads(await self._reader.readexactly(n))
                fut = self._pending.pop(rid, None)
                if fut is None or fut.done():
                    continue  # answered after its caller gave up
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            why = "the server closed it"
        except Exception as e:  # a frame that does not unpickle: treat the agent as lost
            why = f"unreadable answer ({e})"
        self._lost(why)

    def _lost(self, why: str) -> None:
        if self.gone is not None:
            return
        code = self.proc.poll()
        self.gone = why if code is None else f"{why} (exit code {code})"
        err = AgentGone(f"the node agent on {self.node_id[:8]} is gone: {self.gone}")
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self.on_gone is not None:
            self.on_gone(self)

    async def _request(
        self, rid: int, method: str, args: tuple[object, ...], timeout_s: float
    ) -> object:
        if self.gone is not None:
            raise AgentGone(f"the node agent on {self.node_id[:8]} is gone: {self.gone}")
        assert self._writer is not None, "open() first"
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(encode((rid, method, args)))
            await self._writer.drain()
            return await asyncio.wait_for(fut, timeout_s)
        except (ConnectionError, BrokenPipeError) as e:
            raise AgentGone(f"the node agent on {self.node_id[:8]} is gone: {e}") from None
        finally:
            self._pending.pop(rid, None)

    async def _call(self, method: str, *args: object, timeout_s: float | None = None) -> object:
        return await self._request(next(self._ids), method, args, timeout_s or self.timeout_s)

    async def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop the node (``NodeAgent.shutdown``), close the socket, reap the process (killed
        if it does not exit in time). Safe on an agent that is already gone."""
        self.on_gone = None  # a stop, not a loss
        if self.gone is None and self._writer is not None:
            try:
                await self._call("shutdown", timeout_s=timeout_s)
            except Exception as e:
                log.warning("agent on node %s did not shut down: %s", self.node_id[:8], e)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        else:
            self._sock.close()
        try:
            await asyncio.to_thread(self.proc.wait, 10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class RayAgentHandle(_AgentCalls):
    """``AgentHandle`` over a ``NodeAgent`` Ray actor."""

    def __init__(self, node_id: str, actor: object, timeout_s: float = 10.0) -> None:
        self.node_id = node_id
        self.actor = actor
        self.timeout_s = timeout_s

    async def _call(self, method: str, *args: object, timeout_s: float | None = None) -> object:
        import ray  # lazy: Ray is imported only by a server that runs on Ray

        ref = getattr(self.actor, method).remote(*args)
        try:
            return await asyncio.wait_for(_await(ref), timeout_s or self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
            raise AgentGone(f"the node agent on {self.node_id[:8]} is gone: {e}") from None


async def _await(ref: Awaitable[object]) -> object:
    return await ref


def _expect(value: object, kind: type[_T], method: str) -> _T:
    """``value``, an agent's answer to ``method``, if it is a ``kind``; else a ``TypeError``
    naming what came instead (an agent of another version)."""
    if not isinstance(value, kind):
        raise TypeError(
            f"the node agent answered {method} with a {type(value).__name__}, not a {kind.__name__}"
        )
    return value


__all__ = ["DESCRIBE_TIMEOUT_S", "ProcessAgentHandle", "RayAgentHandle"]
