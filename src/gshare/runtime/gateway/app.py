"""The gateway's HTTP app: FastAPI routes (OpenFaaS-style ``/function`` and ``/system``, Open
Inference Protocol v2 ``/v2``, ``/metrics``), the bearer-token check of the control API, and
the raw-ASGI fast path for ``POST /function/{name}`` (``InvokeFastPath``).

Who uses it: the server builds it with ``build_app(gateway, control_api, token)``; requests go
to the ``Gateway`` (``router``), control calls to the ``ControlPlane`` (``runtime.control.api``).
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import (
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gshare.runtime.gateway.errors import HttpError, error_response, status_of
from gshare.runtime.gateway.oip import OipError, check_infer_request
from gshare.runtime.gateway.router import Gateway, Pending
from gshare.runtime.instance import protocol as P

log = logging.getLogger("gshare.gateway")

# -- the HTTP app --------------------------------------------------------------------------------


class ControlPlane:
    """What the HTTP layer needs from the controller (implemented by ``Controller``)."""

    async def deploy(
        self, body: bytes, content_type: str, *, update: bool | None
    ) -> dict[str, Any]:
        raise NotImplementedError

    async def delete(self, name: str) -> None:
        raise NotImplementedError

    def list_functions(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def function_status(self, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def logs(self, name: str, tail: int) -> list[str]:
        raise NotImplementedError

    async def start_profile(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def profile_status(self, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or ``HttpError`` 413 past ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise HttpError(400, f"bad Content-Length header {declared!r}") from None
        if n > limit:
            raise HttpError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes")
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """The JSON document in ``body``, or ``HttpError`` 400 naming what is malformed."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"malformed JSON body: {e}") from None


def _is_json(content_type: str) -> bool:
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct == "application/json" or ct.endswith("+json")


def build_app(gw: Gateway, control: ControlPlane, token: str, *, lifespan: Any = None) -> Any:
    """The ASGI app: ``InvokeFastPath`` for ``POST /function/{name}`` in front of the FastAPI
    app with the OpenFaaS-style control routes, OIP v2 and ``/metrics`` (module doc)."""
    return InvokeFastPath(build_fastapi(gw, control, token, lifespan=lifespan), gw)


