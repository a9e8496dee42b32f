"""Protobuf's wire format, only as far as the ModelInfer messages' raw tensor bytes need it.

A ``ModelInferRequest`` of a 1 MiB tensor is a few hundred bytes of header and the tensor in
``raw_input_contents`` (field 7; ``raw_output_contents`` is field 6 of the response). Parsing
the whole message with protobuf copies the tensor into a new ``bytes`` object each time; the
gateway only needs the model's name and version, and the instance wants the tensor where it
already is (a shared-memory lane, ``instance.lanes``). So:

* ``split_message`` walks a serialized message's top-level fields without parsing them and
  returns every field except the raw one, concatenated (a valid, small message: protobuf
  messages are the concatenation of their fields), plus views of the raw field's payloads;
* ``raw_field`` is the tag and length to put before a payload to append it as a raw field,
  so an answer is written as its small serialized header followed by the outputs' bytes
  straight from the handler's arrays.

Who calls it: ``oip.grpc_messages`` (instance: ``decode_grpc``, ``encode_grpc_parts``) and
``gateway.grpc_server`` (the request's name and version). What must hold: the result of
``split_message`` parses to the same message as the input minus the raw field, and
``OipError`` is raised, never an IndexError, on a truncated or malformed message.
"""

from __future__ import annotations

from typing import Final

from gshare.runtime.oip.header import OipError

REQUEST_RAW_FIELD: Final[int] = 7
"""``ModelInferRequest.raw_input_contents``."""
RESPONSE_RAW_FIELD: Final[int] = 6
"""``ModelInferResponse.raw_output_contents``."""

_WT_VARINT, _WT_I64, _WT_LEN, _WT_I32 = 0, 1, 2, 5


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    n = len(buf)
    while True:
        if pos >= n or shift > 63:
            raise OipError("malformed protobuf message: a truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def split_message(buf: memoryview, raw_field: int) -> tuple[bytes, list[memoryview]]:
    """``(the message without field raw_field, that field's payloads as views)`` (module
    doc). ``OipError`` when the message is malformed."""
    kept: list[memoryview] = []
    raws: list[memoryview] = []
    pos = 0
    n = len(buf)
    run_start = 0
    while pos < n:
        start = pos
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == _WT_VARINT:
            _, pos = _varint(buf, pos)
        elif wire == _WT_I64:
            pos += 8
        elif wire == _WT_I32:
            pos += 4
        elif wire == _WT_LEN:
            length, pos = _varint(buf, pos)
            if field == raw_field:
                if pos + length > n:
                    break
                if start > run_start:
                    kept.append(buf[run_start:start])
                raws.append(buf[pos : pos + length])
                pos += length
                run_start = pos
                continue
            pos += length
        else:
            raise OipError(f"malformed protobuf message: wire type {wire} of field {field}")
        if field == 0:
            raise OipError("malformed protobuf message: field number 0")
    if pos != n:
        raise OipError("malformed protobuf message: truncated")
    if run_start < n:
        kept.append(buf[run_start:n])
    return b"".join(kept), raws


def raw_field(field: int, length: int) -> bytes:
    """The tag and length that put a ``length``-byte payload in field ``field``."""
    return encode_varint((field << 3) | _WT_LEN) + encode_varint(length)


__all__ = [
    "REQUEST_RAW_FIELD",
    "RESPONSE_RAW_FIELD",
    "encode_varint",
    "raw_field",
    "split_message",
]
