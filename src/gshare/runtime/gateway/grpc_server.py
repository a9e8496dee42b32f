"""The KServe v2 ``inference.GRPCInferenceService`` (with Triton's ModelConfig,
ModelStatistics and RepositoryIndex) on ``gshare serve --grpc-port``: a ``grpc.aio`` server
on the gateway's own event loop, a front end of the same ``oip_service.OipService`` as the
HTTP API — ModelInfer takes the same dispatch path as ``POST /v2/models/{name}/infer``.

Who starts it: the server's lifespan (``runtime.server``), after the controller, and stops it
before the controller (``GrpcServer.stop``). The RPCs: ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelInfer, ModelStreamInfer (each request of the stream
answered as it completes; a generative function's answer streamed chunk by chunk,
``grpc_generate``), ModelConfig, ModelStatistics, RepositoryIndex,
SystemSharedMemory{Status,Register,Unregister} (``oip.shm``; CudaSharedMemory* answer
INVALID_ARGUMENT: not supported); the others of Triton's service (trace, logging, repository
load/unload) answer UNIMPLEMENTED. ModelInfer's request is parsed for its model name and
version only: its bytes go to the instance as they came (``oip.grpc_messages``), and the
instance's serialized response comes back as it is — unless a tensor has shared-memory
parameters (``shm.grpc_mentions_shm``): then ``shm.prepare_grpc`` / ``shm.finish_grpc``
resolve them in the gateway. Errors carry the HTTP API's messages with
the matching status code (404 → NOT_FOUND, 400 → INVALID_ARGUMENT, 503 → UNAVAILABLE, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc.aio import ServicerContext

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.grpc_generate import stream_generate
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.shm import (
    CUDA_NOT_SUPPORTED,
    finish_grpc,
    grpc_mentions_shm,
    prepare_grpc,
)
from gshare.runtime.instance import protocol as P
from gshare.runtime.oip.grpc_messages import SERVICE, Message, from_dict, pb
from gshare.runtime.oip.grpc_wire import REQUEST_RAW_FIELD, split_message
from gshare.runtime.oip.header import TRANSPORT_GRPC, OipError, wrap

log = logging.getLogger("gshare.grpc")

CODES: Final[dict[int, grpc.StatusCode]] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    410: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""HTTP status of an ``HttpError`` → gRPC status code (others: INTERNAL)."""


def grpc_code(http_status: int) -> grpc.StatusCode:
    return CODES.get(http_status, grpc.StatusCode.INTERNAL)


class ModelRequest(Protocol):
    """A request naming a model (``ModelReadyRequest``, ``ModelMetadataRequest``,
    ``ModelConfigRequest``, ``ModelStatisticsRequest``; empty strings: not given)."""

    name: str
    version: str


class RepositoryIndexRequest(Protocol):
    """``inference.RepositoryIndexRequest``: whether to list only the ready models."""

    ready: bool


class RegionRequest(Protocol):
    """``SystemSharedMemoryStatusRequest`` / ``UnregisterRequest`` (empty name: every region)."""

    name: str


class RegisterRequest(Protocol):
    """``inference.SystemSharedMemoryRegisterRequest``."""

    name: str
    key: str
    offset: int
    byte_size: int


