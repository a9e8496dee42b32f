"""Kernel launches per eager inference forward of torchvision's image classifiers, counted from
their architectures (an approximation, not a measurement).

``COUNTS[name]`` is the number of GPU kernels one forward pass of torchvision's default
constructor ``name()`` (no weights, ``model.eval()``, PyTorch eager, cuDNN, no
``torch.compile``, no AMP) is taken to launch. It does not depend on the batch size or the input
resolution (224x224; 299x299 for inception_v3). The simulator uses it per model: the host-side
launch work a time-slicing hook throttles scales with it. torchvision is not imported: each
family below is one function of the facts of its configuration (stage depths, block settings,
where residuals, SE blocks and projections are), written from the architectures' definitions.

Counting rules, in kernels per op executed in eval mode:

* ``Conv2d``: 1, plus 1 when it has a bias (cuDNN adds the bias in a separate kernel). Convs
  followed by a BatchNorm have no bias; AlexNet's, VGG's (with or without BN), SqueezeNet's, the
  SE blocks' 1x1 convs, ConvNeXt's and a few of MaxViT's have one.
* ``BatchNorm2d``, ``LayerNorm`` (also ConvNeXt's ``LayerNorm2d``), ``Linear`` (addmm fuses the
  bias): 1 each.
* Activations (ReLU, ReLU6, SiLU, Hardswish, Hardsigmoid, Sigmoid, GELU, Tanh, Softmax): 1 each,
  in place or not.
* Pooling (max, average, adaptive average) and ``x.mean([2, 3])``: 1 each.
* Elementwise ops of the forward code: residual add, multiply (SE scale, layer scale, MaxViT's
  key scaling), ``torch.cat``: 1 each; an index (gather) is 1.
* Copies: 1 where the code itself makes a permuted / transposed tensor contiguous
  (``.contiguous()``, or a ``reshape`` that cannot be a view). Copies that ATen makes
  implicitly (a LayerNorm or matmul given a non-contiguous input) are not counted.
* 0: view / reshape of contiguous data, flatten, permute, transpose, chunk, Dropout,
  StochasticDepth and Identity in eval, branches that run only in training (GoogLeNet's and
  Inception v3's auxiliary classifiers).

Run ``python tools/model_ops.py`` to write ``src/gshare/data/torchvision_kernels.csv``
(columns ``model,kernels``, sorted by model), ``--check`` to exit 1 if that file differs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

CSV_PATH = (
    Path(__file__).resolve().parents[1] / "src" / "gshare" / "data" / "torchvision_kernels.csv"
)

# Kernels per op (see the module docstring).
CONV = 1  # Conv2d without bias
CONV_B = 2  # Conv2d with bias: the convolution, then the bias add
BN = LN = LINEAR = MATMUL = ACT = POOL = ADD = MUL = CAT = COPY = GATHER = 1

CONV_BN = CONV + BN
CONV_BN_ACT = CONV + BN + ACT  # torchvision's Conv2dNormActivation / BasicConv2d
# torchvision.ops.SqueezeExcitation (and MobileNetV3's): avgpool, fc1 (1x1 conv with bias),
# activation, fc2 (1x1 conv with bias), gate (Sigmoid / Hardsigmoid), scale * input.
SE = POOL + CONV_B + ACT + CONV_B + ACT + MUL  # 8
CLASSIFIER = POOL + LINEAR  # global average pool (flatten is free) + fc


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor`` the way torchvision does (never more
    than 10 % below ``v``)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# --- plain CNNs ------------------------------------------------------------------------------


def alexnet() -> int:
    """5 convs (with bias) + ReLU, 3 max pools, adaptive avgpool, 3 linears with 2 ReLUs."""
    return 5 * (CONV_B + ACT) + 3 * POOL + POOL + 3 * LINEAR + 2 * ACT


# VGG feature layouts: a number is a 3x3 conv (+ BN) + ReLU with that many channels, M a max pool.
VGG_CFGS = {
    "A": "64 M 128 M 256 256 M 512 512 M 512 512 M",
    "B": "64 64 M 128 128 M 256 256 M 512 512 M 512 512 M",
    "D": "64 64 M 128 128 M 256 256 256 M 512 512 512 M 512 512 512 M",
    "E": "64 64 M 128 128 M 256 256 256 256 M 512 512 512 512 M 512 512 512 512 M",
}


def vgg(cfg: str, batch_norm: bool) -> int:
    """Each conv keeps its bias even with BN; then avgpool (7x7) and 3 linears with 2 ReLUs."""
    conv = CONV_B + (BN if batch_norm else 0) + ACT
    features = sum(POOL if v == "M" else conv for v in VGG_CFGS[cfg].split())
    return features + POOL + 3 * LINEAR + 2 * ACT


# SqueezeNet features after the stem conv + ReLU: M = max pool, F = Fire module.
SQUEEZENET = {"1_0": "MFFFMFFFFMF", "1_1": "MFFMFFMFFFF"}


def squeezenet(version: Literal["1_0", "1_1"]) -> int:
    """Stem conv (bias) + ReLU, max pools and Fire modules (squeeze conv + ReLU, expand 1x1 conv
    + ReLU, expand 3x3 conv + ReLU, cat; all convs with bias); head: conv (bias), ReLU, avgpool.
    Both versions have 3 max pools and 8 Fire modules, so the same count."""
    fire = 3 * (CONV_B + ACT) + CAT
    features = sum(fire if op == "F" else POOL for op in SQUEEZENET[version])
    return CONV_B + ACT + features + CONV_B + ACT + POOL


# --- ResNet family ---------------------------------------------------------------------------


def resnet(block: Literal["basic", "bottleneck"], layers: Sequence[int]) -> int:
    """ResNet / ResNeXt / Wide ResNet (groups and widths change no op count).

    Stem conv, BN, ReLU, max pool; a BasicBlock is 2 x (conv, BN) + 1 ReLU between + add +
    ReLU = 7, a Bottleneck 3 x (conv, BN) + 2 ReLUs between + add + ReLU = 10; a downsample
    (conv, BN) where the stride or the width changes; avgpool + fc.
    """
    expansion = 1 if block == "basic" else 4
    per_block = 7 if block == "basic" else 10
    total = CONV_BN_ACT + POOL
    inplanes = 64
    for i, n in enumerate(layers):
        planes, stride = 64 * 2**i, 1 if i == 0 else 2
        total += n * per_block
        if stride != 1 or inplanes != planes * expansion:
            total += CONV_BN
        inplanes = planes * expansion
    return total + CLASSIFIER


def densenet(block_config: Sequence[int]) -> int:
    """DenseNet-BC (``memory_efficient`` False, ``drop_rate`` 0).

    Stem conv, BN, ReLU, max pool. A dense layer concatenates its inputs (``torch.cat``, also
    for a single tensor), then BN, ReLU, 1x1 conv, BN, ReLU, 3x3 conv = 7; each block ends with
    one more cat; a transition is BN, ReLU, conv, avgpool; then norm5, ReLU, avgpool, fc.
    """
    layer = CAT + 2 * (BN + ACT + CONV)
    transitions = len(block_config) - 1
    return (
        CONV_BN_ACT
        + POOL
        + sum(block_config) * layer
        + len(block_config) * CAT
        + transitions * (BN + ACT + CONV + POOL)
        + BN
        + ACT
        + CLASSIFIER
    )


def googlenet() -> int:
    """GoogLeNet in eval: ``transform_input`` off, the aux classifiers not run.

    BasicConv2d = conv (no bias), BN, ReLU. Stem: 3 BasicConv2d, 2 max pools. An Inception
    module: 1x1 | 1x1 -> 3x3 | 1x1 -> 3x3 | max pool -> 1x1, cat = 6 BasicConv2d + pool + cat.
    9 modules, 2 more max pools between them, then avgpool + fc.
    """
    inception = 6 * CONV_BN_ACT + POOL + CAT
    return 3 * CONV_BN_ACT + 2 * POOL + 9 * inception + 2 * POOL + CLASSIFIER


def inception_v3() -> int:
    """Inception v3 in eval: ``transform_input`` off, AuxLogits not run.

    BasicConv2d = conv (no bias), BN, ReLU. Stem: 5 BasicConv2d, 2 max pools. Mixed blocks:
    A (x3): 7 convs, avgpool, cat; B: 4 convs, max pool, cat; C (x4): 10 convs, avgpool, cat;
    D: 6 convs, max pool, cat; E (x2): 9 convs, avgpool, 3 cats (two inner, one outer).
    Head: avgpool + fc.
    """
    a = 7 * CONV_BN_ACT + POOL + CAT
    b = 4 * CONV_BN_ACT + POOL + CAT
    c = 10 * CONV_BN_ACT + POOL + CAT
    d = 6 * CONV_BN_ACT + POOL + CAT
    e = 9 * CONV_BN_ACT + POOL + 3 * CAT
    return 5 * CONV_BN_ACT + 2 * POOL + 3 * a + b + 4 * c + d + 2 * e + CLASSIFIER


# --- mobile networks -------------------------------------------------------------------------


def shufflenet_v2(stages_repeats: Sequence[int]) -> int:
    """ShuffleNetV2 (widths change no op count).

    Stem conv, BN, ReLU, max pool. A stride-1 unit chunks its input (free), runs branch2
    (1x1 conv, BN, ReLU, dw conv, BN, 1x1 conv, BN, ReLU = 8), cats, and channel-shuffles
    (``transpose(...).contiguous()``: 1 copy); a stride-2 unit (first of each stage) also runs
    branch1 (dw conv, BN, 1x1 conv, BN, ReLU = 5) on the full input. Then conv5 (conv, BN, ReLU),
    ``x.mean([2, 3])``, fc.
    """
    branch2, branch1 = 3 * CONV_BN + 2 * ACT, 2 * CONV_BN + ACT
    unit = branch2 + CAT + COPY
    total = CONV_BN_ACT + POOL
    for n in stages_repeats:
        total += n * unit + branch1
    return total + CONV_BN_ACT + POOL + LINEAR


def mobilenet_v2() -> int:
    """MobileNetV2 (width 1.0): stem conv-BN-ReLU6; inverted residuals (t, c, n, s): an expand
    1x1 conv-BN-ReLU6 when t != 1, dw conv-BN-ReLU6, 1x1 conv-BN, add when stride 1 and
    in == out; last 1x1 conv-BN-ReLU6; avgpool, fc."""
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2)]
    settings += [(6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    total, cin = CONV_BN_ACT, 32
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            total += (CONV_BN_ACT if t != 1 else 0) + CONV_BN_ACT + CONV_BN
            total += ADD if stride == 1 and cin == c else 0
            cin = c
    return total + CONV_BN_ACT + CLASSIFIER


class V3Block(NamedTuple):
    """One MobileNetV3 bneck row: input, kernel, expanded, output channels, SE, stride."""

    cin: int
    kernel: int
    expanded: int
    cout: int
    se: bool
    stride: int


# MobileNetV3 bneck rows (width 1.0, no reduced tail, no dilation).
_V3_LARGE = [
    (16, 3, 16, 16, False, 1), (16, 3, 64, 24, False, 2), (24, 3, 72, 24, False, 1),
    (24, 5, 72, 40, True, 2), (40, 5, 120, 40, True, 1), (40, 5, 120, 40, True, 1),
    (40, 3, 240, 80, False, 2), (80, 3, 200, 80, False, 1), (80, 3, 184, 80, False, 1),
    (80, 3, 184, 80, False, 1), (80, 3, 480, 112, True, 1), (112, 3, 672, 112, True, 1),
    (112, 5, 672, 160, True, 2), (160, 5, 960, 160, True, 1), (160, 5, 960, 160, True, 1),
]  # fmt: skip
_V3_SMALL = [
    (16, 3, 16, 16, True, 2), (16, 3, 72, 24, False, 2), (24, 3, 88, 24, False, 1),
    (24, 5, 96, 40, True, 2), (40, 5, 240, 40, True, 1), (40, 5, 240, 40, True, 1),
    (40, 5, 120, 48, True, 1), (48, 5, 144, 48, True, 1), (48, 5, 288, 96, True, 2),
    (96, 5, 576, 96, True, 1), (96, 5, 576, 96, True, 1),
]  # fmt: skip
MOBILENET_V3 = {
    "large": [V3Block(*row) for row in _V3_LARGE],
    "small": [V3Block(*row) for row in _V3_SMALL],
}


def mobilenet_v3(arch: Literal["large", "small"]) -> int:
    """Stem conv-BN-Hardswish; bnecks: expand conv-BN-act when expanded != in, dw conv-BN-act,
    SE (Hardsigmoid gate) where set, 1x1 conv-BN, add when stride 1 and in == out; last 1x1
    conv-BN-Hardswish; avgpool; Linear, Hardswish, Dropout, Linear."""
    total = CONV_BN_ACT
    for b in MOBILENET_V3[arch]:
        total += (CONV_BN_ACT if b.expanded != b.cin else 0) + CONV_BN_ACT
        total += (SE if b.se else 0) + CONV_BN + (ADD if b.stride == 1 and b.cin == b.cout else 0)
    return total + CONV_BN_ACT + POOL + LINEAR + ACT + LINEAR


def mnasnet(alpha: float) -> int:
    """MNASNet: stem conv-BN-ReLU, dw conv-BN-ReLU, 1x1 conv-BN; 6 stacks of inverted
    residuals (1x1 conv-BN-ReLU, dw conv-BN-ReLU, 1x1 conv-BN; add unless first of the
    stack); 1x1 conv-BN-ReLU; ``x.mean([2, 3])``; fc."""
    depths = [make_divisible(d * alpha) for d in (16, 24, 40, 80, 96, 192, 320)]
    strides_repeats = [(2, 3), (2, 3), (2, 3), (1, 2), (2, 4), (1, 1)]
    total = 2 * CONV_BN_ACT + CONV_BN
    stacks = zip(strides_repeats, depths[:-1], depths[1:], strict=True)
    for (stride, repeats), cin, cout in stacks:
        total += repeats * (2 * CONV_BN_ACT + CONV_BN) + (repeats - 1) * ADD
        total += ADD if stride == 1 and cin == cout else 0
    return total + CONV_BN_ACT + POOL + LINEAR


# --- EfficientNet ----------------------------------------------------------------------------


class MBStage(NamedTuple):
    """One EfficientNet stage: expand ratio, kernel, stride, in / out channels, layers, and
    whether it is a FusedMBConv stage (EfficientNetV2)."""

    expand: float
    kernel: int
    stride: int
    cin: int
    cout: int
    layers: int
    fused: bool = False


EFFICIENTNET_B = [
    MBStage(1, 3, 1, 32, 16, 1), MBStage(6, 3, 2, 16, 24, 2), MBStage(6, 5, 2, 24, 40, 2),
    MBStage(6, 3, 2, 40, 80, 3), MBStage(6, 5, 1, 80, 112, 3), MBStage(6, 5, 2, 112, 192, 4),
    MBStage(6, 3, 1, 192, 320, 1),
]  # fmt: skip
EFFICIENTNET_V2: dict[str, list[MBStage]] = {
    "s": [
        MBStage(1, 3, 1, 24, 24, 2, True), MBStage(4, 3, 2, 24, 48, 4, True),
        MBStage(4, 3, 2, 48, 64, 4, True), MBStage(4, 3, 2, 64, 128, 6),
        MBStage(6, 3, 1, 128, 160, 9), MBStage(6, 3, 2, 160, 256, 15),
    ],
    "m": [
        MBStage(1, 3, 1, 24, 24, 3, True), MBStage(4, 3, 2, 24, 48, 5, True),
        MBStage(4, 3, 2, 48, 80, 5, True), MBStage(4, 3, 2, 80, 160, 7),
        MBStage(6, 3, 1, 160, 176, 14), MBStage(6, 3, 2, 176, 304, 18),
        MBStage(6, 3, 1, 304, 512, 5),
    ],
    "l": [
        MBStage(1, 3, 1, 32, 32, 4, True), MBStage(4, 3, 2, 32, 64, 7, True),
        MBStage(4, 3, 2, 64, 96, 7, True), MBStage(4, 3, 2, 96, 192, 10),
        MBStage(6, 3, 1, 192, 224, 19), MBStage(6, 3, 2, 224, 384, 25),
        MBStage(6, 3, 1, 384, 640, 7),
    ],
}  # fmt: skip
# (width_mult, depth_mult) of efficientnet_b0 .. b7
EFFICIENTNET_B_SCALING = [
    (1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4), (1.4, 1.8), (1.6, 2.2), (1.8, 2.6), (2.0, 3.1),
]  # fmt: skip


def efficientnet(
    stages: Sequence[MBStage], width_mult: float = 1.0, depth_mult: float = 1.0
) -> int:
    """EfficientNet V1 / V2: stem conv-BN-SiLU; per block, MBConv = expand conv-BN-SiLU when
    the expanded width differs from the input, dw conv-BN-SiLU, SE (SiLU, Sigmoid), 1x1
    conv-BN; FusedMBConv = k x k conv-BN-SiLU + 1x1 conv-BN (or one conv-BN-SiLU when the
    expand ratio keeps the width); add when stride 1 and in == out (StochasticDepth is free);
    head 1x1 conv-BN-SiLU, avgpool, fc. Widths / depths scale as in torchvision."""
    total = CONV_BN_ACT
    for st in stages:
        cin, cout = make_divisible(st.cin * width_mult), make_divisible(st.cout * width_mult)
        for i in range(math.ceil(st.layers * depth_mult)):
            block_in, stride = (cin, st.stride) if i == 0 else (cout, 1)
            expanded = make_divisible(block_in * st.expand)
            if st.fused:
                total += CONV_BN_ACT + CONV_BN if expanded != block_in else CONV_BN_ACT
            else:
                total += (CONV_BN_ACT if expanded != block_in else 0) + CONV_BN_ACT + SE + CONV_BN
            total += ADD if stride == 1 and block_in == cout else 0
    return total + CONV_BN_ACT + CLASSIFIER


# --- RegNet ----------------------------------------------------------------------------------


def regnet_stage_depths(depth: int, w_0: int, w_a: float, w_m: float) -> list[int]:
    """Blocks per stage, as torchvision's ``BlockParams.from_init_params`` computes them (in
    float32, like its torch tensors): quantized linear widths; a stage is a run of equal
    widths."""
    f32 = np.float32
    widths_cont = np.arange(depth, dtype=f32) * f32(w_a) + f32(w_0)
    capacity = np.round(np.log(widths_cont / f32(w_0)) / f32(math.log(w_m)))
    quantized = np.round(f32(w_0) * np.power(f32(w_m), capacity) / f32(8)) * 8
    widths: list[int] = quantized.astype(int).tolist()
    depths: list[int] = []
    for i, w in enumerate(widths):
        if i == 0 or w != widths[i - 1]:
            depths.append(0)
        depths[-1] += 1
    return depths


def regnet(depth: int, w_0: int, w_a: float, w_m: float, se: bool) -> int:
    """RegNetX / RegNetY (group widths change no op count): stem conv-BN-ReLU; a block is
    1x1 conv-BN-ReLU, 3x3 group conv-BN-ReLU, [SE with ReLU, Sigmoid], 1x1 conv-BN, add, ReLU,
    plus a projection (conv-BN) in the first block of each stage (stride 2); avgpool, fc."""
    block = 2 * CONV_BN_ACT + (SE if se else 0) + CONV_BN + ADD + ACT
    stages = regnet_stage_depths(depth, w_0, w_a, w_m)
    return CONV_BN_ACT + sum(stages) * block + len(stages) * CONV_BN + CLASSIFIER


# --- ConvNeXt and MaxViT ---------------------------------------------------------------------


def convnext(stage_depths: Sequence[int]) -> int:
    """ConvNeXt: stem 4x4 conv (bias) + LayerNorm2d; a CNBlock is 7x7 dw conv (bias), LayerNorm,
    Linear, GELU, Linear, layer-scale multiply, add = 8 (permutes, StochasticDepth free); a
    downsample between stages is LayerNorm2d + 2x2 conv (bias); head: avgpool, LayerNorm2d, fc.
    """
    block = CONV_B + LN + LINEAR + ACT + LINEAR + MUL + ADD
    downsamples = len(stage_depths) - 1
    return (
        CONV_B + LN + sum(stage_depths) * block + downsamples * (LN + CONV_B) + POOL + LN + LINEAR
    )


def maxvit(block_layers: Sequence[int]) -> int:
    """MaxViT: stem conv-BN-GELU + 3x3 conv (bias); per layer an MBConv, a window-attention and
    a grid-attention PartitionAttentionLayer; head avgpool, LayerNorm, Linear, Tanh, Linear.

    MBConv: pre-BN, 1x1 conv-BN-GELU, dw conv-BN-GELU, SE (SiLU, Sigmoid), 1x1 conv (bias),
    add = 18; the first layer of each block (stride 2) adds the shortcut projection: avgpool +
    1x1 conv (bias) = 3.

    Attention (RelativePositionalMultiHeadAttention) = 10: qkv Linear; k * scale; q @ k^T
    (einsum: 1 batched matmul); relative position bias: gather, ``permute(...).contiguous()``
    copy, add; softmax; @ v; ``permute(...).reshape`` copy; merge Linear.

    PartitionAttentionLayer = 19: window partition (reshape of a permuted tensor: 1 copy),
    LayerNorm + attention + add, LayerNorm + Linear + GELU + Linear + add, departition (1 copy);
    the grid's swapaxes and the eval StochasticDepth are free.
    """
    mbconv = BN + 2 * CONV_BN_ACT + SE + CONV_B + ADD
    projection = POOL + CONV_B
    attention = LINEAR + MUL + MATMUL + (GATHER + COPY + ADD) + ACT + MATMUL + COPY + LINEAR
    partition_layer = COPY + (LN + attention + ADD) + (LN + 2 * LINEAR + ACT + ADD) + COPY
    layer = mbconv + 2 * partition_layer
    stem = CONV_BN_ACT + CONV_B
    head = POOL + LN + LINEAR + ACT + LINEAR
    return stem + sum(block_layers) * layer + len(block_layers) * projection + head


# --- the table -------------------------------------------------------------------------------

# (depth, w_0, w_a, w_m) of torchvision's RegNet constructors; group widths do not matter here.
REGNET_X = {
    "400mf": (22, 24, 24.48, 2.54), "800mf": (16, 56, 35.73, 2.28),
    "1_6gf": (18, 80, 34.01, 2.25), "3_2gf": (25, 88, 26.31, 2.25),
    "8gf": (23, 80, 49.56, 2.88), "16gf": (22, 216, 55.59, 2.1), "32gf": (23, 320, 69.86, 2.0),
}  # fmt: skip
REGNET_Y = {
    "400mf": (16, 48, 27.89, 2.09), "800mf": (14, 56, 38.84, 2.4),
    "1_6gf": (27, 48, 20.71, 2.65), "3_2gf": (21, 80, 42.63, 2.66),
    "8gf": (17, 192, 76.82, 2.19), "16gf": (18, 200, 106.23, 2.48),
    "32gf": (20, 232, 115.89, 2.53), "128gf": (27, 456, 160.83, 2.52),
}  # fmt: skip


def _counts() -> dict[str, int]:
    c: dict[str, int] = {"alexnet": alexnet()}
    for cfg, depth in zip("ABDE", (11, 13, 16, 19), strict=True):
        c[f"vgg{depth}"] = vgg(cfg, batch_norm=False)
        c[f"vgg{depth}_bn"] = vgg(cfg, batch_norm=True)
    c["squeezenet1_0"], c["squeezenet1_1"] = squeezenet("1_0"), squeezenet("1_1")
    for n, layers in {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}.items():
        c[f"resnet{n}"] = resnet("basic", layers)
    bottleneck = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
    for n, layers in bottleneck.items():
        c[f"resnet{n}"] = resnet("bottleneck", layers)
    c["resnext50_32x4d"] = c["wide_resnet50_2"] = c["resnet50"]
    c["resnext101_32x8d"] = c["resnext101_64x4d"] = c["wide_resnet101_2"] = c["resnet101"]
    dense = {121: (6, 12, 24, 16), 161: (6, 12, 36, 24), 169: (6, 12, 32, 32), 201: (6, 12, 48, 32)}
    for n, blocks in dense.items():
        c[f"densenet{n}"] = densenet(blocks)
    c["googlenet"], c["inception_v3"] = googlenet(), inception_v3()
    for width in ("0_5", "1_0", "1_5", "2_0"):
        c[f"shufflenet_v2_x{width}"] = shufflenet_v2((4, 8, 4))
    c["mobilenet_v2"] = mobilenet_v2()
    c["mobilenet_v3_large"], c["mobilenet_v3_small"] = mobilenet_v3("large"), mobilenet_v3("small")
    for name, alpha in {"0_5": 0.5, "0_75": 0.75, "1_0": 1.0, "1_3": 1.3}.items():
        c[f"mnasnet{name}"] = mnasnet(alpha)
    for i, (width_mult, depth_mult) in enumerate(EFFICIENTNET_B_SCALING):
        c[f"efficientnet_b{i}"] = efficientnet(EFFICIENTNET_B, width_mult, depth_mult)
    for size, stages in EFFICIENTNET_V2.items():
        c[f"efficientnet_v2_{size}"] = efficientnet(stages)
    for name, (d, w_0, w_a, w_m) in REGNET_X.items():
        c[f"regnet_x_{name}"] = regnet(d, w_0, w_a, w_m, se=False)
    for name, (d, w_0, w_a, w_m) in REGNET_Y.items():
        c[f"regnet_y_{name}"] = regnet(d, w_0, w_a, w_m, se=True)
    c["convnext_tiny"] = convnext((3, 3, 9, 3))
    c["convnext_small"] = c["convnext_base"] = c["convnext_large"] = convnext((3, 3, 27, 3))
    c["maxvit_t"] = maxvit((2, 2, 5, 2))
    return dict(sorted(c.items()))


COUNTS: dict[str, int] = _counts()


def render_csv(counts: dict[str, int] = COUNTS) -> str:
    """The CSV text: header ``model,kernels``, one row per model, sorted by model."""
    return "model,kernels\n" + "".join(f"{m},{k}\n" for m, k in sorted(counts.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the CSV is out of date")
    args = parser.parse_args(argv)
    text = render_csv()
    if args.check:
        current = CSV_PATH.read_text() if CSV_PATH.exists() else ""
        if current != text:
            print(f"{CSV_PATH} is out of date; run python tools/model_ops.py", file=sys.stderr)
            return 1
        return 0
    CSV_PATH.write_text(text)
    print(f"wrote {len(COUNTS)} models to {CSV_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
