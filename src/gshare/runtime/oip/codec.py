"""The Open Inference Protocol's tensor codec (instance side): an infer request's body →
numpy arrays → what the handler's ``predict`` gets, and the handler's output → the response,
in JSON or with the binary tensor data extension.

Who calls it: the instance's batching thread through ``oip.payload`` (``decode_request`` and
``encode_response``, for ``ENC_OIP`` frames behind ``oip.header.wrap``'s envelope; gRPC bodies
go through ``oip.grpc_messages``), and benches. It imports torch only to build the handler's
tensors (``to_handler_input``), so the gateway can import the protocol without it.

Decoding builds one numpy array per input without a Python loop per element: the binary part
is copied once into a writable buffer and each input is an ``np.frombuffer`` view of it (the
handler's tensors share it, ``torch.from_numpy``); JSON ``data`` is parsed by ``orjson`` and
converted by ``np.asarray``, whose inferred kind must fit the datatype (no floats for
integers, no booleans or strings for numbers) and integers its range. BYTES elements are the
exception: each is an object (length-prefixed in binary). Encoding writes JSON ``data`` from
numpy arrays (``orjson.OPT_SERIALIZE_NUMPY``) and binary outputs as views of the arrays'
memory, joined once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final, NotRequired, TypedDict, cast

import numpy as np
import orjson

from gshare.runtime.oip.header import (
    BINARY_DATA,
    BINARY_DATA_SIZE,
    NP_DTYPES,
    InferHeader,
    InputTensor,
    OipError,
    fmt_shape,
    parse_header,
)

if TYPE_CHECKING:
    import torch

    HandlerTensor = torch.Tensor | list[str | bytes]
    """One input as ``predict`` gets it: a tensor, or a BYTES input's elements."""
    HandlerInput = HandlerTensor | dict[str, HandlerTensor]
    """What ``predict`` gets for one request (``to_handler_input``)."""

_TORCH_DTYPES: Final[dict[str, str]] = {
    "BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "INT16": "int16", "INT32": "int32",
    "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
    "UINT16": "int32", "UINT32": "int64", "UINT64": "int64",
}  # fmt: skip
"""OIP datatype → torch dtype of the handler's tensor (unsigned types torch lacks widen)."""

_JSON_KINDS: Final[dict[str, str]] = {
    "BOOL": "b", "UINT8": "iu", "UINT16": "iu", "UINT32": "iu", "UINT64": "iu", "INT8": "iu",
    "INT16": "iu", "INT32": "iu", "INT64": "iu", "FP16": "iuf", "FP32": "iuf", "FP64": "iuf",
}  # fmt: skip
"""numpy kinds a JSON ``data`` list may parse to, per datatype (no floats for integers, no
booleans for numbers, no strings for either)."""

# -- decoding (instance) -----------------------------------------------------------------------


