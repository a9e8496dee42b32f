"""HTTP helpers of the gateway: request bodies under the size limit and JSON bodies for the
FastAPI routes (``read_request``, ``parse_json``), and the raw-ASGI side of the hot paths
(``app.InvokeFastPath``: ``POST /function/{name}`` and the OIP infer routes), which skip
FastAPI's routing, request and response objects (``read_body``, ``send_response``,
``send_error``: the one error shape ``{"error": message}``)."""

from __future__ import annotations

import orjson
from fastapi import Request
from starlette.types import Receive, Scope, Send

from gshare.runtime.gateway.errors import HttpError


async def read_request(request: Request, limit: int) -> bytes:
    """The body of a FastAPI request, or ``HttpError`` 413 past ``limit`` bytes (declared or
    streamed)."""
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


def parse_json(body: bytes) -> object:
    """The JSON document in ``body``, or ``HttpError`` 400 naming what is malformed."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise HttpError(400, f"malformed JSON body: {e}") from None


def header_map(scope: Scope, names: tuple[bytes, ...]) -> dict[bytes, bytes]:
    """The values of the request headers named in ``names`` (lower case) that are present."""
    return {k: v for k, v in scope["headers"] if k in names}


async def read_body(receive: Receive, limit: int, declared: bytes | None) -> list[bytes] | None:
    """The request body as its chunks (not joined: the caller joins them with whatever it
    prepends, one copy), ``HttpError`` 413 past ``limit`` bytes (declared or streamed), 400 for
    a bad ``Content-Length``; None when the client disconnected."""
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise HttpError(
                400, f"bad Content-Length header {declared.decode(errors='replace')!r}"
            ) from None
        if n > limit:
            raise HttpError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks


async def read_json_body(scope: Scope, receive: Receive, limit: int) -> tuple[object] | None:
    """The request's JSON body, parsed, in a 1-tuple (any JSON value, ``null`` included);
    None when the client disconnected; ``HttpError`` as ``read_body``, or 400 naming what is
    malformed (the generate routes: OpenAI's and the OIP's)."""
    h = header_map(scope, (b"content-length",))
    chunks = await read_body(receive, limit, h.get(b"content-length"))
    if chunks is None:
        return None
    try:
        return (orjson.loads(b"".join(chunks)),)
    except orjson.JSONDecodeError as e:
        raise HttpError(400, f"the body is not valid JSON: {e}") from None


async def send_response(
    send: Send,
    status: int,
    body: bytes | memoryview,
    ctype: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """The gateway's one error shape: ``{"error": message}``."""
    await send_response(send, status, orjson.dumps({"error": message}), b"application/json", extra)


def timing_headers(m: tuple[float, float, float, int] | None) -> list[tuple[bytes, bytes]]:
    """The instance's measurements of a request as response headers: the batch it ran in, its
    compute time, its wait for the time token and its wait in the instance's queue (ms). What
    the client measured beyond their sum is the platform's: the HTTP exchange, the gateway, the
    hop to the instance and any wait for an instance at the gateway."""
    if m is None:
        return []
    return [
        (b"x-gshare-batch", str(m[3]).encode()),
        (b"x-gshare-queue-ms", f"{m[0]:.3f}".encode()),
        (b"x-gshare-exec-ms", f"{m[2]:.3f}".encode()),
        (b"x-gshare-token-wait-ms", f"{m[1]:.3f}".encode()),
    ]


__all__ = [
    "header_map",
    "parse_json",
    "read_body",
    "read_request",
    "send_error",
    "send_response",
    "timing_headers",
]
