"""Open Inference Protocol v2 tensors: validation of request bodies and conversion to and from
``torch`` tensors.

Two halves, so that the gateway never imports torch:

* ``check_infer_request`` (gateway) — the structure of a ``POST /v2/models/{name}/infer``
  body: ``inputs`` is a non-empty list of ``{name, shape, datatype, data}``, ``shape`` a list
  of non-negative integers, ``datatype`` one of the protocol's names, ``data`` a (flat or
  nested) list with exactly ``prod(shape)`` elements of the right kind. Errors raise
  ``OipError`` naming the input and the problem (the gateway answers 400).
* ``decode_inputs`` / ``encode_outputs`` (instance) — check the tensors against the handler's
  ``input_spec`` (names, datatypes, shapes where -1 is any size), build ``torch`` tensors
  (one tensor when the handler has one input, else a dict name → tensor) and turn the
  handler's output (tensor, array, list, scalar, or dict of those) into OIP output tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

DATATYPES: Final[tuple[str, ...]] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip
"""Tensor datatypes of the Open Inference Protocol v2 (BF16 is not supported)."""
_TORCH_DTYPES: Final[dict[str, str]] = {
    "BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "INT16": "int16", "INT32": "int32",
    "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
    "UINT16": "int32", "UINT32": "int64", "UINT64": "int64",
}  # fmt: skip
"""OIP datatype → torch dtype name (unsigned types torch lacks are widened)."""


class OipError(ValueError):
    """A malformed or mismatching OIP request; the message names the input and the problem."""


def _flatten(data: Any, out: list[Any]) -> None:
    for x in data:
        if isinstance(x, list):
            _flatten(x, out)
        else:
            out.append(x)


def _kind_ok(datatype: str, x: Any) -> bool:
    if datatype == "BOOL":
        return isinstance(x, bool)
    if datatype == "BYTES":
        return isinstance(x, str)
    if isinstance(x, bool):
        return False
    if datatype.startswith("FP"):
        return isinstance(x, int | float)
    if datatype.startswith("UINT"):
        return isinstance(x, int) and x >= 0
    return isinstance(x, int)


def check_infer_request(body: Any) -> list[dict[str, Any]]:
    """Validate the structure of an OIP infer request body (parsed JSON); return its inputs
    with ``data`` flattened. Raises ``OipError`` naming the first problem."""
    if not isinstance(body, dict):
        raise OipError("the request body must be a JSON object with an 'inputs' list")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise OipError("'inputs' must be a non-empty list of tensors")
    if "id" in body and not isinstance(body["id"], str):
        raise OipError("'id' must be a string")
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
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
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise OipError(
                f"{where}: 'shape' must be a list of non-negative integers, got {shape!r}"
            )
        datatype = t.get("datatype")
        if datatype not in DATATYPES:
            raise OipError(
                f"{where}: unknown datatype {datatype!r} (known: {', '.join(DATATYPES)})"
            )
        data = t.get("data")
        if not isinstance(data, list):
            raise OipError(f"{where}: 'data' must be a list")
        flat: list[Any] = []
        _flatten(data, flat)
        need = math.prod(shape)
        if len(flat) != need:
            raise OipError(
                f"{where}: 'data' has {len(flat)} elements but shape {shape} needs {need}"
            )
        for x in flat:
            if not _kind_ok(datatype, x):
                raise OipError(f"{where}: element {x!r} is not a valid {datatype} value")
        out.append({"name": name, "shape": shape, "datatype": datatype, "data": flat})
    return out


def _spec_fields(spec: Any) -> tuple[str, list[int], str]:
    if isinstance(spec, Mapping):
        return str(spec["name"]), [int(d) for d in spec["shape"]], str(spec["datatype"])
    return str(spec.name), [int(d) for d in spec.shape], str(spec.datatype)


def input_spec_dicts(specs: Iterable[Any] | None) -> list[dict[str, Any]]:
    """The handler's input spec as OIP metadata dicts (``name``, ``datatype``, ``shape``)."""
    out = []
    for s in specs or ():
        name, shape, datatype = _spec_fields(s)
        out.append({"name": name, "datatype": datatype, "shape": shape})
    return out