class GrpcInferenceService:
    """The RPC handlers (module doc), each a coroutine ``(request, context) -> response``."""

    def __init__(self, oip: OipService) -> None:
        self.oip = oip

    async def ServerLive(self, req: object, ctx: ServicerContext) -> object:  # noqa: N802 (the RPC's name)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, req: object, ctx: ServicerContext) -> object:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.oip.server_ready()[0])

    async def ModelReady(self, req: ModelRequest, ctx: ServicerContext) -> object:  # noqa: N802
        ok, _ = self.oip.model_ready(req.name, req.version)
        return pb.ModelReadyResponse(ready=ok)

    async def ServerMetadata(self, req: object, ctx: ServicerContext) -> object:  # noqa: N802
        return from_dict(self.oip.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, req: ModelRequest, ctx: ServicerContext) -> object:  # noqa: N802
        return from_dict(self.oip.model_metadata(req.name, req.version), pb.ModelMetadataResponse())

    async def ModelConfig(self, req: ModelRequest, ctx: ServicerContext) -> object:  # noqa: N802
        return from_dict(
            {"config": self.oip.model_config(req.name, req.version)}, pb.ModelConfigResponse()
        )

    async def ModelStatistics(self, req: ModelRequest, ctx: ServicerContext) -> object:  # noqa: N802
        doc = self.oip.statistics(req.name, req.version)
        return from_dict(doc, pb.ModelStatisticsResponse())

    async def RepositoryIndex(  # noqa: N802
        self, req: RepositoryIndexRequest, ctx: ServicerContext
    ) -> object:
        return from_dict(
            {"models": self.oip.repository_index(req.ready)}, pb.RepositoryIndexResponse()
        )

    def _generative(self, raw: bytes) -> bool:
        """Whether ``raw`` (a ModelInferRequest) asks a generative function."""
        head = pb.ModelInferRequest()
        try:
            head.ParseFromString(split_message(memoryview(raw), REQUEST_RAW_FIELD)[0])
        except (OipError, DecodeError):
            return False  # infer answers it
        r = self.oip.gw.routes.get(head.model_name)
        return r is not None and r.gen is not None

    async def infer(self, raw: bytes) -> bytes:
        """One serialized ModelInferRequest → its serialized ModelInferResponse."""
        head = pb.ModelInferRequest()
        try:  # the name and the version only: the tensors are the instance's to decode
            head.ParseFromString(split_message(memoryview(raw), REQUEST_RAW_FIELD)[0])
        except (OipError, DecodeError) as e:
            raise HttpError(400, f"malformed ModelInferRequest: {e}") from None
        name = head.model_name
        v = self.oip.version_of(name, head.model_version)
        if grpc_mentions_shm(head):
            head.ParseFromString(raw)  # with its raw contents: some inputs may be inline
            payload, shm_outputs = prepare_grpc(self.oip.shm, head, v)
            del raw, head
            renc, data, _m = await self.oip.call(name, P.ENC_OIP, payload)
            if renc != P.ENC_PROTOBUF:
                raise HttpError(500, "the instance did not answer a ModelInferResponse")
            return finish_grpc(data, shm_outputs)
        del head
        renc, data, _m = await self.oip.call(name, P.ENC_OIP, wrap(TRANSPORT_GRPC, -1, v, [raw]))
        if renc != P.ENC_PROTOBUF:
            raise HttpError(500, "the instance did not answer a ModelInferResponse")
        return data

    async def SystemSharedMemoryStatus(  # noqa: N802
        self, req: RegionRequest, ctx: ServicerContext
    ) -> object:
        regions = {r["name"]: r for r in self.oip.shm.status(req.name)}
        return from_dict({"regions": regions}, pb.SystemSharedMemoryStatusResponse())

    async def SystemSharedMemoryRegister(  # noqa: N802
        self, req: RegisterRequest, ctx: ServicerContext
    ) -> object:
        self.oip.shm.register(req.name, req.key, req.offset, req.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(  # noqa: N802
        self, req: RegionRequest, ctx: ServicerContext
    ) -> object:
        self.oip.shm.unregister(req.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemory(self, req: object, ctx: ServicerContext) -> object:  # noqa: N802
        """CudaSharedMemoryStatus / Register / Unregister: not supported."""
        raise HttpError(400, CUDA_NOT_SUPPORTED)

    async def ModelInfer(self, raw: bytes, ctx: ServicerContext) -> bytes:  # noqa: N802
        return await self.infer(raw)

    async def ModelStreamInfer(  # noqa: N802
        self, requests: AsyncIterator[bytes], ctx: ServicerContext
    ) -> AsyncIterator[object]:
        """Each request of the stream runs as it arrives; answers come as they complete (a
        failed one as ``error_message``)."""
        out: asyncio.Queue[object | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(raw: bytes) -> None:
            try:
                if self._generative(raw):  # its answer streamed chunk by chunk
                    async for chunk in stream_generate(self.oip, raw):
                        await out.put(chunk)
                    return
                resp = pb.ModelInferResponse.FromString(await self.infer(raw))
                await out.put(pb.ModelStreamInferResponse(infer_response=resp))
            except HttpError as e:
                await out.put(pb.ModelStreamInferResponse(error_message=e.message))
            except Exception as e:  # answered, never dropped: the stream waits for each
                log.exception("gRPC stream request failed")
                await out.put(
                    pb.ModelStreamInferResponse(
                        error_message=f"internal error: {type(e).__name__}: {e}"
                    )
                )

        async def read_all() -> None:
            try:
                async for raw in requests:
                    t = asyncio.create_task(one(raw))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.wait(set(tasks))
            finally:
                await out.put(None)  # every answer is queued before this

        reader = asyncio.create_task(read_all())
        try:
            while (item := await out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for t in list(tasks):
                t.cancel()


Req = TypeVar("Req")


def _unary(
    fn: Callable[[Req, ServicerContext], Awaitable[object]],
    request: type[Message] | None,
    response: type[Message] | None,
) -> grpc.RpcMethodHandler:
    async def handle(req: Req, ctx: ServicerContext) -> object | None:
        try:
            return await fn(req, ctx)
        except HttpError as e:
            await ctx.abort(grpc_code(e.status), e.message)
        except Exception as e:
            log.exception("gRPC handler failed")
            await ctx.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
        return None  # not reached: abort raises

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=None if request is None else request.FromString,
        response_serializer=None if response is None else response.SerializeToString,
    )


def handlers(svc: GrpcInferenceService) -> grpc.GenericRpcHandler:
    """The generic handler of ``inference.GRPCInferenceService``'s implemented RPCs (ModelInfer
    and ModelStreamInfer with raw-bytes requests)."""
    table: dict[str, grpc.RpcMethodHandler] = {
        "ServerLive": _unary(svc.ServerLive, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": _unary(svc.ServerReady, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": _unary(svc.ModelReady, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ServerMetadata": _unary(
            svc.ServerMetadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
        ),
        "ModelMetadata": _unary(
            svc.ModelMetadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
        ),
        "ModelConfig": _unary(svc.ModelConfig, pb.ModelConfigRequest, pb.ModelConfigResponse),
        "ModelStatistics": _unary(
            svc.ModelStatistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse
        ),
        "RepositoryIndex": _unary(
            svc.RepositoryIndex, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse
        ),
        "SystemSharedMemoryStatus": _unary(
            svc.SystemSharedMemoryStatus,
            pb.SystemSharedMemoryStatusRequest,
            pb.SystemSharedMemoryStatusResponse,
        ),
        "SystemSharedMemoryRegister": _unary(
            svc.SystemSharedMemoryRegister,
            pb.SystemSharedMemoryRegisterRequest,
            pb.SystemSharedMemoryRegisterResponse,
        ),
        "SystemSharedMemoryUnregister": _unary(
            svc.SystemSharedMemoryUnregister,
            pb.SystemSharedMemoryUnregisterRequest,
            pb.SystemSharedMemoryUnregisterResponse,
        ),
        **{
            f"CudaSharedMemory{rpc}": _unary(svc.CudaSharedMemory, None, None)
            for rpc in ("Status", "Register", "Unregister")
        },
        "ModelInfer": _unary(svc.ModelInfer, None, None),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            svc.ModelStreamInfer,
            request_deserializer=None,
            response_serializer=pb.ModelStreamInferResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, table)


class GrpcServer:
    """A started gRPC server and the address it listens on."""

    def __init__(self, server: grpc.aio.Server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let RPCs in flight finish for up to ``grace_s``."""
        with contextlib.suppress(Exception):
            await self.server.stop(grace_s)


async def start_grpc_server(
    oip: OipService, host: str, port: int, *, max_message_bytes: int
) -> GrpcServer:
    """Listen on ``host:port`` (0: any free port) on the running loop; ``OSError`` when the
    address cannot be bound."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),  # a busy port is an error, not a shared one
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    server.add_generic_rpc_handlers((handlers(GrpcInferenceService(oip)),))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as e:
        raise OSError(f"cannot listen for gRPC on {target}: {e}") from None
    if not bound:
        raise OSError(f"cannot listen for gRPC on {target}")
    await server.start()
    return GrpcServer(server, host, bound)


__all__ = [
    "CODES",
    "GrpcInferenceService",
    "GrpcServer",
    "grpc_code",
    "handlers",
    "start_grpc_server",
]