def load_json(body: bytes | memoryview) -> object:
    """The JSON body of a request without binary data; ``OipError`` naming what is wrong —
    and, when the body looks like binary tensor data, the header it lacks."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if BINARY_DATA_SIZE.encode() in bytes(body):
            raise OipError(
                "the body is not JSON alone: it holds binary tensor data (binary_data_size) "
                "but the request has no 'Inference-Header-Content-Length' header giving the "
                "length of its JSON part"
            ) from None
        raise OipError(f"malformed JSON body: {e}") from None


def decode_http(body: memoryview, header_len: int) -> tuple[InferHeader, dict[str, np.ndarray]]:
    """An HTTP infer body (``header_len`` < 0: JSON alone) → its header and one numpy array
    per input (``decode_tensor``). Raises ``OipError``."""
    if header_len < 0:
        return decode_tensors(parse_header(load_json(body), None), None)
    if header_len > len(body):
        raise OipError(
            f"Inference-Header-Content-Length {header_len} exceeds the body ({len(body)} bytes)"
        )
    try:
        doc = orjson.loads(body[:header_len])
    except orjson.JSONDecodeError as e:
        raise OipError(
            f"malformed JSON header (the first {header_len} bytes of the body, as "
            f"Inference-Header-Content-Length says): {e}"
        ) from None
    binary = body[header_len:]
    return decode_tensors(parse_header(doc, len(binary)), binary)


def decode_tensors(
    header: InferHeader, binary: memoryview | Sequence[bytes | memoryview] | None
) -> tuple[InferHeader, dict[str, np.ndarray]]:
    """One numpy array per input of a validated header: binary inputs from ``binary`` (the
    binary part, inputs in order, or one buffer per input: gRPC raw contents), others from
    their ``data``. The binary part is copied once into a writable buffer, so the handler's
    tensors share it without further copies (none at all when ``binary`` is a writable view:
    the request's bytes in a shared-memory lane)."""
    arrays: dict[str, np.ndarray] = {}
    if isinstance(binary, memoryview):
        # writable: torch.from_numpy needs it; a writable view (a shared-memory lane,
        # ``instance.lanes``) is used in place, anything else copied once
        buf: bytearray | memoryview = binary if not binary.readonly else bytearray(binary)
        off = 0
        for t in header.inputs:
            if t.binary_size is not None:
                arrays[t.name] = decode_binary(t, buf, off)
                off += t.binary_size
    elif binary is not None:
        raws = iter(binary)
        for t in header.inputs:
            if t.binary_size is not None:
                raw = next(raws)
                own = raw if isinstance(raw, memoryview) and not raw.readonly else bytearray(raw)
                arrays[t.name] = decode_binary(t, own, 0)
    for t in header.inputs:
        if t.binary_size is None:
            arrays[t.name] = decode_json_data(t)
    return header, {t.name: arrays[t.name] for t in header.inputs}


def decode_binary(t: InputTensor, buf: bytearray | memoryview, offset: int) -> np.ndarray:
    """The input's array from ``buf[offset : offset + t.binary_size]`` (no copy; BYTES: one
    object per element, each a 4-byte little-endian length and its bytes)."""
    assert t.binary_size is not None
    if t.datatype == "BYTES":
        return _decode_bytes(t, memoryview(buf)[offset : offset + t.binary_size])
    dtype = NP_DTYPES[t.datatype]
    if t.datatype == "BOOL":
        raw = np.frombuffer(buf, np.uint8, t.count, offset)
        if t.count and int(raw.max()) > 1:
            raise OipError(f"input {t.name!r}: BOOL elements must be the bytes 0 or 1")
        return raw.view(np.bool_).reshape(t.shape)
    return np.frombuffer(buf, dtype, t.count, offset).reshape(t.shape)


def _decode_bytes(t: InputTensor, raw: memoryview) -> np.ndarray:
    out = np.empty(t.count, dtype=object)
    pos, n, i = 0, len(raw), 0
    while pos < n:
        if pos + 4 > n or i >= t.count:
            break
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > n:
            raise OipError(f"input {t.name!r}: element {i} runs past its binary data")
        out[i] = bytes(raw[pos : pos + size])
        pos += size
        i += 1
    if i != t.count or pos != n:
        raise OipError(
            f"input {t.name!r}: the binary data holds {i} BYTES elements"
            f"{' and trailing bytes' if pos != n else ''}, shape {fmt_shape(t.shape)} "
            f"needs {t.count}"
        )
    return out.reshape(t.shape)


def decode_json_data(t: InputTensor) -> np.ndarray:
    """The input's array from its JSON ``data`` (flat or nested): ``np.asarray`` infers the
    elements' kind, which must fit the datatype; integers must fit its range."""
    where = f"input {t.name!r}"
    assert t.data is not None  # parse_header: an input without binary data has 'data'
    if t.datatype == "BYTES":
        flat = _flatten_str(t.data, where)
        if len(flat) != t.count:
            raise OipError(
                f"{where}: 'data' has {len(flat)} elements but shape {fmt_shape(t.shape)} "
                f"needs {t.count}"
            )
        out = np.empty(t.count, dtype=object)
        out[:] = flat
        return out.reshape(t.shape)
    try:
        a = np.asarray(t.data)
    except (ValueError, TypeError, OverflowError):
        raise OipError(f"{where}: 'data' is not a regular nested list of numbers") from None
    if a.size != t.count:
        raise OipError(
            f"{where}: 'data' has {a.size} elements but shape {fmt_shape(t.shape)} needs {t.count}"
        )
    dtype = NP_DTYPES[t.datatype]
    if a.size == 0:
        return np.zeros(t.shape, dtype)
    if a.dtype.kind not in _JSON_KINDS[t.datatype]:
        bad = _first_bad(t.data, t.datatype)
        raise OipError(f"{where}: element {bad!r} is not a valid {t.datatype} value")
    if dtype.kind in "iu" and a.dtype != dtype:
        info = np.iinfo(cast("np.dtype[np.integer]", dtype))
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise OipError(f"{where}: element {bad} is out of the range of {t.datatype}")
    return a.astype(dtype, copy=False).reshape(t.shape)


def _leaves(data: Iterable[object]) -> Iterator[object]:
    """The elements of nested lists, in order, without recursion (depth is the client's)."""
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            yield x
        else:
            stack.pop()


def _flatten_str(data: list[object] | np.ndarray, where: str) -> list[object]:
    if isinstance(data, np.ndarray):
        return list(data.reshape(-1))
    out: list[object] = []
    for x in _leaves(data):
        if not isinstance(x, str | bytes):
            raise OipError(f"{where}: element {x!r} is not a valid BYTES value (a string)")
        out.append(x)
    return out


def _first_bad(data: list[object] | np.ndarray, datatype: str) -> object:
    """The first element of the request's ``data`` that is not a ``datatype`` value (for the
    error message; the error path only)."""
    flat = list(np.asarray(data, dtype=object).reshape(-1)) if isinstance(data, np.ndarray) else []
    if not flat:
        flat = list(_leaves(data))
    for x in flat:
        if datatype == "BOOL":
            ok = isinstance(x, bool | np.bool_)
        elif isinstance(x, bool | np.bool_):
            ok = False
        elif datatype.startswith("FP"):
            ok = isinstance(x, int | float | np.integer | np.floating)
        else:
            ok = isinstance(x, int | np.integer)
        if not ok:
            return x
    return flat[0] if flat else None


def to_handler_input(header: InferHeader, arrays: Mapping[str, np.ndarray]) -> HandlerInput:
    """What ``predict`` gets for one request: a torch tensor when there is one input, else a
    dict name → tensor; a BYTES input is a flat list of ``str`` (``bytes`` for elements that
    are not UTF-8). Numeric tensors share the arrays' memory (unsigned types torch lacks are
    widened: a copy)."""
    import torch  # lazy: heavy, and the gateway imports this module without it (module doc)

    out: dict[str, HandlerTensor] = {}
    for t in header.inputs:
        a = arrays[t.name]
        if t.datatype == "BYTES":
            out[t.name] = [_text(x) for x in a.reshape(-1)]
            continue
        target = _TORCH_DTYPES[t.datatype]
        if t.datatype == "UINT64" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise OipError(f"input {t.name!r}: UINT64 values above 2**63-1 are not supported")
        if a.dtype.name != target:
            a = a.astype(target)
        elif not a.flags.writeable:
            a = a.copy()
        out[t.name] = torch.from_numpy(a)
    return next(iter(out.values())) if len(out) == 1 else out


def _text(x: str | bytes) -> str | bytes:
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return x
    return x


# -- outputs (instance) --------------------------------------------------------------------------

_FROM_NP: Final[dict[str, str]] = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64",
}  # fmt: skip