def build_fastapi(
    gw: Gateway, control: ControlPlane, token: str, *, lifespan: Any = None
) -> FastAPI:
    """The FastAPI app behind ``InvokeFastPath``."""
    app = FastAPI(
        title="gshare", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    expected = f"Bearer {token}".encode()

    @app.exception_handler(HttpError)
    async def _http_error(_: Request, e: HttpError) -> JSONResponse:
        return error_response(e.status, e.message)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(e).__name__}: {e}")

    def require_token(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(got, expected):
            raise HttpError(
                401,
                "the control API needs 'Authorization: Bearer <token>' (the token is in the "
                "server's state directory, file 'token')",
            )

    async def run(
        function: str, op: int, enc: int, payload: bytes
    ) -> tuple[Pending, int, int, bytes, Any]:
        p = gw.submit(function, op, enc, payload)
        try:
            status, renc, data, m = await gw.wait(p)
        except HttpError as e:
            gw.record(function, e.status, p, None)
            raise
        code = status_of(status)
        gw.record(function, code, p, m)
        return p, code, renc, data, m

    # -- Open Inference Protocol v2 --

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = control.ready() and not gw.closing
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        from gshare import __version__

        return {"name": "gshare", "version": __version__, "extensions": []}

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> dict[str, Any]:
        st = control.function_status(name)  # 404 if unknown
        return {
            "name": name,
            "versions": [str(st.get("version", 1))],
            "platform": "gshare/" + (st["spec"].get("model") or "handler"),
            "inputs": st.get("inputs") or [],
            "outputs": [],
        }

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> JSONResponse:
        st = control.function_status(name)
        ok = st["start_error"] is None
        body = {"name": name, "ready": ok, "instances_ready": st["available_replicas"]}
        if not ok:
            body["error"] = st["start_error"]
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        if name not in gw.routes:
            raise HttpError(404, f"model {name!r} is not deployed")
        body = await read_body(request, gw.max_body_bytes)
        doc = parse_json(body)
        try:
            check_infer_request(doc)
        except OipError as e:
            raise HttpError(400, str(e)) from None
        _, code, _renc, data, m = await run(name, P.OP_INVOKE, P.ENC_OIP, body)
        if code != 200:
            raise HttpError(code, data.decode("utf-8", errors="replace"))
        return Response(content=data, media_type="application/json", headers=_timing_headers(m))

    # -- metrics (no token: scraped by Prometheus) --

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- control API (bearer token) --

    @app.get("/system/functions")
    async def list_functions(request: Request) -> list[dict[str, Any]]:
        require_token(request)
        return control.list_functions()

    async def deploy_or_update(request: Request, *, update: bool) -> JSONResponse:
        require_token(request)
        body = await read_body(request, gw.max_body_bytes)
        out = await control.deploy(body, request.headers.get("content-type", ""), update=update)
        return JSONResponse(out, status_code=200 if update else 201)

    @app.post("/system/functions")
    async def deploy(request: Request) -> JSONResponse:
        return await deploy_or_update(request, update=False)

    @app.put("/system/functions")
    async def update(request: Request) -> JSONResponse:
        return await deploy_or_update(request, update=True)

    @app.delete("/system/functions")
    async def delete(request: Request) -> JSONResponse:
        require_token(request)
        body = await read_body(request, gw.max_body_bytes)
        doc = parse_json(body or b"{}")
        name = doc.get("functionName") if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name:
            raise HttpError(400, 'the body must be {"functionName": "<name>"}')
        await control.delete(name)
        return JSONResponse({"deleted": name})

    @app.delete("/system/functions/{name}")
    async def delete_named(name: str, request: Request) -> JSONResponse:
        require_token(request)
        await control.delete(name)
        return JSONResponse({"deleted": name})

    @app.get("/system/function/{name}")
    async def function_status(name: str, request: Request) -> dict[str, Any]:
        require_token(request)
        return control.function_status(name)

    @app.get("/system/logs")
    async def logs(request: Request, name: str = "", tail: int = 100) -> dict[str, Any]:
        require_token(request)
        if not name:
            raise HttpError(400, "query parameter 'name' is required")
        if tail < 0:
            raise HttpError(400, f"tail must be >= 0, got {tail}")
        return {"name": name, "lines": control.logs(name, tail)}

    @app.post("/system/profile/{name}")
    async def profile(name: str, request: Request) -> JSONResponse:
        require_token(request)
        body = await read_body(request, gw.max_body_bytes)
        params = parse_json(body or b"{}")
        if not isinstance(params, dict):
            raise HttpError(400, "the body must be a JSON object")
        return JSONResponse(await control.start_profile(name, params), status_code=202)

    @app.get("/system/profile/{name}")
    async def profile_status(name: str, request: Request) -> dict[str, Any]:
        require_token(request)
        return control.profile_status(name)

    @app.get("/system/info")
    async def info(request: Request) -> dict[str, Any]:
        require_token(request)
        return control.info()

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app


class InvokeFastPath:
    """ASGI wrapper that serves ``POST /function/{name}`` itself and passes everything else
    to the FastAPI app: the invocation hot path skips FastAPI's routing, request and response
    objects (about half of the gateway's CPU per request on a trivial function)."""

    PREFIX = "/function/"

    def __init__(self, app: Any, gw: Gateway) -> None:
        self.app = app
        self.gw = gw

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.PREFIX):
            try:
                await self._invoke(scope, receive, send)
            except HttpError as e:
                name = scope["path"][len(self.PREFIX) :]
                if not e.recorded and name in self.gw.routes:  # rejected before it was queued
                    self.gw.metrics.requests.labels(name, str(e.status)).inc()
                await self._send(
                    send, e.status, json.dumps({"error": e.message}).encode(), b"application/json"
                )
            return
        await self.app(scope, receive, send)

    @staticmethod
    async def _send(
        send: Any,
        status: int,
        body: bytes,
        ctype: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        if extra:
            headers.extend(extra)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _invoke(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        gw = self.gw
        name = scope["path"][len(self.PREFIX) :]
        if scope["method"] != "POST":
            raise HttpError(405, f"use POST to invoke a function, not {scope['method']}")
        if name not in gw.routes or "/" in name:
            raise HttpError(404, f"function {name!r} is not deployed")
        ctype = b""
        declared: int | None = None
        for k, v in scope["headers"]:
            if k == b"content-type":
                ctype = v
            elif k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    raise HttpError(
                        400, f"bad Content-Length header {v.decode(errors='replace')!r}"
                    ) from None
        limit = gw.max_body_bytes
        if declared is not None and declared > limit:
            raise HttpError(
                413, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
        body = b""
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        enc = P.ENC_RAW
        if _is_json(ctype.decode("latin-1")):
            parse_json(body)
            enc = P.ENC_JSON
        p = gw.submit(name, P.OP_INVOKE, enc, body)
        try:
            status, renc, data, m = await gw.wait(p)
        except HttpError as e:
            gw.record(name, e.status, p, None)
            e.recorded = True
            raise
        code = status_of(status)
        gw.record(name, code, p, m)
        if code != 200:
            err = HttpError(code, data.decode("utf-8", errors="replace"))
            err.recorded = True
            raise err
        media = b"application/json" if renc == P.ENC_JSON else b"application/octet-stream"
        await self._send(send, 200, data, media, [(b"x-gshare-batch", str(m[3]).encode())])


def _timing_headers(m: tuple[float, float, float, int] | None) -> dict[str, str]:
    if m is None:
        return {}
    return {
        "x-gshare-batch": str(m[3]),
        "x-gshare-exec-ms": f"{m[2]:.3f}",
        "x-gshare-token-wait-ms": f"{m[1]:.3f}",
    }


__all__ = ["ControlPlane", "InvokeFastPath", "build_app", "build_fastapi", "read_body"]
