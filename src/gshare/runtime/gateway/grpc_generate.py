"""gRPC ``ModelStreamInfer`` for generative functions: one request, its answer streamed as
responses in Triton's decoupled form (``gateway.grpc_server`` calls ``stream_generate`` for a
request whose model is generative).

The request is a ``ModelInferRequest``: the prompt is its BYTES input ``text_input`` (one
element, in ``raw_input_contents`` or ``contents.bytes_contents``), the decoding parameters its
``parameters`` (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``; ``stream`` is
ignored). Each chunk is a ``ModelInferResponse`` with one BYTES output ``text_output`` [1] (the
new text; raw contents); the last carries ``finish_reason``, ``prompt_tokens``,
``completion_tokens`` and ``triton_final_response: true`` among its parameters. A call the
client cancels cancels the generation (``gateway.streams``).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import DecodeError

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.streams import Done, check_parameters, start_generation
from gshare.runtime.oip.grpc_messages import pb

_LEN = struct.Struct("<I")


def _text_input(req: Any) -> str:
    for i, t in enumerate(req.inputs):
        if t.name != "text_input":
            continue
        if t.datatype != "BYTES":
            raise HttpError(400, f"text_input must be BYTES, got {t.datatype}")
        if len(req.raw_input_contents) > i:
            raw = bytes(req.raw_input_contents[i])
            if len(raw) < 4 or _LEN.unpack_from(raw)[0] != len(raw) - 4:
                raise HttpError(400, "text_input must hold one BYTES element")
            data = raw[4:]
        elif len(t.contents.bytes_contents) == 1:
            data = bytes(t.contents.bytes_contents[0])
        else:
            raise HttpError(400, "text_input must hold one BYTES element")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise HttpError(400, "text_input must be UTF-8 text") from None
        if text:
            return text
    raise HttpError(400, "text_input is required: a BYTES input holding the prompt")


def _parameters(req: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, p in req.parameters.items():
        which = p.WhichOneof("parameter_choice")
        if which is None or k == "stream":
            continue
        out[k] = getattr(p, which)
    unknown = sorted(set(out) - {"max_tokens", "temperature", "top_p", "seed", "stop"})
    if unknown:
        raise HttpError(400, f"unknown parameter {unknown[0]!r}")
    return check_parameters(out)


def _response(name: str, version: str, rid: str, text: str) -> Any:
    data = text.encode()
    return pb.ModelInferResponse(
        model_name=name,
        model_version=version,
        id=rid,
        outputs=[
            pb.ModelInferResponse.InferOutputTensor(name="text_output", datatype="BYTES", shape=[1])
        ],
        raw_output_contents=[_LEN.pack(len(data)) + data],
    )


async def stream_generate(oip: OipService, raw: bytes) -> AsyncIterator[Any]:
    """The ``ModelStreamInferResponse`` of each chunk of the generation ``raw`` asks for."""
    try:
        req = pb.ModelInferRequest.FromString(raw)
    except DecodeError as e:
        raise HttpError(400, f"malformed ModelInferRequest: {e}") from None
    name = req.model_name
    v = str(oip.version_of(name, req.model_version))
    gen = start_generation(oip.gw, name, _text_input(req), _parameters(req))
    try:
        async for ev in gen.events():
            if isinstance(ev, Done):
                resp = _response(name, v, req.id, ev.text)
                resp.parameters["triton_final_response"].bool_param = True
                resp.parameters["finish_reason"].string_param = ev.finish_reason
                resp.parameters["prompt_tokens"].int64_param = ev.prompt_tokens
                resp.parameters["completion_tokens"].int64_param = ev.completion_tokens
                yield pb.ModelStreamInferResponse(infer_response=resp)
            elif ev.text:
                yield pb.ModelStreamInferResponse(
                    infer_response=_response(name, v, req.id, ev.text)
                )
    finally:
        gen.close()


__all__ = ["stream_generate"]
