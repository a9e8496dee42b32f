"""The OpenAI-compatible API of generative functions: ``POST /v1/completions``, ``POST
/v1/chat/completions`` (``stream: true``: server-sent events in OpenAI's chunk format, ending
with ``data: [DONE]``; else one JSON answer with ``usage``) and ``GET /v1/models``; the
official ``openai`` client works unchanged (``base_url=<server>/v1``, any API key).

Who calls it: ``app.InvokeFastPath`` hands every ``/v1/...`` request to ``serve_openai`` (raw
ASGI). A request's ``model`` is the function's name; its prompt and parameters become one
generation (``gateway.streams``). Chat messages become one prompt (``chat_prompt``: a line
``role: content`` per message, then ``assistant:``), since the built-in models have no chat
template.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the HTTP
status: unknown fields, wrong types and values out of range (400, ``param`` naming the field),
an unknown model (404, ``model_not_found``), a function that is not generative (400), overload
(429), the instance's errors (4xx/5xx). An error after a stream began is one ``data:`` event
with that shape, and the stream ends without ``[DONE]``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
from starlette.types import Receive, Scope, Send

from gshare.runtime.gateway.asgi import read_json_body, send_response
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.sse import SseWriter
from gshare.runtime.gateway.streams import (
    BadParameter,
    Done,
    Piece,
    check_parameters,
    collect,
    start_generation,
)

PREFIX: Final = "/v1/"
COMMON_FIELDS: Final = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
     "user", "n", "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos"}
)  # fmt: skip
COMPLETION_FIELDS: Final = COMMON_FIELDS | {"prompt", "echo", "logprobs", "best_of", "suffix"}
CHAT_FIELDS: Final = COMMON_FIELDS | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
}
ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
_ids = itertools.count(1)


def _error_doc(e: HttpError) -> dict[str, object]:
    code: str | None = None
    if e.status == 404:
        kind, code = "invalid_request_error", "model_not_found"
    elif e.status == 429:
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    elif e.status < 500:
        kind = "invalid_request_error"
    else:
        kind = "server_error"
    param = e.param if isinstance(e, BadParameter) else None
    return {"error": {"message": e.message, "type": kind, "param": param, "code": code}}


async def send_openai_error(send: Send, e: HttpError) -> None:
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in e.headers]
    await send_response(send, e.status, orjson.dumps(_error_doc(e)), b"application/json", extra)


async def serve_openai(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """One ``/v1/...`` request (module doc); every error answered in OpenAI's shape."""
    path, method = scope["path"], scope["method"]
    try:
        if path in ("/v1/models", "/v1/models/"):
            if method != "GET":
                raise HttpError(405, f"use GET on {path}, not {method}")
            await send_response(send, 200, orjson.dumps(list_models(gw)), b"application/json")
            return
        if path.startswith("/v1/models/") and method == "GET":
            name = path[len("/v1/models/") :]
            r = gw.routes.get(name)
            if r is None or r.internal or r.gen is None:
                raise HttpError(404, f"the model {name!r} does not exist")
            await send_response(send, 200, orjson.dumps(_model(name)), b"application/json")
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            raise HttpError(404, f"no route {method} {path}")
        if method != "POST":
            raise HttpError(405, f"use POST on {path}, not {method}")
        body = await read_json_body(scope, receive, gw.max_body_bytes)
        if body is None:
            return
        doc = body[0]
        if not isinstance(doc, dict):
            raise HttpError(400, "the body must be a JSON object")
        chat = path == "/v1/chat/completions"
        await _complete(gw, doc, chat, receive, send)
    except HttpError as e:
        await send_openai_error(send, e)


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "gshare"}


def list_models(gw: Gateway) -> dict[str, object]:
    """The deployed generative functions, as OpenAI's model list."""
    names = sorted(n for n, r in gw.routes.items() if r.gen is not None and not r.internal)
    return {"object": "list", "data": [_model(n) for n in names]}


