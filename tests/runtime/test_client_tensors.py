"""``gshare.Client.infer``'s tensors: numpy arrays become Open Inference Protocol JSON (no
server: the conversion alone; the live round trip is in test_runtime_serving)."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.runtime.client import ClientError, _tensor_json


def test_an_array_fills_in_shape_and_datatype_and_becomes_a_flat_list() -> None:
    t = _tensor_json({"name": "x", "data": np.arange(6, dtype=np.int64).reshape(2, 3)})
    assert t == {"name": "x", "data": [0, 1, 2, 3, 4, 5], "shape": [2, 3], "datatype": "INT64"}
    t = _tensor_json({"name": "m", "data": np.array([True, False])})
    assert (t["datatype"], t["data"]) == ("BOOL", [True, False])


def test_what_is_given_is_kept_and_plain_lists_pass_through() -> None:
    t = _tensor_json({"name": "x", "shape": [1, 4], "datatype": "FP16",
                      "data": np.zeros(4, np.float32)})  # fmt: skip
    assert (t["shape"], t["datatype"], t["data"]) == ([1, 4], "FP16", [0.0] * 4)
    plain = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}
    assert _tensor_json(plain) == plain


def test_a_dtype_the_protocol_cannot_name_is_one_line() -> None:
    with pytest.raises(ClientError, match="numpy dtype complex64 has no Open Inference"):
        _tensor_json({"name": "z", "data": np.zeros(2, np.complex64)})
