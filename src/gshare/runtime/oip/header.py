"""Open Inference Protocol v2: the inference request model, shared by the gateway and the
instances — datatypes, the envelope an infer request travels in from the gateway to an
instance, the validation of a request's header (``parse_header``) and of its tensors against a
handler's declared ones (``check_inputs``, ``check_outputs``). The tensor codec (JSON and the
binary tensor data extension, numpy) is ``oip.codec``; gRPC's messages are ``oip.grpc_messages``.

Who calls what (docs/DESIGN.md §5, "OIP"):

* the gateway (its event loop; no per-element work there) checks only the framing of an
  infer request — route, version, body size, ``Inference-Header-Content-Length`` inside the
  body — and forwards the body untouched in an envelope (``wrap``): transport, the JSON
  header's length and the model version, then the body;
* the instance (its batching thread) decodes it with ``oip.payload.decode_request``: the JSON
  header parsed with ``orjson`` and validated here, one numpy array per input built without a
  Python loop per element, checked against the handler's ``input_spec``; the answer is
  ``oip.payload.encode_response``'s.

Errors are ``OipError`` naming the tensor and the problem; the instance answers them as a bad
request (400 / ``INVALID_ARGUMENT``). Datatypes: the protocol's, without BF16.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypedDict, TypeGuard

import numpy as np

DATATYPES: Final[tuple[str, ...]] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip
"""Tensor datatypes of the Open Inference Protocol v2 (BF16 is not supported)."""

NP_DTYPES: Final[dict[str, np.dtype[np.generic]]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}  # fmt: skip
"""OIP datatype → numpy dtype (little-endian, the binary extension's byte order)."""

BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"
HEADER_LENGTH: Final = "inference-header-content-length"
"""The HTTP header giving the JSON part's length of a body with binary tensor data."""


class OipError(ValueError):
    """A malformed or mismatching OIP request; the message names the tensor and the problem."""


# -- the envelope: gateway -> instance ----------------------------------------------------------

ENVELOPE: Final = struct.Struct("<BiI")
"""transport (u8), JSON header length (i32; -1: the body is JSON alone), model version (u32)."""
TRANSPORT_HTTP: Final[int] = 0
TRANSPORT_GRPC: Final[int] = 1
"""The body is a serialized ``inference.ModelInferRequest`` (``oip.grpc_messages``)."""


def wrap(
    transport: int, header_len: int, version: int, body: Sequence[bytes | memoryview]
) -> tuple[bytes | memoryview, ...]:
    """The payload of an ``ENC_OIP`` frame in parts: the envelope, then the body's parts
    (copied once, where the frame or a shared-memory lane is written)."""
    return (ENVELOPE.pack(transport, header_len, version), *body)


def unwrap(payload: bytes | memoryview) -> tuple[int, int, int, memoryview]:
    """``(transport, header_len, version, body)`` of an ``ENC_OIP`` payload."""
    if len(payload) < ENVELOPE.size:
        raise OipError("truncated OIP envelope")
    transport, header_len, version = ENVELOPE.unpack_from(payload)
    return transport, header_len, version, memoryview(payload)[ENVELOPE.size :]


# -- the request model --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputTensor:
    """One input of a request, as its header describes it."""

    name: str
    shape: tuple[int, ...]
    datatype: str
    binary_size: int | None
    """Bytes of its data in the binary part (binary extension, gRPC raw contents); None: its
    data is ``data``."""
    data: list[object] | np.ndarray | None = None
    """The JSON ``data`` (a flat or nested list), or a numpy array (gRPC typed contents)."""

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool | None
    """``parameters.binary_data``; None: the request's ``binary_data_output``."""


@dataclass(frozen=True, slots=True)
class InferHeader:
    """A validated infer request without its tensor data (``parse_header``)."""

    id: str | None
    inputs: tuple[InputTensor, ...]
    outputs: tuple[RequestedOutput, ...] | None
    """The outputs asked for, in the order asked; None: every output, in the handler's order."""
    parameters: dict[str, Any]
    """The request's ``parameters`` without the transport's own (``binary_data_output``):
    what the handler gets (``predict(..., parameters=...)``)."""
    binary_output: bool
    """``parameters.binary_data_output``: outputs not asked for otherwise are binary."""


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _parameters(obj: Mapping[str, object], where: str) -> dict[str, object]:
    params = obj.get("parameters", {})
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise OipError(f"{where}: 'parameters' must be an object")
    return params


def fmt_shape(shape: Iterable[int]) -> str:
    """``[1, 64]``: a shape in error messages."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def parse_header(doc: object, binary_bytes: int | None) -> InferHeader:
    """Validate the structure of an infer request (parsed JSON) and return its ``InferHeader``.

    ``binary_bytes`` is the size of the binary part after the JSON header (None: the request
    has no ``Inference-Header-Content-Length``, so every input must carry ``data``). Checks,
    each an ``OipError`` naming the problem: ``inputs`` a non-empty list of tensors with unique
    non-empty names, shapes of non-negative integers, known datatypes; either ``data`` (a
    list; a flat one must hold exactly prod(shape) elements, a nested one is counted when it
    is decoded) or ``parameters.binary_data_size`` (matching shape × element size for
    fixed-size types), and the sizes adding up to ``binary_bytes``; ``outputs`` a list of
    unique names; no classification (not supported)."""
    if not isinstance(doc, dict):
        raise OipError("the request body must be a JSON object with an 'inputs' list")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise OipError("'inputs' must be a non-empty list of tensors")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise OipError("'id' must be a string")
    params = dict(_parameters(doc, "the request"))
    binary_output = params.pop(BINARY_DATA_OUTPUT, False)
    if not isinstance(binary_output, bool):
        raise OipError(f"parameters.{BINARY_DATA_OUTPUT} must be true or false")
    seen: set[str] = set()
    parsed: list[InputTensor] = []
    total = 0
    for i, t in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise OipError(f"{where}: must be an object with name, shape, datatype, data")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise OipError(f"{where}: 'name' must be a non-empty string")
        where = f"input {name!r}"
        if name in seen:
            raise OipError(f"{where}: given twice")
        seen.add(name)
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise OipError(
                f"{where}: 'shape' must be a list of non-negative integers, got {shape!r}"
            )
        datatype = t.get("datatype")
        if datatype not in DATATYPES:
            raise OipError(
                f"{where}: unknown datatype {datatype!r} (known: {', '.join(DATATYPES)})"
            )
        size = _parameters(t, where).get(BINARY_DATA_SIZE)
        data = t.get("data")
        if size is not None:
            if not _is_int(size) or size < 0:
                raise OipError(f"{where}: {BINARY_DATA_SIZE} must be an integer >= 0")
            if binary_bytes is None:
                raise OipError(
                    f"{where}: parameters.{BINARY_DATA_SIZE} is given but the request has no "
                    "'Inference-Header-Content-Length' header: a body with binary tensor data "
                    "needs it (the length of the JSON part, in bytes)"
                )
            if data is not None:
                raise OipError(f"{where}: give either 'data' or {BINARY_DATA_SIZE}, not both")
            need = math.prod(shape) * NP_DTYPES[datatype].itemsize
            if datatype != "BYTES" and size != need:
                raise OipError(
                    f"{where}: {BINARY_DATA_SIZE} is {size} bytes but shape {fmt_shape(shape)} of "
                    f"{datatype} needs {need}"
                )
            total += size
        else:
            if not isinstance(data, list | np.ndarray):
                raise OipError(f"{where}: 'data' must be a list")
            need = math.prod(shape)
            flat = isinstance(data, list) and (not data or not isinstance(data[0], list))
            if flat and len(data) != need:  # a flat list is counted here, in O(1)
                raise OipError(
                    f"{where}: 'data' has {len(data)} elements but shape "
                    f"{fmt_shape(shape)} needs {need}"
                )
        parsed.append(InputTensor(name, tuple(shape), datatype, size, data))
    if binary_bytes is not None and total != binary_bytes:
        raise OipError(
            f"the body has {binary_bytes} bytes of binary tensor data after its JSON header, "
            f"but the inputs' {BINARY_DATA_SIZE} add up to {total}"
        )
    return InferHeader(rid, tuple(parsed), _requested(doc), params, binary_output)


def _requested(doc: Mapping[str, object]) -> tuple[RequestedOutput, ...] | None:
    outs = doc.get("outputs")
    if outs is None:
        return None
    if not isinstance(outs, list):
        raise OipError("'outputs' must be a list of {name, parameters}")
    seen: set[str] = set()
    result = []
    for i, o in enumerate(outs):
        name = o.get("name") if isinstance(o, dict) else None
        if not isinstance(name, str) or not name:
            raise OipError(f"outputs[{i}]: 'name' must be a non-empty string")
        if name in seen:
            raise OipError(f"output {name!r}: requested twice")
        seen.add(name)
        p = _parameters(o, f"output {name!r}")
        if p.get("classification"):
            raise OipError(
                f"output {name!r}: the classification extension is not supported; "
                "request the tensor itself"
            )
        binary = p.get(BINARY_DATA)
        if binary is not None and not isinstance(binary, bool):
            raise OipError(f"output {name!r}: parameters.{BINARY_DATA} must be true or false")
        result.append(RequestedOutput(name, binary))
    return tuple(result)


# -- the handler's view --------------------------------------------------------------------------


class DeclaredTensor(Protocol):
    """A tensor as a handler declares it (``input_spec()`` / ``output_spec()``):
    ``instance.models.TensorSpec`` or anything with these attributes."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def datatype(self) -> str: ...


class TensorMeta(TypedDict):
    """A tensor in OIP metadata (``spec_dicts``); a handler may declare its tensors so too."""

    name: str
    datatype: str
    shape: list[int]


def _spec_fields(spec: DeclaredTensor | TensorMeta) -> tuple[str, list[int], str]:
    if isinstance(spec, Mapping):
        return str(spec["name"]), [int(d) for d in spec["shape"]], str(spec["datatype"])
    return str(spec.name), [int(d) for d in spec.shape], str(spec.datatype)


def spec_dicts(
    specs: Iterable[DeclaredTensor | TensorMeta] | None,
) -> list[dict[str, object]]:
    """A handler's ``input_spec()`` / ``output_spec()`` as OIP metadata (``name``,
    ``datatype``, ``shape``; -1 is a dimension of any size)."""
    out: list[dict[str, object]] = []
    for s in specs or ():
        name, shape, datatype = _spec_fields(s)
        out.append({"name": name, "datatype": datatype, "shape": shape})
    return out


input_spec_dicts = spec_dicts


def check_inputs(
    arrays: Mapping[str, np.ndarray],
    header: InferHeader,
    specs: Iterable[DeclaredTensor | TensorMeta] | None,
) -> None:
    """The inputs against the handler's ``input_spec``: the same names, datatypes, and shapes
    (-1: any size). No spec: anything goes. Raises ``OipError``."""
    if not specs:
        return
    declared = {f[0]: f for f in map(_spec_fields, specs)}
    unknown = [n for n in arrays if n not in declared]
    if unknown:
        raise OipError(f"unknown input {unknown[0]!r} (the model takes: {', '.join(declared)})")
    missing = [n for n in declared if n not in arrays]
    if missing:
        raise OipError(f"missing input {missing[0]!r} (the model takes: {', '.join(declared)})")
    for t in header.inputs:
        _, shape, datatype = declared[t.name]
        if t.datatype != datatype:
            raise OipError(f"input {t.name!r}: datatype must be {datatype}, got {t.datatype}")
        ok = len(shape) == len(t.shape) and all(
            d == -1 or d == g for d, g in zip(shape, t.shape, strict=True)
        )
        if not ok:
            raise OipError(
                f"input {t.name!r}: shape must be {fmt_shape(shape)} (-1: any), "
                f"got {fmt_shape(t.shape)}"
            )


def check_outputs(header: InferHeader, specs: Iterable[DeclaredTensor | TensorMeta] | None) -> None:
    """Requested outputs against the handler's ``output_spec`` (none declared: checked once
    the handler answered, ``select_outputs``). Raises ``OipError``."""
    if not specs or header.outputs is None:
        return
    names = [f[0] for f in map(_spec_fields, specs)]
    for o in header.outputs:
        if o.name not in names:
            raise OipError(f"unknown output {o.name!r} (the model gives: {', '.join(names)})")


__all__ = [
    "BINARY_DATA",
    "BINARY_DATA_OUTPUT",
    "BINARY_DATA_SIZE",
    "DATATYPES",
    "DeclaredTensor",
    "ENVELOPE",
    "HEADER_LENGTH",
    "NP_DTYPES",
    "TRANSPORT_GRPC",
    "TRANSPORT_HTTP",
    "InferHeader",
    "InputTensor",
    "OipError",
    "RequestedOutput",
    "TensorMeta",
    "check_inputs",
    "check_outputs",
    "fmt_shape",
    "input_spec_dicts",
    "parse_header",
    "spec_dicts",
    "unwrap",
    "wrap",
]