def _unknown(doc: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for k in doc:
        if k not in allowed:
            raise BadParameter(k, f"Unrecognized request argument supplied: {k}")


def _only(doc: Mapping[str, Any], key: str, ok: Callable[[Any], bool], what: str) -> None:
    if key in doc and doc[key] is not None and not ok(doc[key]):
        raise BadParameter(
            key, f"{key}: only {what} is supported, got {orjson.dumps(doc[key])[:80].decode()}"
        )


def _common(doc: Mapping[str, Any]) -> tuple[str, bool, bool, dict[str, Any]]:
    """model, stream, include_usage and the decoding parameters of a request."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BadParameter("model", "model must be the name of a deployed generative function")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadParameter("stream", "stream must be true or false")
    opts = doc.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise BadParameter("stream_options", 'stream_options must be {"include_usage": bool}')
    usage = bool((opts or {}).get("include_usage", False))
    _only(doc, "n", lambda v: v == 1, "n = 1")
    for k in ("presence_penalty", "frequency_penalty"):
        _only(doc, k, lambda v: v == 0, f"{k} = 0")
    _only(doc, "logit_bias", lambda v: v == {}, "an empty logit_bias")
    if doc.get("user") is not None and not isinstance(doc["user"], str):
        raise BadParameter("user", "user must be a string")
    params = check_parameters(doc)
    params.setdefault("temperature", 1.0)  # OpenAI's default: sampled
    return model, bool(stream), usage, params


def _prompt(doc: Mapping[str, Any]) -> str | list[int]:
    p = doc.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]
    if isinstance(p, str) and p:
        return p
    if isinstance(p, list) and p and all(type(i) is int for i in p):
        return p
    if p is None:
        raise BadParameter("prompt", "prompt is required: a string (or a list of token ids)")
    raise BadParameter(
        "prompt", "prompt must be one non-empty string or one list of token ids (one per request)"
    )


def chat_prompt(messages: object) -> str:
    """The prompt of a chat: ``role: content`` per message, then ``assistant:`` (module doc)."""
    if not isinstance(messages, list) or not messages:
        raise BadParameter("messages", "messages is required: a non-empty list of messages")
    lines: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadParameter(
                f"messages[{i}]",
                f"messages[{i}] must have a role, one of {', '.join(sorted(ROLES))}",
            )
        c = m.get("content")
        if isinstance(c, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in c):
                raise BadParameter(
                    f"messages[{i}].content", "only text content parts are supported"
                )
            c = "".join(str(p.get("text", "")) for p in c)
        if not isinstance(c, str):
            raise BadParameter(f"messages[{i}].content", f"messages[{i}].content must be a string")
        lines.append(f"{m['role']}: {c}\n")
    return "".join(lines) + "assistant:"


async def _complete(
    gw: Gateway, doc: dict[str, Any], chat: bool, receive: Receive, send: Send
) -> None:
    if chat:
        _unknown(doc, CHAT_FIELDS)
        _only(doc, "logprobs", lambda v: v is False, "logprobs = false")
        _only(doc, "top_logprobs", lambda v: v == 0, "top_logprobs = 0")
        _only(doc, "response_format", lambda v: v == {"type": "text"}, '{"type": "text"}')
        if "max_completion_tokens" in doc and "max_tokens" not in doc:
            doc = {**doc, "max_tokens": doc["max_completion_tokens"]}
        prompt: str | list[int] = chat_prompt(doc.get("messages"))
    else:
        _unknown(doc, COMPLETION_FIELDS)
        _only(doc, "echo", lambda v: v is False, "echo = false")
        _only(doc, "logprobs", lambda v: False, "logprobs = null")
        _only(doc, "best_of", lambda v: v == 1, "best_of = 1")
        _only(doc, "suffix", lambda v: False, "suffix = null")
        prompt = _prompt(doc)
    model, stream, usage, params = _common(doc)
    gen = start_generation(gw, model, prompt, params, receive)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    if not stream:
        text, done = await collect(gen)
        await send_response(
            send,
            200,
            orjson.dumps(_answer(rid, created, model, chat, text, done)),
            b"application/json",
        )
        return
    events = gen.events()
    first = await anext(events)  # an error before the first event is an ordinary answer
    sse = SseWriter(send)
    await sse.start()
    if chat:
        head = {"role": "assistant", "content": ""}
        await sse.event(_chunk(rid, created, model, chat, head, None))
    try:
        ev: Piece | Done | None = first
        while ev is not None:
            if ev.text and not await sse.event(_chunk(rid, created, model, chat, ev.text, None)):
                return
            if isinstance(ev, Done):
                reason = _reason(ev.finish_reason)
                await sse.event(_chunk(rid, created, model, chat, "" if not chat else {}, reason))
                if usage:
                    await sse.event(_usage_chunk(rid, created, model, chat, ev))
                await sse.done(b"data: [DONE]\n\n")
                return
            ev = await anext(events, None)
        await sse.done()
    except HttpError as e:
        await sse.event(_error_doc(e))
        await sse.done()
    finally:
        gen.close()


def _reason(r: str) -> str:
    return r if r in ("stop", "length") else "stop"


def _usage(done: Done) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def _answer(
    rid: str, created: int, model: str, chat: bool, text: str, done: Done
) -> dict[str, object]:
    choice: dict[str, object] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": _reason(done.finish_reason),
    }
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(done),
    }


def _chunk(
    rid: str, created: int, model: str, chat: bool, delta: str | dict[str, str], reason: str | None
) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if chat:
        choice["delta"] = {"content": delta} if isinstance(delta, str) else delta
    else:
        choice["text"] = delta if isinstance(delta, str) else ""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def _usage_chunk(rid: str, created: int, model: str, chat: bool, done: Done) -> dict[str, object]:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(done),
    }


__all__ = ["PREFIX", "chat_prompt", "list_models", "send_openai_error", "serve_openai"]
