"""Issue 10, models for real pipelines: the image-to-image built-ins (swin2sr, segformer, dpt),
the image payload forms every image model decodes (any size, resized; the stage form of an
image model's output), their outputs and errors — in-process with the tiny configurations —,
the shipped example specs, and one real ``gshare serve`` running swin2sr → resnet50 as a
workflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gshare.runtime.instance.builtin_models import BUILTIN_HANDLERS, BUILTIN_MODELS
from gshare.runtime.instance.image_models import (
    IMAGE_HANDLERS,
    MAX_RESIZED_IMAGES,
    MAX_SIDE,
    decode_images,
)
from gshare.runtime.instance.loading import make_handler, state_dict_for
from gshare.runtime.instance.models import InputError, TensorSpec, build_on_meta, shares_weights
from gshare.spec import load_function_spec
from gshare.testing import ServeProcess
from gshare.workflows.spec import load_workflow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
IMAGE_MODELS = ("swin2sr", "segformer", "dpt")
# tiny configurations: input size, output key, one item's output shape
TINY = {
    "swin2sr": (16, "image", [3, 32, 32]),
    "segformer": (32, "segmentation", [32, 32]),
    "dpt": (32, "depth", [32, 32]),
}


def loaded(model: str) -> Any:
    h = make_handler(load_function_spec({"name": "f", "model": model}), tiny=True)
    h.load(None, "cpu")
    return h


@pytest.fixture(scope="module")
def handlers() -> dict[str, Any]:
    return {m: loaded(m) for m in (*IMAGE_MODELS, "resnet50", "vit-base")}


def image(h: int, w: int, n: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand((3, h, w) if n is None else (n, 3, h, w), generator=g)


def roundtrip(x: Any) -> Any:
    """What the next workflow stage receives: the output as JSON, parsed."""
    return json.loads(json.dumps(x))


def test_registered_as_builtins() -> None:
    assert set(IMAGE_MODELS) <= set(BUILTIN_MODELS)
    assert tuple(BUILTIN_HANDLERS) == BUILTIN_MODELS
    assert all(BUILTIN_HANDLERS[m] is IMAGE_HANDLERS[m] for m in IMAGE_MODELS)


# -- full configurations: sizes and OIP specs without allocating ---------------------------------


@pytest.mark.parametrize(
    ("model", "params_m", "out"),
    [
        ("swin2sr", 0.389, TensorSpec("image", (-1, 3, 128, 128), "FP32")),
        ("segformer", 3.753, TensorSpec("segmentation", (-1, 128, 128), "INT64")),
        ("dpt", 14.878, TensorSpec("depth", (-1, 128, 128), "FP32")),
    ],
)
def test_full_configurations(model: str, params_m: float, out: TensorSpec) -> None:
    h = BUILTIN_HANDLERS[model](tiny=False)
    m = build_on_meta(h.build)
    assert sum(p.numel() for p in m.parameters()) / 1e6 == pytest.approx(params_m, rel=0.01)
    assert h.input_spec() == [TensorSpec("input", (-1, 3, -1, -1), "FP32")]
    assert h.output_spec() == [out]


# -- outputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", IMAGE_MODELS)
def test_outputs_carry_their_shapes(model: str, handlers: dict[str, Any]) -> None:
    h = handlers[model]
    size, key, shape = TINY[model]
    x = h.example_input()
    assert x["image"]["shape"] == [3, size, size]  # the stage form, at the input size
    one, other_size, batch, tensor, tensor_batch = h.predict(
        [x, image(7, 45).tolist(), {"data": image(size, size, n=2).reshape(-1).tolist(),
         "shape": [2, 3, size, size]}, image(size, size), image(9, 9, n=3)]
    )  # fmt: skip
    assert list(one) == [key] and one[key]["shape"] == shape
    assert len(one[key]["data"]) == int(np.prod(shape))
    assert other_size[key]["shape"] == shape  # any H, W: resized
    assert batch[key]["shape"] == [2, *shape]
    assert isinstance(tensor[key], torch.Tensor) and list(tensor[key].shape) == shape
    assert list(tensor_batch[key].shape) == [3, *shape]
    assert tensor[key].dtype == (torch.int64 if model == "segformer" else torch.float32)
    json.dumps(one)
    assert h.predict([]) == []
    again = h.predict([x])[0][key]  # deterministic (up to the batch's float rounding)
    assert again["shape"] == shape
    assert np.allclose(again["data"], one[key]["data"], rtol=1e-4, atol=1e-6)


def test_output_values(handlers: dict[str, Any]) -> None:
    sr = handlers["swin2sr"].predict([image(16, 16).tolist()])[0]["image"]
    assert min(sr["data"]) >= 0.0 and max(sr["data"]) <= 1.0  # clamped
    assert all(round(v, 4) == v for v in sr["data"][:100])  # 4 decimals in JSON
    seg = handlers["segformer"].predict([image(32, 32).tolist()])[0]["segmentation"]
    assert all(isinstance(v, int) and 0 <= v < 5 for v in seg["data"])  # tiny: 5 classes
    depth = handlers["dpt"].predict([image(32, 32).tolist()])[0]["depth"]
    assert min(depth["data"]) >= 0.0


def test_payload_forms_agree(handlers: dict[str, Any]) -> None:
    h = handlers["swin2sr"]
    img = image(16, 16)
    ref = h.predict([img])[0]["image"]
    forms = [
        img.tolist(),
        img.numpy(),
        img.numpy().astype("<f4").tobytes(),
        {"data": img.reshape(-1).tolist(), "shape": [3, 16, 16]},
        {"image": img.tolist()},
        {"image": {"data": img.reshape(-1).tolist(), "shape": [3, 16, 16]}},
        {"image": img.numpy().astype("<f4").tobytes()},
    ]
    for i, out in enumerate(h.predict(forms)):
        got = out["image"]
        got = got["data"] if isinstance(got, dict) else got.reshape(-1).tolist()
        assert got == pytest.approx(ref.reshape(-1).tolist(), abs=1e-4), i


def test_resize_is_bilinear_to_the_input_size() -> None:
    t, batched = decode_images(image(40, 24), 16)
    assert tuple(t.shape) == (1, 3, 16, 16) and not batched
    ref = torch.nn.functional.interpolate(
        image(40, 24).unsqueeze(0), size=(16, 16), mode="bilinear", antialias=True
    )
    assert torch.allclose(t, ref)
    same, _ = decode_images(image(16, 16), 16)
    assert torch.equal(same[0], image(16, 16))  # the input size: untouched
    t, batched = decode_images(image(4, 4, n=MAX_RESIZED_IMAGES), 16)
    assert tuple(t.shape) == (MAX_RESIZED_IMAGES, 3, 16, 16) and batched


# -- chains: an image model's output is the next stage's input as it comes ----------------------


@pytest.mark.parametrize("succ", ["resnet50", "vit-base", "segformer", "dpt", "swin2sr"])
def test_a_stage_takes_swin2sr_output_as_it_comes(succ: str, handlers: dict[str, Any]) -> None:
    sr = handlers["swin2sr"]
    one, batch = sr.predict([image(20, 20).tolist(), image(16, 16, n=2).numpy().tobytes()])
    out_one, out_batch = handlers[succ].predict([roundtrip(one), roundtrip(batch)])
    if succ in ("resnet50", "vit-base"):
        assert isinstance(out_one["label"], int) and 0.0 < out_one["score"] <= 1.0
        assert len(out_batch["label"]) == 2
    else:
        key = TINY[succ][1]
        assert out_one[key]["shape"] == TINY[succ][2]
        assert out_batch[key]["shape"] == [2, *TINY[succ][2]]


def test_classifiers_resize_images_too(handlers: dict[str, Any]) -> None:
    h = handlers["resnet50"]  # tiny: 32x32
    big = image(32, 32)
    (out,) = h.predict([torch.nn.functional.interpolate(big[None], size=(64, 64))[0]])
    assert isinstance(out["label"], int)
    assert h.input_spec() == [TensorSpec("input", (-1, 3, 32, 32), "FP32")]  # OIP: unchanged


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ([[1.0, 2.0]], "expected an image of shape [3, 16, 16] or [n, 3, 16, 16], got [1, 2]"),
        (torch.zeros(4, 16, 16), "got [4, 16, 16] (another height and width is resized"),
        (b"\x00" * 12, "raw payload of 12 bytes"),
        ({"pixels": [1.0]}, "needs 'image' (a previous stage's output) or 'data'"),
        ({"image": "abc"}, "unsupported payload type str"),
        ("a string", "unsupported payload type str"),
        ([[[1.0]], [[2.0, 3.0]]], "regular shape"),
        ({"data": [1.0, 2.0, 3.0], "shape": [2, 2]}, "do not fit"),
        (torch.full((3, 16, 16), float("nan")), "NaN or infinite"),
        ({"image": {"data": [float("inf")] * 3, "shape": [3, 1, 1]}}, "NaN or infinite"),
        (torch.zeros(3, 0, 5), "height and width must be in [1, 4096]"),
        (torch.zeros(3, 1, MAX_SIDE + 1), "1x4097 pixels"),
        (torch.zeros(MAX_RESIZED_IMAGES + 1, 3, 2, 2), "at most 64"),
        (torch.zeros(0, 3, 16, 16), "got [0, 3, 16, 16]"),
    ],
)
def test_bad_payloads_raise_input_error_naming_the_index(
    payload: Any, fragment: str, handlers: dict[str, Any]
) -> None:
    h = handlers["swin2sr"]
    with pytest.raises(InputError) as ei:
        h.predict([h.example_input(), payload])
    assert str(ei.value).startswith("input 1: ") and fragment in str(ei.value), str(ei.value)


def test_predict_before_load_and_random_weights_from_the_store() -> None:
    spec = load_function_spec({"name": "f", "model": "segformer"})
    with pytest.raises(RuntimeError, match="before load"):
        make_handler(spec, tiny=True).predict([image(32, 32)])
    w = state_dict_for(spec, tiny=True)
    h = make_handler(spec, tiny=True)
    h.load(w, "cpu")  # adopts the shared tensors (what instances do with the model store)
    assert shares_weights(h.module, w)
    x = h.example_input()
    assert h.predict([x]) == loaded("segformer").predict([x])


# -- examples -----------------------------------------------------------------------------------


def test_every_example_spec_loads() -> None:
    functions = {p.name: load_function_spec(p) for p in sorted(EXAMPLES.glob("*.yaml"))}
    names = {s.name for s in functions.values()}
    for m in IMAGE_MODELS:
        s = functions[f"{m}.yaml"]
        assert s.model == m and s.device == "cpu" and s.min_instances == 1 and s.slo_ms
    workflows = {p.stem: load_workflow(p, known_functions=names) for p in
                 sorted((EXAMPLES / "workflows").glob("*.yaml"))}  # fmt: skip
    assert {"image-classification", "depth", "scene"} <= set(workflows)
    for name, wf in workflows.items():
        assert wf.name == name and wf.slo_ms > 0
    assert workflows["image-classification"].is_chain()
    assert workflows["scene"].sinks() == ("seg", "depth")


# -- live: a real gshare serve runs swin2sr -> resnet50 as a workflow ------------------------------


@pytest.mark.slow
def test_swin2sr_then_resnet50_as_a_live_workflow(tmp_path: Path) -> None:
    with ServeProcess(state_dir=tmp_path / "state", tiny_models=True, cwd=REPO) as srv:
        c = srv.client()
        for f in ("swin2sr", "resnet50"):
            spec = load_function_spec(EXAMPLES / f"{f}.yaml").model_dump(mode="json")
            c.deploy({**spec, "device": "cpu"})
        c.deploy_workflow(EXAMPLES / "workflows" / "image-classification.yaml")
        # any size, JSON: resized to swin2sr's (tiny) 16x16, its [3, 32, 32] output to resnet50
        out = c.invoke_workflow("image-classification", image(24, 20).tolist())
        assert isinstance(out["label"], int) and 0.0 < out["score"] <= 1.0
        sr = c.invoke("swin2sr", {"data": image(16, 16).reshape(-1).tolist(), "shape": [3, 16, 16]})
        assert sr["image"]["shape"] == [3, 32, 32] and len(sr["image"]["data"]) == 3 * 32 * 32
        assert c.invoke("resnet50", sr)["label"] == c.invoke("resnet50", sr)["label"]
        # Open Inference Protocol: any H, W in, the declared FP32 [n, 3, 32, 32] out
        x = image(10, 12, n=2)
        got = c.infer("swin2sr", [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}])  # fmt: skip
        (o,) = got["outputs"]
        assert (o["name"], o["datatype"], o["shape"]) == ("image", "FP32", [2, 3, 32, 32])
