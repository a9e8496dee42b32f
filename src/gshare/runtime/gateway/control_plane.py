"""What the gateway's HTTP and gRPC layers need from the controller: ``ControlPlane``.

Who uses it: ``gateway.app`` (the control routes, ``/v2`` readiness), ``gateway.oip_service``
(model metadata and versions) take one; ``control.api.ControlApi`` implements it. A module of
its own so that the gateway's modules and the control API name it without importing each other.
"""

from __future__ import annotations

from typing import cast

from gshare.runtime.gateway.triton_ext import FunctionStatus
from gshare.runtime.gateway.workflows import Call as WorkflowCall


class ControlPlane:
    """What the HTTP layer needs from the controller (implemented by ``ControlApi``). Its
    documents are JSON the API answers as they are (``dict[str, object]``); the OIP service
    reads a function's status as a ``triton_ext.FunctionStatus``."""

    async def deploy(
        self, body: bytes, content_type: str, *, update: bool | None
    ) -> dict[str, object]:
        raise NotImplementedError

    async def delete(self, name: str) -> None:
        raise NotImplementedError

    def list_functions(self) -> list[dict[str, object]]:
        raise NotImplementedError

    def function_status(self, name: str) -> dict[str, object]:
        raise NotImplementedError

    def function_version(self, name: str) -> int:
        """The deployed version of ``name`` (asked on every OIP request: keep it cheap)."""
        status = cast("FunctionStatus", self.function_status(name))
        return int(status.get("version", 1))

    def logs(self, name: str, tail: int) -> list[str]:
        raise NotImplementedError

    async def instance_stats(self, name: str, instance_id: str) -> dict[str, object]:
        raise NotImplementedError

    async def start_profile(self, name: str, params: dict[str, object]) -> dict[str, object]:
        raise NotImplementedError

    def profile_status(self, name: str) -> dict[str, object]:
        raise NotImplementedError

    def info(self) -> dict[str, object]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    async def deploy_workflow(
        self, body: bytes, content_type: str, *, update: bool
    ) -> dict[str, object]:
        raise NotImplementedError

    async def delete_workflow(self, name: str) -> None:
        raise NotImplementedError

    def list_workflows(self) -> list[dict[str, object]]:
        raise NotImplementedError

    async def run_workflow(
        self, name: str, body: bytes, enc: int, call: WorkflowCall
    ) -> tuple[int, bytes]:
        raise NotImplementedError


__all__ = ["ControlPlane"]