def _as_array(name: str, value: object) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        import torch  # lazy: only for a torch value (module doc)

        if isinstance(value, torch.Tensor):
            t = value.detach().cpu()
            if t.dtype == torch.bfloat16:
                t = t.float()
            return np.asarray(t.numpy())
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, str | bytes):
        return np.array([value], dtype=object)
    if isinstance(value, list | tuple) and value and isinstance(value[0], str | bytes):
        out = np.empty(len(value), dtype=object)  # BYTES: str and bytes elements as they are
        out[:] = value
        return out
    try:
        a = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise OipError(f"output {name!r} is not a tensor: {e}") from None
    if a.dtype.kind in "US":
        return a.astype(object)
    if a.dtype == np.float64 and not isinstance(value, np.generic):
        a = a.astype(np.float32)  # Python floats are FP32 (torch's default dtype)
    return a


def datatype_of(name: str, a: np.ndarray) -> str:
    if a.dtype.kind in "OUS":
        return "BYTES"
    dt = _FROM_NP.get(a.dtype.name)
    if dt is None:
        raise OipError(f"output {name!r} has dtype {a.dtype}, which OIP cannot carry")
    return dt


def handler_outputs(output: object) -> list[tuple[str, np.ndarray]]:
    """The handler's output for one request as named arrays (a dict gives one tensor per key,
    anything else one tensor named ``output0``). Python floats become FP32, ints INT64, strings
    BYTES."""
    if isinstance(output, Mapping):
        return [(str(k), _as_array(str(k), v)) for k, v in output.items()]
    return [("output0", _as_array("output0", output))]


