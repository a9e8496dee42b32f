"""An instance's two entry points to the Open Inference Protocol: an ``ENC_OIP`` frame's
payload → what the handler's ``predict`` gets (``decode_request``), and the handler's output →
the response frame (``encode_response``), for both transports — HTTP/JSON with the binary
tensor extension (``oip.codec``) and gRPC messages (``oip.grpc_messages``, imported on the
first gRPC request: it loads the protobuf classes).

Who calls it: ``instance.server``'s batching thread (and benches); the gateway never decodes a
body (``oip.header.wrap`` forwards it untouched).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gshare.runtime.instance import protocol as P
from gshare.runtime.oip.codec import decode_http, http_parts, to_handler_input
from gshare.runtime.oip.header import (
    TRANSPORT_GRPC,
    DeclaredTensor,
    InferHeader,
    TensorMeta,
    check_inputs,
    check_outputs,
    unwrap,
)

if TYPE_CHECKING:
    from gshare.runtime.oip.codec import HandlerInput


@dataclass(frozen=True, slots=True)
class OipCall:
    """A decoded ``ENC_OIP`` request's context, from ``decode_request`` to
    ``encode_response``."""

    transport: int
    version: int
    header: InferHeader


def decode_request(
    payload: bytes | memoryview | tuple[bytes | memoryview, ...],
    input_spec: Iterable[DeclaredTensor | TensorMeta] | None,
    output_spec: Iterable[DeclaredTensor | TensorMeta] | None,
) -> tuple[OipCall, HandlerInput]:
    """An ``ENC_OIP`` payload → its context and what the handler's ``predict`` gets
    (``to_handler_input``), after checking it against the handler's specs. ``OipError``.
    The tensors are views of ``payload`` where it is writable (a shared-memory lane)."""
    if isinstance(payload, tuple):  # ``header.wrap``'s parts, not sent yet (tests, benches)
        payload = b"".join(payload)
    transport, header_len, version, body = unwrap(payload)
    if transport == TRANSPORT_GRPC:
        # lazy: it loads the protobuf classes, on the first gRPC request (module doc)
        from gshare.runtime.oip.grpc_messages import decode_grpc

        header, arrays = decode_grpc(body)
    else:
        header, arrays = decode_http(body, header_len)
    check_inputs(arrays, header, input_spec)
    check_outputs(header, output_spec)
    return OipCall(transport, version, header), to_handler_input(header, arrays)


Parts = list[bytes | memoryview]
"""A payload in pieces, written one after the other (``instance.wire.Conn.response_frame``)."""


def encode_response(call: OipCall, model_name: str, output: object) -> tuple[int, bytes]:
    """The handler's output for one request as ``(response encoding, payload)``
    (``instance.protocol``: ``ENC_JSON``, ``ENC_OIP_BINARY`` or ``ENC_PROTOBUF``)."""
    enc, parts = encode_response_parts(call, model_name, output)
    return enc, b"".join(parts)


def encode_response_parts(call: OipCall, model_name: str, output: object) -> tuple[int, Parts]:
    """``encode_response`` in parts: the outputs' bytes are views of the handler's arrays, so
    they are copied once, into the frame or the connection's response lane."""
    if call.transport == TRANSPORT_GRPC:
        from gshare.runtime.oip.grpc_messages import encode_grpc_parts  # lazy: as above

        return P.ENC_PROTOBUF, encode_grpc_parts(call.header, model_name, call.version, output)
    js, blobs = http_parts(call.header, model_name, call.version, output)
    if not blobs:
        return P.ENC_JSON, [js]
    return P.ENC_OIP_BINARY, [struct.pack("<I", len(js)), js, *blobs]


__all__ = ["OipCall", "Parts", "decode_request", "encode_response", "encode_response_parts"]
