"""The Open Inference Protocol's generate extension (Triton's): ``POST
/v2/models/{name}[/versions/{v}]/generate`` (one JSON answer) and ``.../generate_stream``
(server-sent events, one per chunk) for generative functions.

Who calls it: ``app.InvokeFastPath`` routes those paths here (``generate_target``) and answers
an ``HttpError`` as the gateway's ``{"error": message}`` (the OIP's error shape). The request
is a JSON object: ``text_input`` (the prompt, required), ``parameters`` (an object:
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``; the same keys are also taken at
the top level, as Triton's generate examples send them), optional ``id`` and ``stream``
(ignored: the route decides). Any other key is a 400. The answer: ``{"model_name",
"model_version", "text_output", "finish_reason", "usage"}`` (``id`` echoed); each event of
``generate_stream`` the same with the new text as ``text_output`` and ``batch``, the number of
sequences in the decode step that produced it (``finish_reason`` and ``usage`` instead in the
last); an error after the stream began is one event ``{"error": message}``.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from starlette.types import Receive, Scope, Send

from gshare.runtime.gateway.asgi import read_json_body, send_response
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.sse import SseWriter
from gshare.runtime.gateway.streams import (
    Done,
    Piece,
    check_parameters,
    collect,
    start_generation,
)

PREFIX: Final = "/v2/models/"
PARAMETER_KEYS: Final = frozenset(
    {"max_tokens", "temperature", "top_p", "seed", "stop", "ignore_eos"}
)
TOP_LEVEL_KEYS: Final = PARAMETER_KEYS | {"text_input", "parameters", "id", "stream"}


def generate_target(path: str) -> tuple[str, str | None, bool] | None:
    """``(name, version, streamed)`` when ``path`` is a generate route, else None."""
    if not path.startswith(PREFIX):
        return None
    if path.endswith("/generate_stream"):
        rest, stream = path[len(PREFIX) : -len("/generate_stream")], True
    elif path.endswith("/generate"):
        rest, stream = path[len(PREFIX) : -len("/generate")], False
    else:
        return None
    parts = rest.split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None, stream
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2], stream
    return None


def _request(doc: object) -> tuple[str, dict[str, Any], object]:
    if not isinstance(doc, dict):
        raise HttpError(
            400, 'the body must be a JSON object {"text_input": "...", "parameters": {...}}'
        )
    unknown = sorted(set(doc) - TOP_LEVEL_KEYS)
    if unknown:
        raise HttpError(
            400,
            f"unknown field {unknown[0]!r}: a generate request has text_input, parameters "
            f"({', '.join(sorted(PARAMETER_KEYS))}) and optionally id",
        )
    text = doc.get("text_input")
    if not isinstance(text, str) or not text:
        raise HttpError(400, "text_input is required: the prompt, a non-empty string")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise HttpError(400, "parameters must be a JSON object")
    merged = {**{k: doc[k] for k in PARAMETER_KEYS if k in doc}, **params}
    unknown = sorted(set(merged) - PARAMETER_KEYS - {"stream"})
    if unknown:
        raise HttpError(
            400, f"unknown parameter {unknown[0]!r}: one of {', '.join(sorted(PARAMETER_KEYS))}"
        )
    return text, check_parameters(merged), doc.get("id")


async def serve_generate(
    oip: OipService,
    scope: Scope,
    receive: Receive,
    send: Send,
    name: str,
    version: str | None,
    stream: bool,
) -> None:
    """One generate request (module doc); raises ``HttpError`` for the caller to answer."""
    if scope["method"] != "POST":
        raise HttpError(405, f"use POST to generate, not {scope['method']}")
    v = oip.version_of(name, version)
    doc = await read_json_body(scope, receive, oip.gw.max_body_bytes)
    if doc is None:
        return
    text, params, rid = _request(doc[0])
    gen = start_generation(oip.gw, name, text, params, receive)
    base: dict[str, object] = {"model_name": name, "model_version": str(v)}
    if rid is not None:
        base["id"] = rid
    if not stream:
        out, done = await collect(gen)
        body = orjson.dumps({**base, "text_output": out, **_end(done)})
        await send_response(send, 200, body, b"application/json")
        return
    events = gen.events()
    first = await anext(events)  # an error before the first event is an ordinary answer
    sse = SseWriter(send)
    await sse.start()
    try:
        ev: Piece | Done | None = first
        while ev is not None:
            last = isinstance(ev, Done)
            more = _end(ev) if isinstance(ev, Done) else {"batch": ev.batch}
            if (ev.text or last) and not await sse.event({**base, "text_output": ev.text, **more}):
                return
            if last:
                break
            ev = await anext(events, None)
    except HttpError as e:
        await sse.event({"error": e.message})
    finally:
        gen.close()
        await sse.done()


def _end(done: Done) -> dict[str, object]:
    return {
        "finish_reason": done.finish_reason,
        "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens},
    }


__all__ = ["generate_target", "serve_generate"]
