"""The Open Inference Protocol v2 service of a gateway, independent of its transport: health,
metadata, readiness, Triton's extensions and inference. ``oip_http`` (HTTP/REST, the FastAPI
routes and the raw-ASGI infer path) and ``grpc_server`` (``GRPCInferenceService``) are thin
front ends over one ``OipService``, so both answer alike and infer requests take the same
dispatch path as ``POST /function/{name}``: ``Gateway.submit`` → the function's queue → an
instance (docs/DESIGN.md §5).

Who builds it: the server (``runtime.server``) builds one per gateway and hands it to
``app.build_app`` and, with ``--grpc-port``, to ``grpc_server.start_grpc_server``. Errors are
``HttpError`` (404 unknown model or version, 400 bad request, 503 ...); the gRPC front end maps
their codes to gRPC status codes.

System shared memory (Triton's extension): ``shm`` holds the regions clients registered; an
infer request of either transport that references one is resolved by the front end in the
gateway (``gateway.shm``: inputs read from the mapping into the payload, outputs written from
the answer into it), so the instance gets an ordinary request.

Model versions: a function's version is the one its spec has in the state store (1 on deploy,
+1 on every update); a request naming another version is a 404 (gshare serves one version of a
function at a time).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

from gshare import __version__
from gshare.runtime.gateway.channel import Pending
from gshare.runtime.gateway.errors import HttpError, status_of
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.shm import SharedMemoryRegistry
from gshare.runtime.gateway.triton_ext import (
    FunctionStatus,
    InferenceStats,
    model_config,
    readiness,
    repository_index,
)
from gshare.runtime.instance import protocol as P

if TYPE_CHECKING:
    from starlette.types import Receive

    from gshare.runtime.gateway.control_plane import ControlPlane

EXTENSIONS = (
    "binary_tensor_data",
    "parameters",
    "model_configuration",
    "statistics",
    "system_shared_memory",
)
"""What ``GET /v2`` lists: Triton's names of the extensions gshare implements (the repository
index is served too, without load/unload)."""


class OipService:
    """See the module doc. ``control`` is the ``app.ControlPlane`` (function status, readiness);
    ``shm`` the system shared-memory regions both transports' requests may reference
    (``gateway.shm``; the server's lifespan calls ``close`` at shutdown)."""

    def __init__(
        self,
        gw: Gateway,
        control: ControlPlane,
        stats: InferenceStats | None = None,
        shm: SharedMemoryRegistry | None = None,
    ) -> None:
        self.gw = gw
        self.control = control
        self.stats = stats or InferenceStats()
        self.shm = shm if shm is not None else SharedMemoryRegistry()

    def close(self) -> None:
        """The server stops: every shared-memory region is unmapped."""
        self.shm.close()

    # -- health and metadata -------------------------------------------------------------------

    def server_ready(self) -> tuple[bool, str]:
        """OIP "server ready": the server runs (controller started, a node agent alive, not
        shutting down) and every deployed function is ready (``triton_ext.readiness``)."""
        if self.gw.closing:
            return False, "the server is shutting down"
        if not self.control.ready():
            return False, "the controller or the node agents are not running yet"
        for st in self._functions():
            r = readiness(st)
            if not r.ready:
                return False, f"function {st['name']!r} is not ready: {r.reason}"
        return True, ""

    def server_metadata(self) -> dict[str, object]:
        return {"name": "gshare", "version": __version__, "extensions": list(EXTENSIONS)}

    def _functions(self) -> list[FunctionStatus]:
        """The control API's status of every deployed function."""
        return cast("list[FunctionStatus]", self.control.list_functions())

    def status(self, name: str, version: str | None = None) -> FunctionStatus:
        """The control API's status of function ``name`` (``HttpError`` 404 when it is not
        deployed, or ``version`` is given and is not its version)."""
        if not self.gw.is_public(name):
            raise HttpError(404, f"model {name!r} is not deployed")
        st = cast("FunctionStatus", self.control.function_status(name))
        if version not in (None, "") and str(version) != str(st["version"]):
            raise HttpError(
                404,
                f"model {name!r} has no version {version!r} (it serves version {st['version']})",
            )
        return st

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, object]:
        st = self.status(name, version)
        spec = st["spec"]
        return {
            "name": name,
            "versions": [str(st["version"])],
            "platform": "gshare/" + (spec.get("model") or "handler"),
            "inputs": st.get("inputs") or [],
            "outputs": st.get("outputs") or [],
        }

    def model_ready(self, name: str, version: str | None = None) -> tuple[bool, dict[str, object]]:
        st = self.status(name, version)
        r = readiness(st)
        body: dict[str, object] = {
            "name": name,
            "version": str(st["version"]),
            "ready": r.ready,
            "state": r.state,
            "instances_ready": st["available_replicas"],
        }
        if not r.ready:
            body["error"] = f"model {name!r} is not ready: {r.reason}"
        return r.ready, body

    # -- Triton extensions ---------------------------------------------------------------------

    def model_config(self, name: str, version: str | None = None) -> dict[str, object]:
        return model_config(self.status(name, version))

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, object]:
        """``{"model_stats": [...]}`` of one function, or of all when ``name`` is empty."""
        if name:
            st = self.status(name, version)
            return {"model_stats": [self.stats.model_stats(name, int(st["version"]))]}
        return {
            "model_stats": [
                self.stats.model_stats(st["name"], int(st["version"])) for st in self._functions()
            ]
        }

    def repository_index(self, ready_only: bool = False) -> list[dict[str, object]]:
        return repository_index(self._functions(), ready_only)

    def forget(self, name: str) -> None:
        """Function ``name`` was deleted (``app``'s delete routes call it)."""
        self.stats.forget(name)

    # -- inference -----------------------------------------------------------------------------

    def version_of(self, name: str, version: str | None) -> int:
        """The version a request for ``name`` runs (``HttpError`` 404 as ``status``); cheap
        enough for every request."""
        if not self.gw.is_public(name):
            raise HttpError(404, f"model {name!r} is not deployed")
        current = int(self.control.function_version(name))
        if version not in (None, "") and str(version) != str(current):
            raise HttpError(
                404, f"model {name!r} has no version {version!r} (it serves version {current})"
            )
        return current

    async def call(
        self,
        function: str,
        enc: int,
        payload: P.Payload,
        receive: Receive | None = None,
        borrow: list[Pending] | None = None,
    ) -> tuple[int, bytes, tuple[float, float, float, int]]:
        """Run one request on ``function`` through the gateway's queues (``Gateway.submit``):
        its answer ``(encoding, data, measurements)``, or ``HttpError`` with the status the
        instance (or the gateway: 404, 429, 503, 504) gave. Counted in the Prometheus metrics
        and the Triton statistics. ``receive``: the HTTP request's, to cancel it when its
        client goes away (``Gateway.wait``). ``borrow``: ``call_borrowed``'s."""
        gw = self.gw
        p = gw.submit(function, P.OP_INVOKE, enc, payload)
        if borrow is not None:
            p.borrow = True
            borrow.append(p)
        try:
            status, renc, data, m = await gw.wait(p, receive)
        except HttpError as e:
            gw.record(function, e.status, p, None)
            self.stats.observe(function, e.status, time.perf_counter() - p.arrived, None)
            e.recorded = True
            raise
        code = status_of(status)
        gw.record(function, code, p, m)
        self.stats.observe(function, code, time.perf_counter() - p.arrived, m)
        if code != 200:
            err = HttpError(code, data.decode("utf-8", errors="replace"))
            err.recorded = True
            raise err
        return renc, data, m

    @contextlib.asynccontextmanager
    async def call_borrowed(
        self, function: str, enc: int, payload: P.Payload, receive: Receive | None = None
    ) -> AsyncIterator[tuple[int, bytes | memoryview, tuple[float, float, float, int]]]:
        """``call``, whose answer, when it came through a shared-memory lane, is lent as a
        view of the lane until the ``async with`` block ends (``instance.lanes``): for a
        caller that writes it elsewhere at once (outputs into a client's shared-memory
        regions) and so saves a copy. The view must not be kept past the block."""
        held: list[Pending] = []
        try:
            renc, data, m = await self.call(function, enc, payload, receive, borrow=held)
            view = held[0].borrowed
            yield renc, (view if view is not None else data), m
        finally:
            for p in held:
                release, p.release, p.borrowed = p.release, None, None
                if release is not None:
                    release()


__all__ = ["EXTENSIONS", "OipService"]
