"""Built-in models and the handler convention. Built-ins run with their tiny (test-only)
configurations; the full architectures are checked on the meta device (no memory, no time)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gshare.runtime.instance.builtin_models import (
    BUILTIN_HANDLERS,
    BUILTIN_MODELS,
    BYTE_ID0,
    CLS_ID,
    SEP_ID,
)
from gshare.runtime.instance.image_models import IMAGE_HANDLERS
from gshare.runtime.instance.loading import (
    handler_class,
    load_handler,
    make_handler,
    state_dict_for,
    weights_key,
)
from gshare.runtime.instance.models import (
    Handler,
    InputError,
    TensorSpec,
    build_on_meta,
    load_weights,
    shares_weights,
)
from gshare.runtime.node.model_store import ModelStore
from gshare.spec import FunctionSpec, load_function_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def fspec(model: str, **kw: Any) -> FunctionSpec:
    return load_function_spec({"name": "f", "model": model, **kw})


def loaded(model: str) -> Any:
    h = make_handler(fspec(model), tiny=True)
    h.load(None, "cpu")
    return h


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(str(tmp_path / "store"))


# -- full architectures (meta device: parameter counts without allocating) ----------------------


@pytest.mark.parametrize(
    ("model", "params_m"),
    [
        ("resnet50", 25.56),
        ("bert-base", 109.48),
        ("bert-large", 335.14),
        ("vit-base", 86.57),
        ("mlp", 0.0847),
    ],
)
def test_full_architectures_have_the_published_sizes(model: str, params_m: float) -> None:
    h = BUILTIN_HANDLERS[model](tiny=False)
    m = build_on_meta(h.build)
    n = sum(p.numel() for p in m.parameters()) / 1e6
    assert n == pytest.approx(params_m, rel=0.01)
    assert all(p.is_meta for p in m.parameters())


def test_full_input_specs() -> None:
    assert make_handler(fspec("resnet50"), tiny=False).input_spec() == [
        TensorSpec("input", (-1, 3, 224, 224), "FP32")
    ]
    assert make_handler(fspec("vit-base"), tiny=False).input_spec() == [
        TensorSpec("input", (-1, 3, 224, 224), "FP32")
    ]
    assert make_handler(fspec("bert-large"), tiny=False).input_spec() == [
        TensorSpec("input_ids", (-1, -1), "INT64")
    ]
    assert make_handler(fspec("mlp"), tiny=False).input_spec() == [
        TensorSpec("input", (-1, 64), "FP32")
    ]


# -- every built-in builds and predicts -----------------------------------------------------------


@pytest.mark.parametrize("model", BUILTIN_MODELS)
def test_builtin_builds_and_predicts_a_tiny_batch(model: str) -> None:
    h = loaded(model)
    assert isinstance(h, Handler)
    assert not h.module.training
    assert not any(p.requires_grad for p in h.module.parameters())
    x = h.example_input()
    out = h.predict([x, x])
    assert len(out) == 2 and out[0] == out[1]
    if model in IMAGE_HANDLERS:  # image to image: tests/runtime/test_image_models.py
        assert list(out[0]) == [h.output_name] and "shape" in out[0][h.output_name]
    else:
        assert isinstance(out[0]["label"], int) and 0.0 < out[0]["score"] <= 1.0
    json.dumps(out)  # JSON-serialisable
    assert h.predict([]) == []


@pytest.mark.parametrize("model", BUILTIN_MODELS)
def test_random_weights_are_deterministic_and_shared_copy_matches(model: str) -> None:
    spec = fspec(model)
    a, b = state_dict_for(spec, tiny=True), state_dict_for(spec, tiny=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    own = loaded(model)  # load(None): its own random copy
    h = make_handler(spec, tiny=True)
    h.load(a, "cpu")  # adopts a's tensors
    assert shares_weights(h.module, a)
    x = h.example_input()
    assert h.predict([x]) == own.predict([x])


def test_full_mlp_is_the_real_size_and_runs() -> None:
    h = make_handler(fspec("mlp"), tiny=False)
    h.load(None, "cpu")
    assert h.module.fc1.weight.shape == (256, 64)
    out = h.predict([[0.1] * 64])
    assert set(out[0]) == {"label", "score"}


# -- input decoding ---------------------------------------------------------------------------


def test_image_payload_forms_agree() -> None:
    h = loaded("resnet50")
    img = h.example_input()  # tensor [3, 32, 32]
    ref = h.predict([img])[0]
    forms = [
        img.tolist(),  # JSON nested list
        img.numpy(),
        img.numpy().astype("<f4").tobytes(),  # raw float32
        {"data": img.reshape(-1).tolist(), "shape": [3, 32, 32]},  # OIP tensor form
    ]
    for out in h.predict(forms):
        assert out["label"] == ref["label"] and out["score"] == pytest.approx(
            ref["score"], rel=1e-5
        )


def test_batch_payloads_give_lists() -> None:
    h = loaded("vit-base")
    img = h.example_input()
    batch = torch.stack([img, img, img])  # an OIP tensor [3, 3, 32, 32]
    single, batched, raw = h.predict([img, batch, batch.numpy().tobytes()])
    assert isinstance(single["label"], int)
    assert batched["label"] == [single["label"]] * 3
    assert raw["label"] == [single["label"]] * 3


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ([[1.0, 2.0]], "expected an image of shape [3, 32, 32] or [n, 3, 32, 32], got [1, 2]"),
        (b"\x00\x01\x02", "raw payload of 3 bytes"),
        # JSON sent without its content type arrives as raw bytes: the error says so
        (b"[[0.1, 0.2]]", "a JSON body needs the header 'Content-Type: application/json'"),
        ("a string", "unsupported payload type str"),
        ([[1.0], [2.0, 3.0]], "regular shape"),
        ({"data": [1.0, 2.0, 3.0], "shape": [2, 2]}, "do not fit"),
        (torch.full((3, 32, 32), float("nan")), "NaN"),
    ],
)
def test_bad_image_payloads_raise_input_error_naming_the_index(payload: Any, fragment: str) -> None:
    h = loaded("resnet50")
    with pytest.raises(InputError) as ei:
        h.predict([h.example_input(), payload])
    assert str(ei.value).startswith("input 1: ") and fragment in str(ei.value)


def test_text_payload_forms() -> None:
    h = loaded("bert-base")
    ids = h.tokenize("hi")
    assert ids.tolist() == [CLS_ID, BYTE_ID0 + ord("h"), BYTE_ID0 + ord("i"), SEP_ID]
    ref = h.predict(["hi"])[0]
    outs = h.predict([b"hi", {"text": "hi"}, ids.tolist(), {"input_ids": ids.tolist()}, ids])
    assert all(o == ref for o in outs)
    # A ragged batch is padded and masked: each row scores as it does alone.
    short = h.predict([ids.tolist()])[0]
    long_ = h.predict([h.tokenize("a much longer sentence").tolist()])[0]
    both = h.predict([[ids.tolist(), h.tokenize("a much longer sentence").tolist()]])[0]
    assert both["label"] == [short["label"], long_["label"]]
    assert both["score"] == pytest.approx([short["score"], long_["score"]], rel=1e-4)
    batch = h.predict([["hi", "hi"], torch.stack([ids, ids])])
    assert batch[0]["label"] == batch[1]["label"] == [ref["label"]] * 2


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ([5, 99999], "token ids must be in [0, 1280)"),
        ([-1, 5], "token ids must be in"),
        ([], "empty token sequence"),
        (list(range(1, 70)), "longer than 64"),
        (b"\xff\xfe", "not UTF-8"),
        ([1.5, 2.0], "integer values"),
        (torch.zeros(2, 2, 2, dtype=torch.int64), "shape [seq] or [n, seq]"),
    ],
)
def test_bad_text_payloads(payload: Any, fragment: str) -> None:
    h = loaded("bert-large")
    with pytest.raises(InputError, match=r"^input 0: ") as ei:
        h.predict([payload])
    assert fragment in str(ei.value)


def test_predict_before_load_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before load"):
        make_handler(fspec("mlp"), tiny=True).predict([[0.0] * 64])


# -- weights: files, keys, zero-copy loading ------------------------------------------------------


def test_weights_from_a_safetensors_file(tmp_path: Path, store: ModelStore) -> None:
    base = state_dict_for(fspec("mlp"), tiny=True)
    trained = {k: v + 0.5 for k, v in base.items()}  # "other" weights
    f = tmp_path / "mlp.safetensors"
    save_file(trained, str(f))
    spec = fspec("mlp", weights=str(f))
    got = state_dict_for(spec, tiny=True)
    assert all(torch.equal(got[k], trained[k]) for k in trained)
    key = weights_key(spec, tiny=True)
    assert key.startswith("file-mlp-") and key != weights_key(fspec("mlp"), tiny=True)
    h = load_handler(spec, store=store, tiny=True)
    ref = make_handler(fspec("mlp"), tiny=True)
    ref.load(trained, "cpu")
    x = [0.25] * 64
    assert h.predict([x]) == ref.predict([x])
    assert all(store.is_mapped(p, key) for p in h.module.parameters())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        state_dict_for(fspec("mlp", weights=str(tmp_path / "nope.safetensors")))


def test_weights_keys() -> None:
    assert weights_key(fspec("resnet50"), tiny=False) == weights_key(
        load_function_spec({"name": "other-fn", "model": "resnet50"}), tiny=False
    )
    assert weights_key(fspec("resnet50"), tiny=True) != weights_key(fspec("resnet50"), tiny=False)
    assert weights_key(fspec("bert-base"), tiny=False) != weights_key(
        fspec("bert-large"), tiny=False
    )


def test_tiny_override_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSHARE_TINY_MODELS", "1")
    assert make_handler(fspec("resnet50")).input_spec()[0].shape == (-1, 3, 32, 32)
    assert "-tiny-" in weights_key(fspec("resnet50"))
    monkeypatch.setenv("GSHARE_TINY_MODELS", "0")
    assert make_handler(fspec("resnet50")).input_spec()[0].shape == (-1, 3, 224, 224)


def test_load_weights_is_zero_copy_and_strict() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.bn = nn.BatchNorm1d(3)
            self.register_buffer("scale", torch.ones(3), persistent=False)

    w = {k: v.clone() for k, v in Net().state_dict().items()}
    m = build_on_meta(Net)
    assert m.lin.weight.is_meta and not m.scale.is_meta  # buffers stay real
    load_weights(m, w)
    assert shares_weights(m, w) and m.lin.weight.data_ptr() == w["lin.weight"].data_ptr()
    assert not m.lin.weight.requires_grad
    # Non-persistent buffers may be given too (they are adopted as well).
    m2 = build_on_meta(Net)
    load_weights(m2, {**w, "scale": torch.full((3,), 2.0)})
    assert m2.scale.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(KeyError, match="lack"):
        load_weights(build_on_meta(Net), {k: v for k, v in w.items() if k != "lin.bias"})
    with pytest.raises(KeyError, match="the model lacks"):
        load_weights(build_on_meta(Net), {**w, "extra": torch.zeros(1)})


def test_builtin_loaded_from_the_store_maps_every_weight(store: ModelStore) -> None:
    spec = fspec("bert-base")
    h = load_handler(spec, store=store, tiny=True)
    key = weights_key(spec, tiny=True)
    assert store.has(key)
    w = store.get(key)
    assert shares_weights(h.module, w)
    assert all(store.is_mapped(t, key) for t in h.module.state_dict().values() if t.numel())
    # Non-persistent buffers (position ids) were built, not left on meta.
    assert not any(b.is_meta for b in h.module.buffers())
    assert h.predict(["shared"]) == loaded("bert-base").predict(["shared"])


# -- user handlers --------------------------------------------------------------------------------


def test_example_handler_with_the_store(store: ModelStore) -> None:
    spec = load_function_spec(EXAMPLES / "text-classifier.yaml")
    h = load_handler(spec, store=store)
    assert isinstance(h, Handler)
    key = weights_key(spec)
    assert store.has(key)
    assert all(store.is_mapped(p, key) for p in h.model.parameters())  # type: ignore[attr-defined]
    one, batch, raw = h.predict([h.example_input(), ["good", "bad"], b"good"])
    assert one["label"] in ("negative", "positive") and 0.5 <= one["score"] <= 1.0
    assert batch["label"][0] == raw["label"]
    assert h.input_spec()[0].datatype == "BYTES"  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="input 0"):
        h.predict([12])
    # Without a store the handler still works on its own copy.
    own = make_handler(spec)
    own.load(None, "cpu")
    assert own.predict(["good"]) == h.predict(["good"])


def test_handler_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "echo.py").write_text(
        "class Echo:\n"
        "    def load(self, weights, device):\n"
        "        self.device = device\n"
        "    def predict(self, inputs):\n"
        "        return [{'echo': x} for x in inputs]\n"
        "class NoPredict:\n"
        "    def load(self, weights, device): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_function_spec({"name": "echo", "handler": "userpkg.echo:Echo"})
    h = load_handler(spec)
    assert h.predict([1, "a"]) == [{"echo": 1}, {"echo": "a"}]
    assert state_dict_for(spec) == {}
    with pytest.raises(TypeError, match="lacks predict"):
        handler_class("userpkg.echo:NoPredict")
    with pytest.raises(AttributeError, match="has no 'Missing'"):
        handler_class("userpkg.echo:Missing")
    with pytest.raises(ModuleNotFoundError):
        handler_class("userpkg.nothere:Echo")
    with pytest.raises(ImportError, match="no file"):
        handler_class(str(tmp_path / "nothere.py") + ":Echo")


def test_input_decoding_of_numpy_and_float64() -> None:
    h = loaded("mlp")
    x = np.linspace(0, 1, 64)  # float64 → float32
    a = h.predict([x])[0]
    b = h.predict([struct.pack("<64f", *x.tolist())])[0]
    assert a["label"] == b["label"]
