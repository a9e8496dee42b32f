"""The KServe v2 / Triton gRPC messages of ``inference.GRPCInferenceService``: the ModelInfer
codec (instance side) and the conversion of the OIP service's answers (plain dicts, the same
the HTTP API returns) into response messages (gateway side).

The message definitions are the published ones — ``grpc_service.proto`` and
``model_config.proto`` of the Triton project, a superset of KServe's ``grpc_predict_v2.proto``
(same package ``inference``, same field numbers) — as generated and shipped by the maintained
``tritonclient`` package (``tritonclient.grpc.service_pb2``), not a copy kept here. Imported
only where gRPC is used: by the gateway when ``--grpc-port`` is given, by an instance on its
first gRPC request.

ModelInfer on the data path: the gateway forwards the serialized request untouched
(``oip.header.wrap`` with ``TRANSPORT_GRPC``); the instance decodes it (``decode_grpc``: raw input
contents with ``np.frombuffer``, typed ``contents`` with ``np.asarray``, both validated by
``oip.header.parse_header`` and built by ``oip.codec``) and answers a serialized
``ModelInferResponse`` whose outputs all travel as ``raw_output_contents`` (``encode_grpc``),
which the gateway returns as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol, Self, TypeVar

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from gshare.runtime.oip.codec import (
    binary_of,
    datatype_of,
    decode_tensors,
    handler_outputs,
    select_outputs,
)
from gshare.runtime.oip.grpc_wire import (
    REQUEST_RAW_FIELD,
    RESPONSE_RAW_FIELD,
    raw_field,
    split_message,
)
from gshare.runtime.oip.header import BINARY_DATA_SIZE, InferHeader, OipError, parse_header

SERVICE: Final = "inference.GRPCInferenceService"

_CONTENTS: Final[dict[str, tuple[str, str]]] = {
    "BOOL": ("bool_contents", "bool"), "INT8": ("int_contents", "int32"),
    "INT16": ("int_contents", "int32"), "INT32": ("int_contents", "int32"),
    "INT64": ("int64_contents", "int64"), "UINT8": ("uint_contents", "uint32"),
    "UINT16": ("uint_contents", "uint32"), "UINT32": ("uint_contents", "uint32"),
    "UINT64": ("uint64_contents", "uint64"), "FP32": ("fp32_contents", "float32"),
    "FP64": ("fp64_contents", "float64"), "BYTES": ("bytes_contents", "object"),
}  # fmt: skip
"""Datatype → the typed ``InferTensorContents`` field that carries it (FP16: raw only)."""


class Message(Protocol):
    """A protobuf message (``tritonclient``'s generated classes are untyped)."""

    @classmethod
    def FromString(cls, data: bytes) -> Self: ...  # noqa: N802 (protobuf's name)

    def SerializeToString(self) -> bytes: ...  # noqa: N802


ParameterValue = bool | int | float | str | None
"""An ``InferParameter``'s value (None: none of its ``oneof`` fields is set)."""


class InferParameter(Protocol):
    """``inference.InferParameter``: one of its ``parameter_choice`` fields is set."""

    bool_param: bool
    int64_param: int
    uint64_param: int
    double_param: float
    string_param: str

    def WhichOneof(self, group: str) -> str | None: ...  # noqa: N802 (protobuf's name)


class InferInputTensor(Protocol):
    """``ModelInferRequest.InferInputTensor``."""

    name: str
    datatype: str
    shape: Sequence[int]
    parameters: Mapping[str, InferParameter]
    contents: object
    """``InferTensorContents``: one repeated field per element type (``_CONTENTS``)."""


class InferRequestedOutputTensor(Protocol):
    """``ModelInferRequest.InferRequestedOutputTensor``."""

    name: str
    parameters: Mapping[str, InferParameter]


class ModelInferRequest(Protocol):
    """``inference.ModelInferRequest``, the fields ``decode_message`` reads."""

    id: str
    parameters: Mapping[str, InferParameter]
    inputs: Sequence[InferInputTensor]
    outputs: Sequence[InferRequestedOutputTensor]
    raw_input_contents: Sequence[bytes]


def parameter_value(p: InferParameter) -> ParameterValue:
    """The Python value of an ``InferParameter`` (its set ``oneof`` field)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def set_parameter(p: InferParameter, value: object) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if value < 0 or value < 2**63:
            p.int64_param = value
        else:
            p.uint64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def _params(m: Mapping[str, InferParameter]) -> dict[str, ParameterValue]:
    return {k: parameter_value(v) for k, v in m.items()}


def decode_grpc(raw: bytes | memoryview) -> tuple[InferHeader, dict[str, np.ndarray]]:
    """A serialized ``ModelInferRequest`` → its validated header and one numpy array per
    input. Raises ``OipError``. Protobuf parses only the header: the raw input contents are
    cut out first (``grpc_wire.split_message``) and the arrays are views of them, without a
    copy when ``raw`` is writable (a shared-memory lane)."""
    head, raws = split_message(memoryview(raw), REQUEST_RAW_FIELD)
    try:
        req = pb.ModelInferRequest.FromString(head)
    except Exception as e:  # protobuf's DecodeError
        raise OipError(f"malformed ModelInferRequest: {e}") from None
    return decode_message(req, raws)


def decode_message(
    req: ModelInferRequest, raw_contents: Sequence[bytes | memoryview] | None = None
) -> tuple[InferHeader, dict[str, np.ndarray]]:
    """``decode_grpc`` of a parsed ``ModelInferRequest`` (its raw input contents, or
    ``raw_contents`` when they were cut out before parsing)."""
    raws = list(raw_contents) if raw_contents else list(req.raw_input_contents)
    if raws and len(raws) != len(req.inputs):
        raise OipError(
            f"raw_input_contents has {len(raws)} entries but the request has "
            f"{len(req.inputs)} inputs (give one per input, in order)"
        )
    inputs = []
    for i, t in enumerate(req.inputs):
        params = _params(t.parameters)
        entry: dict[str, object] = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
        if raws:
            params[BINARY_DATA_SIZE] = len(raws[i])
        else:
            field = _CONTENTS.get(t.datatype)
            if field is None:
                raise OipError(
                    f"input {t.name!r}: {t.datatype} has no typed contents; send it in "
                    "raw_input_contents"
                )
            values = getattr(t.contents, field[0])
            entry["data"] = (
                np.array(list(values), dtype=object)
                if field[1] == "object"
                else np.asarray(values, dtype=field[1])
            )
        entry["parameters"] = params
        inputs.append(entry)
    doc: dict[str, object] = {"inputs": inputs, "parameters": _params(req.parameters)}
    if req.id:
        doc["id"] = req.id
    if req.outputs:
        doc["outputs"] = [
            {"name": o.name, "parameters": _params(o.parameters)} for o in req.outputs
        ]
    header = parse_header(doc, sum(len(r) for r in raws) if raws else None)
    return decode_tensors(header, raws if raws else None)


def encode_grpc(header: InferHeader, model_name: str, version: int, output: object) -> bytes:
    """The serialized ``ModelInferResponse`` for the handler's ``output``: the requested
    outputs (or all), each as ``raw_output_contents``."""
    return b"".join(encode_grpc_parts(header, model_name, version, output))


def encode_grpc_parts(
    header: InferHeader, model_name: str, version: int, output: object
) -> list[bytes | memoryview]:
    """``encode_grpc``'s message in parts to be written one after the other: the response
    without its raw contents, serialized, then each output's field tag and length and its
    bytes as a view of the handler's array (``grpc_wire.raw_field``), so the tensors are
    copied once, into wherever the parts are written."""
    resp = pb.ModelInferResponse(model_name=model_name, model_version=str(version))
    if header.id is not None:
        resp.id = header.id
    blobs: list[bytes | memoryview] = []
    for name, a, _binary in select_outputs(header, handler_outputs(output), True):
        dt = datatype_of(name, a)
        resp.outputs.add(name=name, datatype=dt, shape=list(a.shape))
        blob = binary_of(name, a, dt)
        blobs += [raw_field(RESPONSE_RAW_FIELD, len(blob)), blob]
    return [bytes(resp.SerializeToString()), *blobs]


def encode_message(header: InferHeader, model_name: str, version: int, output: object) -> Message:
    """``encode_grpc``'s ``ModelInferResponse``, not serialized."""
    resp = pb.ModelInferResponse(model_name=model_name, model_version=str(version))
    if header.id is not None:
        resp.id = header.id
    for name, a, _binary in select_outputs(header, handler_outputs(output), True):
        dt = datatype_of(name, a)
        resp.outputs.add(name=name, datatype=dt, shape=list(a.shape))
        resp.raw_output_contents.append(bytes(binary_of(name, a, dt)))
    out: Message = resp
    return out


M = TypeVar("M", bound=Message)


def from_dict(doc: Mapping[str, object], message: M) -> M:
    """``message`` (a protobuf message instance) filled from the JSON form ``doc`` (proto field
    names, as the HTTP API answers them)."""
    json_format.ParseDict(doc, message, ignore_unknown_fields=True)  # fills it, returns it
    return message


__all__ = [
    "SERVICE",
    "decode_grpc",
    "decode_message",
    "encode_grpc",
    "encode_grpc_parts",
    "encode_message",
    "from_dict",
    "parameter_value",
    "pb",
    "set_parameter",
]