def decode_inputs(inputs: list[dict[str, Any]], specs: Sequence[Any] | None) -> Any:
    """Check structurally valid ``inputs`` (see ``check_infer_request``) against the handler's
    input spec and build the handler's input: a tensor when there is one input, a dict
    name → tensor otherwise (BYTES inputs stay lists of str). Raises ``OipError``."""
    import torch

    if specs:
        declared = {(_spec_fields(s))[0]: _spec_fields(s) for s in specs}
        names = [t["name"] for t in inputs]
        unknown = [n for n in names if n not in declared]
        if unknown:
            raise OipError(f"unknown input {unknown[0]!r} (the model takes: {', '.join(declared)})")
        missing = [n for n in declared if n not in names]
        if missing:
            raise OipError(f"missing input {missing[0]!r} (the model takes: {', '.join(declared)})")
        for t in inputs:
            _, shape, datatype = declared[t["name"]]
            if t["datatype"] != datatype:
                raise OipError(
                    f"input {t['name']!r}: datatype must be {datatype}, got {t['datatype']}"
                )
            ok = len(shape) == len(t["shape"]) and all(
                d == -1 or d == g for d, g in zip(shape, t["shape"], strict=True)
            )
            if not ok:
                raise OipError(
                    f"input {t['name']!r}: shape must be {shape} (-1: any), got {t['shape']}"
                )
    tensors: dict[str, Any] = {}
    for t in inputs:
        if t["datatype"] == "BYTES":
            tensors[t["name"]] = t["data"]
            continue
        dtype = getattr(torch, _TORCH_DTYPES[t["datatype"]])
        try:
            tensors[t["name"]] = torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])
        except (RuntimeError, OverflowError, TypeError) as e:
            raise OipError(
                f"input {t['name']!r}: cannot build a {t['datatype']} tensor: {e}"
            ) from None
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    return tensors


_FROM_TORCH: Final[dict[str, str]] = {
    "torch.bool": "BOOL", "torch.uint8": "UINT8", "torch.int8": "INT8", "torch.int16": "INT16",
    "torch.int32": "INT32", "torch.int64": "INT64", "torch.float16": "FP16",
    "torch.bfloat16": "FP32", "torch.float32": "FP32", "torch.float64": "FP64",
}  # fmt: skip


def _to_output(name: str, value: Any) -> dict[str, Any]:
    import torch

    if not isinstance(value, torch.Tensor):
        if hasattr(value, "__array__"):
            value = torch.as_tensor(value)
        elif isinstance(value, str | bytes):
            text = value.decode() if isinstance(value, bytes) else value
            return {"name": name, "shape": [1], "datatype": "BYTES", "data": [text]}
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return {"name": name, "shape": [len(value)], "datatype": "BYTES", "data": value}
        else:
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError) as e:
                raise OipError(f"output {name!r} is not a tensor: {e}") from None
    value = value.detach().cpu()
    datatype = _FROM_TORCH.get(str(value.dtype), "FP32")
    if str(value.dtype) == "torch.bfloat16":
        value = value.float()
    return {
        "name": name,
        "shape": list(value.shape),
        "datatype": datatype,
        "data": value.reshape(-1).tolist(),
    }


def encode_outputs(output: Any) -> list[dict[str, Any]]:
    """The handler's output for one request as OIP output tensors (a dict gives one tensor
    per key, anything else one tensor named ``output0``)."""
    if isinstance(output, Mapping):
        return [_to_output(str(k), v) for k, v in output.items()]
    return [_to_output("output0", output)]


__all__ = [
    "DATATYPES",
    "OipError",
    "check_infer_request",
    "decode_inputs",
    "encode_outputs",
    "input_spec_dicts",
]
