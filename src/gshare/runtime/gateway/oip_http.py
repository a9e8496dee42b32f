"""The Open Inference Protocol v2 over HTTP/REST (with Triton's binary tensor data,
model configuration, statistics and repository-index extensions): a front end of
``oip_service.OipService``.

* ``mount_oip(app, oip)`` adds the metadata routes to the FastAPI app: ``/v2/health/live``,
  ``/v2/health/ready``, ``/v2``, ``/v2/models/{name}[/versions/{v}]`` and its ``/ready``,
  ``/config``, ``/stats``, ``/v2/models/stats`` and ``POST /v2/repository/index`` (the
  repository's load / unload answer 501: functions are deployed through the control API);
* ``serve_infer`` answers ``POST /v2/models/{name}[/versions/{v}]/infer`` in raw ASGI
  (``app.InvokeFastPath`` routes it here: ``infer_target``). It checks only the framing — the
  model and version, the body size, ``Inference-Header-Content-Length`` inside the body — and
  forwards the body untouched to an instance (``oip.header.wrap``), which decodes and validates the
  tensors; the event loop does no per-element work. The answer is JSON, or, when outputs are
  asked for as binary data, the JSON header then the binary data with
  ``Inference-Header-Content-Length`` (``application/octet-stream``). A body whose JSON part
  mentions ``shared_memory_`` (a substring search, ``shm.mentions_shm``) is resolved against
  the registered regions first (``shm.prepare_http`` / ``shm.finish_http``);
* ``mount_shm(app, oip)`` adds Triton's system shared-memory routes —
  ``GET /v2/systemsharedmemory[/region/{name}]/status``,
  ``POST /v2/systemsharedmemory/region/{name}/register`` (``{"key", "offset", "byte_size"}``),
  ``POST /v2/systemsharedmemory[/region/{name}]/unregister`` — over ``oip.shm``, and answers
  every ``/v2/cudasharedmemory/...`` route with a 400 (not supported).
"""

from __future__ import annotations

import struct

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from gshare.runtime.gateway.asgi import (
    header_map,
    parse_json,
    read_body,
    read_request,
    send_response,
    timing_headers,
)
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.shm import (
    CUDA_NOT_SUPPORTED,
    finish_http,
    mentions_shm,
    prepare_http,
)
from gshare.runtime.instance import protocol as P
from gshare.runtime.oip.header import HEADER_LENGTH, TRANSPORT_HTTP, wrap

PREFIX = "/v2/models/"
_HEADER_LENGTH = HEADER_LENGTH.encode()
_HEADERS = (b"content-length", b"content-encoding", _HEADER_LENGTH)


