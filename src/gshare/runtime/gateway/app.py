"""The gateway's HTTP app: the raw-ASGI fast path (``InvokeFastPath``: ``POST
/function/{name}`` and the OIP infer routes) in front of a FastAPI app made of mounted parts —
the Open Inference Protocol v2 and Triton's extensions (``oip_http.mount_oip``),
``/metrics``, the OpenFaaS-style control API ``/system/...`` behind its bearer token
(``mount_control_api``) and the status page (``ui.mount_status_page``). Every 4xx and 5xx,
whoever raises it (a route, FastAPI's routing: unknown paths, wrong methods, bad query
parameters; the fast path), is answered ``{"error": message}``.

Who uses it: the server builds it with ``build_app(gateway, control_api, token, oip=...)``;
requests go to the ``Gateway`` (``router``), protocol requests through the ``OipService``
(``oip_service``, shared with the gRPC server), control calls to the ``ControlPlane``
(``runtime.control.api``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Lifespan, Receive, Scope, Send

from gshare.runtime.gateway.asgi import (
    header_map,
    parse_json,
    read_body,
    read_request,
    send_error,
    send_response,
    timing_headers,
)
from gshare.runtime.gateway.control_plane import ControlPlane
from gshare.runtime.gateway.errors import HttpError, error_response, status_of
from gshare.runtime.gateway.generate_http import generate_target, serve_generate
from gshare.runtime.gateway.generation import EngineCollector
from gshare.runtime.gateway.oip_http import infer_target, mount_oip, serve_infer
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.openai_api import PREFIX as OPENAI_PREFIX
from gshare.runtime.gateway.openai_api import serve_openai
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.ui import mount_status_page
from gshare.runtime.instance import protocol as P

log = logging.getLogger("gshare.gateway")

MAX_LOG_TAIL = 100_000
"""Most lines ``/system/logs`` returns at once."""


def _is_json(content_type: str) -> bool:
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct == "application/json" or ct.endswith("+json")


def body_encoding(content_type: bytes | str | None, body: bytes) -> int:
    """How an invocation body is sent to the instance: JSON when the Content-Type says so
    (``HttpError`` 400 when it is malformed), or when there is no Content-Type and the body is
    a JSON object or array (raw bytes read as a float32 tensor would answer garbage); raw
    bytes otherwise."""
    if content_type is None:
        return P.ENC_JSON if _looks_like_json(body) else P.ENC_RAW
    ct = content_type.decode("latin-1") if isinstance(content_type, bytes) else content_type
    if _is_json(ct):
        parse_json(body)
        return P.ENC_JSON
    return P.ENC_RAW


def _looks_like_json(body: bytes) -> bool:
    """A body sent without a Content-Type that is a JSON object or array."""
    head = body[:64].lstrip()
    if not head or head[:1] not in (b"{", b"["):
        return False
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def build_app(
    gw: Gateway,
    control: ControlPlane,
    token: str,
    *,
    lifespan: Lifespan[FastAPI] | None = None,
    oip: OipService | None = None,
) -> InvokeFastPath:
    """The ASGI app: ``InvokeFastPath`` in front of ``build_fastapi``'s app (module doc);
    ``oip`` is the protocol service the gRPC server shares (one is made when None)."""
    oip = oip or OipService(gw, control)
    return InvokeFastPath(build_fastapi(gw, control, token, lifespan=lifespan, oip=oip), gw, oip)


def build_fastapi(
    gw: Gateway,
    control: ControlPlane,
    token: str,
    *,
    lifespan: Lifespan[FastAPI] | None = None,
    oip: OipService | None = None,
) -> FastAPI:
    """The FastAPI app behind ``InvokeFastPath``: error handlers, then one ``mount_*`` call
    per part of the API."""
    app = FastAPI(
        title="gshare", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    install_error_handlers(app)
    oip = oip or OipService(gw, control)
    require_token = token_check(token)
    mount_oip(app, oip)
    mount_metrics(app, gw)
    mount_control_api(app, gw, control, require_token, oip)
    mount_status_page(app, getattr(control, "status_view", None), require_token)
    return app


def install_error_handlers(app: FastAPI) -> None:
    """``{"error": message}`` for every error answer (module doc)."""

    @app.exception_handler(HttpError)
    async def _http_error(_: Request, e: HttpError) -> JSONResponse:
        return error_response(e.status, e.message, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif e.status_code == 405:
            allowed = (e.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}" + (
                f" (allowed: {allowed})" if allowed else ""
            )
        else:
            message = str(e.detail)
        r = error_response(e.status_code, message)
        r.headers.update(e.headers or {})
        return r

    @app.exception_handler(RequestValidationError)
    async def _bad_parameters(_: Request, e: RequestValidationError) -> JSONResponse:
        problems = []
        for err in e.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "path"))
            problems.append(f"{where}: {err.get('msg', 'invalid')}")
        return error_response(400, "bad request: " + "; ".join(problems))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(e).__name__}: {e}")


def token_check(token: str) -> Callable[[Request], None]:
    """The control API's check: ``require(request)`` raises ``HttpError`` 401 unless the
    request carries ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    def require(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(got, expected):
            if got:  # a token was given, and it is not this server's
                raise HttpError(
                    401,
                    "the control API refused this token: it is not this server's (the token "
                    "is in the server's state directory, file 'token')",
                )
            raise HttpError(
                401,
                "the control API needs 'Authorization: Bearer <token>' (the token is in the "
                "server's state directory, file 'token')",
            )

    return require


def mount_metrics(app: FastAPI, gw: Gateway) -> None:
    """``/metrics`` (Prometheus; no token) and ``/healthz``."""

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")


def mount_control_api(
    app: FastAPI,
    gw: Gateway,
    control: ControlPlane,
    require_token: Callable[[Request], None],
    oip: OipService,
) -> None:
    """The OpenFaaS-style control API ``/system/...`` (bearer token)."""

    @app.get("/system/functions")
    async def list_functions(request: Request) -> list[dict[str, object]]:
        require_token(request)
        return control.list_functions()

    async def deploy_or_update(request: Request, *, update: bool) -> JSONResponse:
        require_token(request)
        body = await read_request(request, gw.max_body_bytes)
        out = await control.deploy(body, request.headers.get("content-type", ""), update=update)
        return JSONResponse(out, status_code=200 if update else 201)

    @app.post("/system/functions")
    async def deploy(request: Request) -> JSONResponse:
        return await deploy_or_update(request, update=False)

    @app.put("/system/functions")
    async def update(request: Request) -> JSONResponse:
        return await deploy_or_update(request, update=True)

    async def delete_function(name: str) -> JSONResponse:
        await control.delete(name)
        oip.forget(name)
        return JSONResponse({"deleted": name})

    @app.delete("/system/functions")
    async def delete(request: Request) -> JSONResponse:
        require_token(request)
        body = await read_request(request, gw.max_body_bytes)
        doc = parse_json(body or b"{}")
        name = doc.get("functionName") if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name:
            raise HttpError(400, 'the body must be {"functionName": "<name>"}')
        return await delete_function(name)

    @app.delete("/system/functions/{name}")
    async def delete_named(name: str, request: Request) -> JSONResponse:
        require_token(request)
        return await delete_function(name)

    @app.get("/system/workflows")
    async def list_workflows(request: Request) -> list[dict[str, object]]:
        require_token(request)
        return control.list_workflows()

    async def deploy_workflow(request: Request, *, update: bool) -> JSONResponse:
        require_token(request)
        body = await read_request(request, gw.max_body_bytes)
        ctype = request.headers.get("content-type", "")
        out = await control.deploy_workflow(body, ctype, update=update)
        return JSONResponse(out, status_code=200 if update else 201)

    @app.post("/system/workflows")
    async def create_workflow(request: Request) -> JSONResponse:
        return await deploy_workflow(request, update=False)

    @app.put("/system/workflows")
    async def update_workflow(request: Request) -> JSONResponse:
        return await deploy_workflow(request, update=True)

    @app.delete("/system/workflows/{name}")
    async def delete_workflow(name: str, request: Request) -> JSONResponse:
        require_token(request)
        await control.delete_workflow(name)
        return JSONResponse({"deleted": name})

    @app.post("/workflow/{name}")
    async def run_workflow(name: str, request: Request) -> Response:
        body = await read_request(request, gw.max_body_bytes)
        enc = body_encoding(request.headers.get("content-type"), body)
        renc, data = await control.run_workflow(name, body, enc, oip.call)
        media = "application/json" if renc == P.ENC_JSON else "application/octet-stream"
        return Response(data, media_type=media)

    @app.get("/system/function/{name}")
    async def function_status(name: str, request: Request) -> dict[str, object]:
        require_token(request)
        return control.function_status(name)

    @app.get("/system/function/{name}/instances/{instance_id}/stats")
    async def instance_stats(name: str, instance_id: str, request: Request) -> dict[str, object]:
        require_token(request)
        return await control.instance_stats(name, instance_id)

    @app.get("/system/logs")
    async def logs(request: Request, name: str = "", tail: int = 100) -> dict[str, object]:
        require_token(request)
        if not name:
            raise HttpError(400, "query parameter 'name' is required")
        if tail < 0:
            raise HttpError(400, f"tail must be >= 0, got {tail}")
        if tail > MAX_LOG_TAIL:
            raise HttpError(400, f"tail must be <= {MAX_LOG_TAIL}, got {tail}")
        return {"name": name, "lines": control.logs(name, tail)}

    @app.post("/system/profile/{name}")
    async def profile(name: str, request: Request) -> JSONResponse:
        require_token(request)
        body = await read_request(request, gw.max_body_bytes)
        params = parse_json(body or b"{}")
        if not isinstance(params, dict):
            raise HttpError(400, "the body must be a JSON object")
        return JSONResponse(await control.start_profile(name, params), status_code=202)

    @app.get("/system/profile/{name}")
    async def profile_status(name: str, request: Request) -> dict[str, object]:
        require_token(request)
        return control.profile_status(name)

    @app.get("/system/info")
    async def info(request: Request) -> dict[str, object]:
        require_token(request)
        return control.info()


class InvokeFastPath:
    """ASGI wrapper that serves the invocation hot paths itself — ``POST /function/{name}``,
    the OIP infer routes (``oip_http.serve_infer``) and the generative routes (the OIP
    generate extension, ``generate_http``, and the OpenAI-compatible ``/v1/...``,
    ``openai_api``) — and passes everything else to the FastAPI app: they skip FastAPI's
    routing, request and response objects (about half of the gateway's CPU per request on a
    trivial function), and stream their answers as they come."""

    PREFIX = "/function/"

    def __init__(self, app: ASGIApp, gw: Gateway, oip: OipService) -> None:
        self.app = app
        self.gw = gw
        self.oip = oip
        gw.metrics.add_engine_collector(EngineCollector(lambda: engine_stats(gw)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith(self.PREFIX):
                await self._guard(
                    path[len(self.PREFIX) :], self._invoke(scope, receive, send), send
                )
                return
            if path.startswith(OPENAI_PREFIX):
                await serve_openai(self.gw, scope, receive, send)
                return
            gen = generate_target(path)
            if gen is not None:
                name, version, stream = gen
                work = serve_generate(self.oip, scope, receive, send, name, version, stream)
                await self._guard(name, work, send)
                return
            target = infer_target(path)
            if target is not None:
                name, version = target
                await self._guard(
                    name, serve_infer(self.oip, scope, receive, send, name, version), send
                )
                return
        await self.app(scope, receive, send)

    async def _guard(self, name: str, work: Awaitable[None], send: Send) -> None:
        """Run a hot-path request; an ``HttpError`` becomes the error answer (and a request
        rejected before it was queued is still counted in the metrics)."""
        try:
            await work
        except HttpError as e:
            if not e.recorded and name in self.gw.routes:
                self.gw.metrics.requests.labels(name, str(e.status)).inc()
            extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in e.headers]
            if e.status == 405:
                extra.append((b"allow", b"POST"))
            await send_error(send, e.status, e.message, extra)

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        name = scope["path"][len(self.PREFIX) :]
        if scope["method"] != "POST":
            raise HttpError(405, f"use POST to invoke a function, not {scope['method']}")
        if not gw.is_public(name):
            raise HttpError(404, f"function {name!r} is not deployed")
        h = header_map(scope, (b"content-type", b"content-length"))
        chunks = await read_body(receive, gw.max_body_bytes, h.get(b"content-length"))
        if chunks is None:
            return
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        enc = body_encoding(h.get(b"content-type"), body)
        p = gw.submit(name, P.OP_INVOKE, enc, body)
        try:
            status, renc, data, m = await gw.wait(p, receive)
        except HttpError as e:
            gw.record(name, e.status, p, None)
            self.oip.stats.observe(name, e.status, time.perf_counter() - p.arrived, None)
            e.recorded = True
            raise
        code = status_of(status)
        gw.record(name, code, p, m)
        self.oip.stats.observe(name, code, time.perf_counter() - p.arrived, m)
        if code != 200:
            err = HttpError(code, data.decode("utf-8", errors="replace"))
            err.recorded = True
            raise err
        media = b"application/json" if renc == P.ENC_JSON else b"application/octet-stream"
        await send_response(send, 200, data, media, timing_headers(m))


def engine_stats(gw: Gateway) -> list[tuple[str, dict[str, float]]]:
    """The last engine counters of every generative instance connection, by function."""
    return [
        (name, ch.engine_stats)
        for name, r in gw.routes.items()
        if r.gen is not None
        for ch in r.channels.values()
        if ch.engine_stats
    ]


__all__ = [
    "ControlPlane",
    "InvokeFastPath",
    "build_app",
    "build_fastapi",
    "install_error_handlers",
    "mount_control_api",
    "mount_metrics",
    "parse_json",
    "read_request",
    "token_check",
]