def select_outputs(
    header: InferHeader, outputs: list[tuple[str, np.ndarray]], binary_default: bool
) -> list[tuple[str, np.ndarray, bool]]:
    """The outputs to answer, in order, each with whether it goes as binary data: the requested
    ones (``OipError`` for a name the handler did not give), or all."""
    if header.outputs is None:
        return [(n, a, binary_default) for n, a in outputs]
    by_name = dict(outputs)
    chosen = []
    for o in header.outputs:
        if o.name not in by_name:
            raise OipError(
                f"unknown output {o.name!r} (the model gives: {', '.join(by_name) or 'none'})"
            )
        chosen.append((o.name, by_name[o.name], binary_default if o.binary is None else o.binary))
    return chosen


def binary_of(name: str, a: np.ndarray, datatype: str) -> bytes | memoryview:
    """An output's binary data: little-endian, row major; BYTES elements length-prefixed."""
    if datatype == "BYTES":
        parts = []
        for x in a.reshape(-1):
            b = x if isinstance(x, bytes) else str(x).encode("utf-8")
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    c = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return c.reshape(-1).view(np.uint8).data  # a view of the array's memory, no copy


def _json_data(name: str, a: np.ndarray, datatype: str) -> list[str] | np.ndarray:
    if datatype == "BYTES":
        out = []
        for x in a.reshape(-1):
            if isinstance(x, bytes):
                try:
                    x = x.decode("utf-8")
                except UnicodeDecodeError:
                    raise OipError(
                        f"output {name!r} holds bytes that are not UTF-8 text: request it as "
                        f"binary data (parameters.{BINARY_DATA})"
                    ) from None
            out.append(str(x))
        return out
    if a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
        raise OipError(
            f"output {name!r} holds NaN or infinite values, which JSON cannot carry: request "
            f"it as binary data (parameters.{BINARY_DATA})"
        )
    return np.ascontiguousarray(a).reshape(-1)  # orjson writes numpy arrays natively


class ResponseTensor(TypedDict):
    """One output of an HTTP infer response: its data as JSON ``data``, or as binary data
    after the JSON part (``parameters.binary_data_size``)."""

    name: str
    datatype: str
    shape: list[int]
    parameters: NotRequired[dict[str, int]]
    data: NotRequired[list[str] | np.ndarray]


class InferResponse(TypedDict):
    """The JSON part of an HTTP infer response (``http_parts``)."""

    model_name: str
    model_version: str
    id: NotRequired[str]
    outputs: list[ResponseTensor]


def http_parts(
    header: InferHeader, model_name: str, version: int, output: object
) -> tuple[bytes, list[bytes | memoryview]]:
    """The HTTP response for the handler's ``output``: its JSON part and the binary data of
    the outputs asked for as binary (in order; none: the response is JSON alone)."""
    chosen = select_outputs(header, handler_outputs(output), header.binary_output)
    outs: list[ResponseTensor] = []
    blobs: list[bytes | memoryview] = []
    for name, a, binary in chosen:
        dt = datatype_of(name, a)
        entry: ResponseTensor = {"name": name, "datatype": dt, "shape": list(a.shape)}
        if binary:
            raw = binary_of(name, a, dt)
            entry["parameters"] = {BINARY_DATA_SIZE: len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_data(name, a, dt)
        outs.append(entry)
    v = str(version)
    resp: InferResponse = (
        {"model_name": model_name, "model_version": v, "outputs": outs}
        if header.id is None
        else {"model_name": model_name, "model_version": v, "id": header.id, "outputs": outs}
    )
    return orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY), blobs


def encode_http(
    header: InferHeader, model_name: str, version: int, output: object
) -> tuple[bytes, int]:
    """The HTTP response body for the handler's ``output``, and the length of its JSON part
    (-1: the body is JSON alone; else binary data follows, outputs in order)."""
    js, blobs = http_parts(header, model_name, version, output)
    if not blobs:
        return js, -1
    return b"".join([js, *blobs]), len(js)


__all__ = [
    "InferResponse",
    "ResponseTensor",
    "binary_of",
    "datatype_of",
    "decode_binary",
    "decode_http",
    "decode_json_data",
    "decode_tensors",
    "encode_http",
    "handler_outputs",
    "http_parts",
    "load_json",
    "select_outputs",
    "to_handler_input",
]
