"""Image payloads and the image-to-image built-ins: the models of ESG-like pipelines
(super-resolution → segmentation / depth / classification).

Built from ``transformers`` configurations written here (random weights seeded by the model
name, never downloaded), like every built-in (``builtin_base.TorchClassifier``):

=========  =================================================  =======  ======  ================
model      architecture (``transformers`` configuration)      params   input   output (one item)
=========  =================================================  =======  ======  ================
swin2sr    Swin2SRForImageSuperResolution, x2, embed 60,      0.39 M   64x64   ``image`` FP32
           2 stages x 4 blocks, 6 heads, window 8                              [3, 128, 128]
segformer  SegformerForSemanticSegmentation, MiT-b0,          3.75 M   128x128 ``segmentation``
           decoder 256, 150 classes (ADE20k-sized)                             INT64 [128, 128]
dpt        DPTForDepthEstimation, ViT-S/16 backbone (384 x 6  14.9 M   128x128 ``depth`` FP32
           layers, 6 heads), neck 48-384, fusion 64                            [128, 128]
=========  =================================================  =======  ======  ================

Per-item latency on this repository's 2-core CPU VM at batch 1: ``predict`` on one core (one
torch thread, JSON stage-form input and output) swin2sr ≈ 200 ms, segformer ≈ 45 ms, dpt ≈ 50
ms (resnet50 ≈ 110 ms, vit-base ≈ 400 ms); through the gateway at the shares of
``examples/*.yaml`` (``sm_pct: 50``), one request at a time, swin2sr 199 ms, and on swin2sr's
output segformer 85 ms, dpt 114 ms, resnet50 164 ms. ``tiny`` (tests) builds each from a
small configuration of the same architecture at 16x16 (swin2sr) or 32x32.

Image inputs (``decode_images``; the image classifiers resnet50 and vit-base decode the same
way). One payload is ONE image ``[3, H, W]`` or a batch ``[n, 3, H, W]``, FP32 values in
[0, 1], given as:

* a ``torch.Tensor`` or ``numpy.ndarray`` (an Open Inference Protocol request: input
  ``input`` FP32 ``[n, 3, -1, -1]``);
* a JSON nested list, or ``{"data": [...flat or nested...], "shape": [...]}``;
* raw little-endian float32 ``bytes`` of whole images at the model's input size (k images
  when it holds k; the bytes carry no shape, so no other size);
* the **stage form** ``{"image": <any of the above>}`` — what an image-to-image model answers,
  so a workflow stage after swin2sr gets exactly its predecessor's output as its input.

Any height and width (at most ``MAX_SIDE``) is accepted and resized to the model's input size
with ``torch.nn.functional.interpolate`` (bilinear, antialiased when shrinking); a payload that
must be resized holds at most ``MAX_RESIZED_IMAGES`` images. Bad payloads raise ``InputError``
naming the problem (shape, NaN, size); ``predict`` prefixes the payload's index.

Outputs — the same key over every transport, the value's form following the payload's:

* JSON and raw payloads (``/function``, workflow stages) get the **stage form**: one key with
  ``{"data": [flat values], "shape": [...]}`` — ``{"image": {"data", "shape": [3, H2, W2]}}``
  from swin2sr (values clamped to [0, 1] and rounded to 4 decimals: far below 8-bit
  precision, and half the JSON of full float32 values), ``{"segmentation": {"data": [class
  ids], "shape": [H, W]}}`` from segformer (the arg-max class per pixel, logits upsampled to
  the input size), ``{"depth": {"data", "shape": [H, W]}}`` from dpt; a batch payload gets
  one more leading dimension ``n`` in ``shape``. The image form is exactly what every image
  model decodes, so chains swin2sr → resnet50 / vit-base / segformer / dpt need no glue.
* tensor payloads (Open Inference Protocol requests, in-process calls) get tensors: ``{"image":
  FP32 [n, 3, H2, W2]}``, ``{"segmentation": INT64 [n, H, W]}``, ``{"depth": FP32 [n, H, W]}``
  (``output_spec()``; a single ``[3, H, W]`` tensor gets outputs without the ``n``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gshare.runtime.instance.builtin_base import (
    TorchClassifier,
    as_tensor,
    fmt_shape,
    from_float_bytes,
)
from gshare.runtime.instance.models import InputError, TensorSpec

MAX_SIDE: Final[int] = 4096
"""Largest accepted image height or width (before the resize)."""
MAX_RESIZED_IMAGES: Final[int] = 64
"""Most images in one payload that must be resized (resizing small images up multiplies the
memory a payload takes; payloads at the input size are bounded by the body limit)."""
IMAGE_DECIMALS: Final[int] = 4
"""Decimals of the image values in the JSON stage form."""


def decode_images(payload: Any, size: int, what: str = "an image") -> tuple[torch.Tensor, bool]:
    """One image payload (module doc) → ``[k, 3, size, size]`` FP32 on the CPU, and whether it
    was a batch. ``InputError`` naming the problem."""
    native = (3, size, size)
    if isinstance(payload, bytes | bytearray | memoryview):
        t, batched = from_float_bytes(payload, native)
    else:
        if isinstance(payload, Mapping) and "data" not in payload:
            if "image" not in payload:
                keys = ", ".join(repr(str(k)) for k in list(payload)[:5])
                raise InputError(
                    "an image mapping needs 'image' (a previous stage's output) or 'data' and "
                    f"'shape', got keys {keys or 'none'}"
                )
            payload = payload["image"]  # the stage form
            if isinstance(payload, bytes | bytearray | memoryview):
                return decode_images(payload, size, what)
        t = as_tensor(payload, torch.float32)
        if t.dim() == 3 and t.shape[0] == 3:
            t, batched = t.unsqueeze(0), False
        elif t.dim() == 4 and t.shape[1] == 3 and t.shape[0] > 0:
            batched = True
        else:
            raise InputError(
                f"expected {what} of shape {fmt_shape(native)} or [n, {fmt_shape(native)[1:]}, "
                f"got {fmt_shape(t.shape)} (another height and width is resized to "
                f"{size}x{size})"
            )
        h, w = int(t.shape[-2]), int(t.shape[-1])
        if not (0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE):
            raise InputError(
                f"{what} of {h}x{w} pixels: height and width must be in [1, {MAX_SIDE}]"
            )
    if not torch.isfinite(t).all():
        raise InputError(f"{what} contains NaN or infinite values")
    if tuple(t.shape[-2:]) != (size, size):
        if t.shape[0] > MAX_RESIZED_IMAGES:
            raise InputError(
                f"{t.shape[0]} images to resize in one payload: at most {MAX_RESIZED_IMAGES} "
                f"(send {size}x{size} images, or fewer per request)"
            )
        t = F.interpolate(
            t, size=(size, size), mode="bilinear", align_corners=False, antialias=True
        )
    return t.contiguous(), batched


def stage_form(t: torch.Tensor, decimals: int | None = None) -> dict[str, Any]:
    """A tensor as ``{"data": [flat values], "shape": [...]}`` (floats rounded to ``decimals``
    when given: the shortest JSON)."""
    flat = t.detach().cpu().reshape(-1)
    if decimals is not None and flat.is_floating_point():
        flat = flat.double().round(decimals=decimals)
    return {"data": flat.tolist(), "shape": list(t.shape)}


class ImageModel(TorchClassifier):
    """Base of the image-to-image built-ins: images in (``decode_images``), one dense tensor per
    image out under ``output_name`` (module doc for the forms).

    Subclasses give ``config()`` / ``build()`` (as every built-in), ``image_size`` (the
    model's square input), ``output_item_shape`` / ``output_datatype`` (one item's output) and
    ``infer(x)``: ``[n, 3, S, S]`` on the model's device → the outputs ``[n, ...]``.
    """

    output_name: str = ""
    output_datatype: str = "FP32"
    output_decimals: int | None = None
    """Decimals of the JSON output values (None: float32 values as they are)."""

    @property
    def image_size(self) -> int:
        raise NotImplementedError

    @property
    def output_item_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        t, batched = decode_images(payload, self.image_size)
        return list(t.unbind(0)), batched

    def predict(self, inputs: list[Any]) -> list[Any]:
        """One ``{output_name: ...}`` per payload: tensors for tensor payloads, the JSON
        stage form otherwise (module doc)."""
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__}.predict before load")
        decoded: list[tuple[torch.Tensor, bool]] = []
        for i, x in enumerate(inputs):
            try:
                decoded.append(decode_images(x, self.image_size))
            except InputError as e:
                raise InputError(f"input {i}: {e}") from None
        if not decoded:
            return []
        x = torch.cat([t for t, _ in decoded]).to(self.device, self._param_dtype())
        with torch.no_grad():
            y = self.infer(x).cpu()
        out: list[Any] = []
        pos = 0
        for payload, (t, batched) in zip(inputs, decoded, strict=True):
            n = int(t.shape[0])
            part = y[pos : pos + n] if batched else y[pos]
            pos += n
            if isinstance(payload, torch.Tensor | np.ndarray):
                out.append({self.output_name: part.clone()})
            else:
                out.append({self.output_name: stage_form(part, self.output_decimals)})
        return out

    def example_input(self) -> dict[str, Any]:
        """One image at the input size, in the stage form (values in [0, 1])."""
        g = torch.Generator().manual_seed(0)
        img = torch.rand((3, self.image_size, self.image_size), generator=g)
        return {"image": stage_form(img)}

    def input_spec(self) -> list[TensorSpec]:
        return [TensorSpec("input", (-1, 3, -1, -1), "FP32")]

    def output_spec(self) -> list[TensorSpec]:
        return [TensorSpec(self.output_name, (-1, *self.output_item_shape), self.output_datatype)]


class Swin2SRHandler(ImageModel):
    """``swin2sr``: x2 super-resolution, image → image (values clamped to [0, 1])."""

    model_name = "swin2sr"
    output_name = "image"
    output_decimals = IMAGE_DECIMALS

    def config(self) -> Any:
        from transformers import Swin2SRConfig  # lazy: transformers is heavy

        # The published lightweight x2 model's width (embed 60, 6 heads, window 8, MLP ratio 2,
        # pixel-shuffle-direct upsampler) at half its depth: 2 stages of 4 blocks, not 4 of 6.
        kw: dict[str, Any] = {
            "upscale": 2,
            "upsampler": "pixelshuffledirect",
            "window_size": 8,
            "mlp_ratio": 2.0,
            "image_size": 64,
            "embed_dim": 60,
            "depths": [4, 4],
            "num_heads": [6, 6],
        }
        if self.tiny:
            kw.update(image_size=16, embed_dim=12, depths=[1], num_heads=[2])
        return Swin2SRConfig(**kw)

    @property
    def image_size(self) -> int:
        return int(self.cfg.image_size)

    @property
    def output_item_shape(self) -> tuple[int, ...]:
        s = self.image_size * int(self.cfg.upscale)
        return (3, s, s)

    def build(self) -> nn.Module:
        from transformers import Swin2SRForImageSuperResolution  # lazy: transformers is heavy

        return Swin2SRForImageSuperResolution(self.cfg)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        assert self.module is not None
        out = self.module(pixel_values=x).reconstruction
        return out.float().clamp(0.0, 1.0)  # type: ignore[no-any-return]


class SegformerHandler(ImageModel):
    """``segformer``: semantic segmentation, image → the arg-max class of every pixel."""

    model_name = "segformer"
    output_name = "segmentation"
    output_datatype = "INT64"

    def config(self) -> Any:
        from transformers import SegformerConfig  # lazy: transformers is heavy

        if self.tiny:
            kw: dict[str, Any] = {
                "num_encoder_blocks": 2,
                "depths": [1, 1],
                "sr_ratios": [2, 1],
                "hidden_sizes": [8, 16],
                "patch_sizes": [7, 3],
                "strides": [4, 2],
                "num_attention_heads": [1, 1],
                "mlp_ratios": [2, 2],
                "decoder_hidden_size": 16,
                "num_labels": 5,
            }
        else:  # defaults: MiT-b0 encoder, all-MLP decoder of 256; ADE20k's 150 classes
            kw = {"num_labels": 150}
        return SegformerConfig(**kw)

    @property
    def image_size(self) -> int:
        return 32 if self.tiny else 128

    @property
    def output_item_shape(self) -> tuple[int, ...]:
        return (self.image_size, self.image_size)

    def build(self) -> nn.Module:
        from transformers import SegformerForSemanticSegmentation  # lazy: transformers is heavy

        return SegformerForSemanticSegmentation(self.cfg)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        assert self.module is not None
        logits = self.module(pixel_values=x).logits  # [n, classes, S/4, S/4]
        logits = F.interpolate(
            logits.float(), size=x.shape[-2:], mode="bilinear", align_corners=False
        )
        return logits.argmax(dim=1)


class DPTHandler(ImageModel):
    """``dpt``: monocular depth estimation, image → a relative depth per pixel."""

    model_name = "dpt"
    output_name = "depth"

    def config(self) -> Any:
        from transformers import DPTConfig  # lazy: transformers is heavy

        if self.tiny:
            kw: dict[str, Any] = {
                "image_size": 32,
                "patch_size": 8,
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "backbone_out_indices": [0, 1, 2, 3],
                "neck_hidden_sizes": [8, 16, 32, 64],
                "fusion_hidden_size": 16,
            }
        else:  # a ViT-S/16 backbone (DPT-Large's is ViT-L/16), no hybrid, 128x128
            kw = {
                "image_size": 128,
                "patch_size": 16,
                "hidden_size": 384,
                "num_hidden_layers": 6,
                "num_attention_heads": 6,
                "intermediate_size": 1536,
                "backbone_out_indices": [1, 2, 4, 5],
                "neck_hidden_sizes": [48, 96, 192, 384],
                "fusion_hidden_size": 64,
            }
        return DPTConfig(is_hybrid=False, **kw)

    @property
    def image_size(self) -> int:
        return int(self.cfg.image_size)

    @property
    def output_item_shape(self) -> tuple[int, ...]:
        return (self.image_size, self.image_size)

    def build(self) -> nn.Module:
        from transformers import DPTForDepthEstimation  # lazy: transformers is heavy

        return DPTForDepthEstimation(self.cfg)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        assert self.module is not None
        depth = self.module(pixel_values=x).predicted_depth.float()  # [n, S, S]
        if tuple(depth.shape[-2:]) != tuple(x.shape[-2:]):
            depth = F.interpolate(
                depth.unsqueeze(1), size=x.shape[-2:], mode="bilinear", align_corners=False
            ).squeeze(1)
        return depth  # type: ignore[no-any-return]


IMAGE_HANDLERS: Final[Mapping[str, type[ImageModel]]] = {
    "swin2sr": Swin2SRHandler,
    "segformer": SegformerHandler,
    "dpt": DPTHandler,
}
"""The image-to-image built-ins by model name (registered in ``builtin_models``)."""


__all__ = [
    "IMAGE_DECIMALS",
    "IMAGE_HANDLERS",
    "MAX_RESIZED_IMAGES",
    "MAX_SIDE",
    "DPTHandler",
    "ImageModel",
    "SegformerHandler",
    "Swin2SRHandler",
    "decode_images",
    "stage_form",
]
