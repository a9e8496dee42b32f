"""The controller's handle on a node agent that runs as a Ray actor (``runtime.node.agent``).

Who uses it: the server wraps every agent actor it starts in a ``RayAgentHandle`` and gives it
to the controller (``Controller.add_agent``); the controller only sees the ``AgentHandle``
protocol of ``runtime.messages``, so its unit tests give it a small in-process agent instead.
Every call is bounded by ``timeout_s`` (``TimeoutError``); an actor that died raises
``AgentGone``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from gshare.runtime.messages import AgentGone, NodeStatus

DESCRIBE_TIMEOUT_S = 300.0
"""Longest a handler's description may take (it imports the user's module in a child)."""


class RayAgentHandle:
    """``AgentHandle`` over a ``NodeAgent`` Ray actor."""

    def __init__(self, node_id: str, actor: Any, timeout_s: float = 10.0) -> None:
        self.node_id = node_id
        self.actor = actor
        self.timeout_s = timeout_s

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        ref = getattr(self.actor, method).remote(*args)
        try:
            return await asyncio.wait_for(_await(ref), timeout_s or self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
            raise AgentGone(f"the node agent on {self.node_id[:8]} is gone: {e}") from None

    async def status(self) -> NodeStatus:
        status: NodeStatus = await self._call("status")
        return status

    async def start_instance(self, launch: dict[str, Any]) -> None:
        await self._call("start_instance", launch)

    async def stop_instance(self, instance_id: str) -> None:
        await self._call("stop_instance", instance_id)

    async def describe(self, spec: dict[str, Any], extra_sys_path: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "describe", spec, extra_sys_path, timeout_s=DESCRIBE_TIMEOUT_S
        )
        return result

    async def set_share(self, instance_id: str, quota_request: float, quota_limit: float) -> None:
        await self._call("set_share", instance_id, quota_request, quota_limit)


async def _await(ref: Any) -> Any:
    return await ref


__all__ = ["RayAgentHandle"]