def infer_target(path: str) -> tuple[str, str | None] | None:
    """``(name, version)`` when ``path`` is an OIP infer route, else None."""
    if not (path.startswith(PREFIX) and path.endswith("/infer")):
        return None
    parts = path[len(PREFIX) : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


async def serve_infer(
    oip: OipService, scope: Scope, receive: Receive, send: Send, name: str, version: str | None
) -> None:
    """One OIP infer request (module doc); raises ``HttpError`` for the caller to answer."""
    if scope["method"] != "POST":
        raise HttpError(405, f"use POST to run inference, not {scope['method']}")
    v = oip.version_of(name, version)
    h = header_map(scope, _HEADERS)
    coding = h.get(b"content-encoding", b"identity").strip().lower()
    if coding != b"identity":
        raise HttpError(
            415, f"Content-Encoding {coding.decode(errors='replace')!r} is not supported"
        )
    chunks = await read_body(receive, oip.gw.max_body_bytes, h.get(b"content-length"))
    if chunks is None:
        return
    header_len = -1
    raw = h.get(_HEADER_LENGTH)
    if raw is not None:
        size = sum(len(c) for c in chunks)
        try:
            header_len = int(raw)
        except ValueError:
            header_len = -2
        if not 0 < header_len <= size:
            raise HttpError(
                400,
                f"Inference-Header-Content-Length {raw.decode(errors='replace')!r} must be the "
                f"length of the body's JSON part: between 1 and the body's {size} bytes",
            )
    if mentions_shm(chunks, header_len):
        payload, shm_outputs = prepare_http(oip.shm, chunks, header_len, v)
        del chunks
        # the answer's outputs go straight from the instance's lane into their regions
        async with oip.call_borrowed(name, P.ENC_OIP, payload, receive) as (renc, lent, m):
            renc, data = finish_http(renc, lent, shm_outputs)
            del lent
    else:
        renc, data, m = await oip.call(
            name, P.ENC_OIP, wrap(TRANSPORT_HTTP, header_len, v, chunks), receive
        )
    extra = timing_headers(m)
    if renc == P.ENC_OIP_BINARY:
        (json_len,) = struct.unpack_from("<I", data)
        extra.append((_HEADER_LENGTH, str(json_len).encode()))
        body = memoryview(data)[4:]  # no copy of the tensors
        await send_response(send, 200, body, b"application/octet-stream", extra)
    else:
        await send_response(send, 200, data, b"application/json", extra)


def mount_oip(app: FastAPI, oip: OipService) -> None:
    """The OIP metadata routes and Triton's extensions (module doc) on ``app``."""

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok, why = oip.server_ready()
        body: dict[str, object] = {"ready": ok}
        if not ok:
            body["error"] = f"not ready: {why}"
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v2")
    async def server_metadata() -> dict[str, object]:
        return oip.server_metadata()

    # /v2/models/stats before /v2/models/{name}: a function may not be named "stats" here.
    @app.get("/v2/models/stats")
    async def all_stats() -> dict[str, object]:
        return oip.statistics()

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, object]:
        return oip.model_metadata(name, version)

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> JSONResponse:
        ok, body = oip.model_ready(name, version)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str | None = None) -> dict[str, object]:
        return oip.model_config(name, version)

    @app.get("/v2/models/{name}/stats")
    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def model_stats(name: str, version: str | None = None) -> dict[str, object]:
        return oip.statistics(name, version)

    @app.post("/v2/repository/models/{name}/load")
    @app.post("/v2/repository/models/{name}/unload")
    async def repository_load(name: str) -> None:
        raise HttpError(
            501,
            "gshare loads and unloads models as functions: deploy with `gshare deploy` (POST "
            "/system/functions), remove with `gshare delete`; the repository's load/unload is "
            "not supported",
        )

    mount_shm(app, oip)

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> list[dict[str, object]]:
        body = await read_request(request, oip.gw.max_body_bytes)
        doc = parse_json(body) if body.strip() else {}
        if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
            raise HttpError(400, 'the body must be empty or {"ready": true|false}')
        return oip.repository_index(bool(doc.get("ready", False)))


def mount_shm(app: FastAPI, oip: OipService) -> None:
    """Triton's system shared-memory routes, and CUDA shared memory's refusal (module doc)."""

    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{name}/status")
    async def shm_status(name: str = "") -> list[dict[str, object]]:
        return [dict(r) for r in oip.shm.status(name)]

    @app.post("/v2/systemsharedmemory/region/{name}/register")
    async def shm_register(name: str, request: Request) -> dict[str, object]:
        doc = parse_json(await read_request(request, oip.gw.max_body_bytes))
        if not isinstance(doc, dict):
            raise HttpError(400, 'the body must be {"key": "/name", "offset": 0, "byte_size": N}')
        oip.shm.register(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))
        return {}

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{name}/unregister")
    async def shm_unregister(name: str = "") -> dict[str, object]:
        oip.shm.unregister(name)
        return {}

    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/{name}/status")
    @app.post("/v2/cudasharedmemory/region/{name}/register")
    @app.post("/v2/cudasharedmemory/unregister")
    @app.post("/v2/cudasharedmemory/region/{name}/unregister")
    async def cuda_shm(name: str = "") -> None:
        raise HttpError(400, CUDA_NOT_SUPPORTED)


__all__ = ["PREFIX", "infer_target", "mount_oip", "mount_shm", "serve_infer"]
