"""Server-sent events for the gateway's streamed answers (raw ASGI), shared by the
OpenAI-compatible routes (``gateway.openai_api``) and the OIP generate routes
(``gateway.generate_http``).

Who calls it: those routes, once the generation's first event arrived (an error before it is
an ordinary 4xx/5xx answer): ``SseWriter.start`` sends the headers, ``event`` one ``data:``
line per JSON document, ``done`` the stream's end. What must hold: after ``start`` nothing but
events is sent; a client that went away makes ``event`` return False (the caller then stops
and its generation is cancelled) instead of raising.
"""

from __future__ import annotations

import logging

import orjson
from starlette.types import Send

log = logging.getLogger("gshare.gateway")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class SseWriter:
    """One event stream on an ASGI ``send`` (module doc)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.gone = False

    async def start(self) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        self.started = True

    async def raw(self, data: bytes) -> bool:
        if self.gone:
            return False
        try:
            await self.send({"type": "http.response.body", "body": data, "more_body": True})
        except Exception as e:  # the client went away (the server's disconnect error)
            log.debug("event stream closed by its client: %s", e)
            self.gone = True
        return not self.gone

    async def event(self, doc: object) -> bool:
        return await self.raw(b"data: " + orjson.dumps(doc) + b"\n\n")

    async def done(self, tail: bytes = b"") -> None:
        if tail:
            await self.raw(tail)
        if not self.gone:
            try:
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:
                self.gone = True


__all__ = ["SSE_HEADERS", "SseWriter"]
