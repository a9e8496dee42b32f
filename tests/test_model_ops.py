"""``tools/model_ops.py``: the shipped kernel-count table is the one the counting code gives, a
few counts agree with the arithmetic done by hand, and the orderings the architectures imply
hold."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "src" / "gshare" / "data" / "torchvision_kernels.csv"

_MODEL_NAMES = """
alexnet convnext_base convnext_large convnext_small convnext_tiny densenet121 densenet161
densenet169 densenet201 efficientnet_b0 efficientnet_b1 efficientnet_b2 efficientnet_b3
efficientnet_b4 efficientnet_b5 efficientnet_b6 efficientnet_b7 efficientnet_v2_l
efficientnet_v2_m efficientnet_v2_s googlenet inception_v3 maxvit_t mnasnet0_5 mnasnet0_75
mnasnet1_0 mnasnet1_3 mobilenet_v2 mobilenet_v3_large mobilenet_v3_small regnet_x_16gf
regnet_x_1_6gf regnet_x_32gf regnet_x_3_2gf regnet_x_400mf regnet_x_800mf regnet_x_8gf
regnet_y_128gf regnet_y_16gf regnet_y_1_6gf regnet_y_32gf regnet_y_3_2gf regnet_y_400mf
regnet_y_800mf regnet_y_8gf resnet101 resnet152 resnet18 resnet34 resnet50 resnext101_32x8d
resnext101_64x4d resnext50_32x4d shufflenet_v2_x0_5 shufflenet_v2_x1_0 shufflenet_v2_x1_5
shufflenet_v2_x2_0 squeezenet1_0 squeezenet1_1 vgg11 vgg11_bn vgg13 vgg13_bn vgg16 vgg16_bn
vgg19 vgg19_bn wide_resnet101_2 wide_resnet50_2
"""
MODELS = _MODEL_NAMES.split()


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_ops", ROOT / "tools" / "model_ops.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_ops", module)
    spec.loader.exec_module(module)
    return module


def test_csv_is_what_the_tool_computes(ops: ModuleType) -> None:
    assert CSV.read_text() == ops.render_csv()
    assert ops.main(["--check"]) == 0
    rows = [line.split(",") for line in CSV.read_text().splitlines()]
    assert rows[0] == ["model", "kernels"]
    names = [r[0] for r in rows[1:]]
    assert names == sorted(MODELS) and len(names) == 69
    assert all(int(r[1]) > 0 for r in rows[1:])


def test_hand_counted(ops: ModuleType) -> None:
    c = ops.COUNTS
    # alexnet: 5 x (conv 1 + bias 1 + ReLU 1) = 15, 3 max pools, adaptive avgpool 1,
    # classifier Linear, ReLU, Linear, ReLU, Linear = 5 (Dropout free): 15 + 3 + 1 + 5 = 24
    assert c["alexnet"] == 24
    # resnet18: stem conv+bn+relu+maxpool = 4; 8 BasicBlocks x (conv, bn, relu, conv, bn, add,
    # relu) = 56; downsample conv+bn in 3 blocks = 6; avgpool + fc = 2: 4 + 56 + 6 + 2 = 68
    assert c["resnet18"] == 68
    # resnet50: 4 + 16 Bottlenecks x 10 + 4 downsamples x 2 + 2 = 174
    assert c["resnet50"] == 174
    # vgg11: 8 convs x (conv + bias + ReLU) = 24, 5 max pools, avgpool 1, 3 Linear + 2 ReLU = 5:
    # 24 + 5 + 1 + 5 = 35; vgg11_bn adds one BN per conv: 35 + 8 = 43
    assert (c["vgg11"], c["vgg11_bn"]) == (35, 43)
    # vgg19: 16 convs x 3 + 5 + 1 + 5 = 59
    assert c["vgg19"] == 59
    # squeezenet: stem conv+bias+ReLU 3, 3 max pools, 8 Fires x (3 x (conv+bias+ReLU) + cat
    # = 10), final conv+bias+ReLU 3 + avgpool 1: 3 + 3 + 80 + 4 = 90 (both versions)
    assert c["squeezenet1_0"] == c["squeezenet1_1"] == 90
    # mobilenet_v2: stem 3; first block (t=1) dw conv-bn-relu6 + conv-bn = 5; 16 blocks x 8;
    # 10 residual adds; last conv-bn-relu6 3; avgpool + fc 2: 3 + 5 + 128 + 10 + 3 + 2 = 151
    assert c["mobilenet_v2"] == 151
    # googlenet: stem 3 BasicConv2d (conv, bn, relu) + 2 max pools = 11; 9 Inception modules x
    # (6 BasicConv2d + pool + cat = 20) = 180; 2 max pools; avgpool + fc: 11 + 180 + 2 + 2 = 195
    assert c["googlenet"] == 195
    # densenet121: stem 4; 58 dense layers x (cat + 2 x (bn, relu, conv)) = 406; 4 block cats;
    # 3 transitions x 4 = 12; norm5 + relu + avgpool + fc = 4: 4 + 406 + 4 + 12 + 4 = 430
    assert c["densenet121"] == 430
    # efficientnet_b0: stem 3; first block (no expand) dw 3 + SE 8 + project 2 = 13; 15 blocks
    # x (expand 3 + dw 3 + SE 8 + project 2 = 16) = 240; 9 residual adds; head 3 + avgpool +
    # fc: 3 + 13 + 240 + 9 + 3 + 2 = 270
    assert c["efficientnet_b0"] == 270
    # shufflenet_v2: stem 3 + maxpool 1; 16 units x (branch2 8 + cat + shuffle copy = 10) and
    # branch1 (5) in the 3 stride-2 units; conv5 3, mean 1, fc 1: 4 + 160 + 15 + 5 = 184
    assert c["shufflenet_v2_x1_0"] == 184
    # convnext_tiny: stem conv+bias+LN 3; 18 blocks x (dwconv+bias 2, LN, Linear, GELU,
    # Linear, layer-scale mul, add = 8) = 144; 3 downsamples x (LN + conv+bias) = 9; avgpool,
    # LN, fc 3: 3 + 144 + 9 + 3 = 159
    assert c["convnext_tiny"] == 159
    # regnet_x_400mf: stem 3; 22 blocks x (2 x conv-bn-relu + conv-bn + add + relu = 10);
    # 4 stage projections x 2; avgpool + fc: 3 + 220 + 8 + 2 = 233
    assert c["regnet_x_400mf"] == 233


def test_regnet_stage_depths_are_the_papers(ops: ModuleType) -> None:
    assert ops.regnet_stage_depths(*ops.REGNET_X["400mf"]) == [1, 2, 7, 12]
    assert ops.regnet_stage_depths(*ops.REGNET_Y["400mf"]) == [1, 3, 6, 6]
    assert ops.regnet_stage_depths(*ops.REGNET_Y["128gf"]) == [2, 7, 17, 1]
    assert ops.regnet_stage_depths(*ops.REGNET_X["32gf"]) == [2, 7, 13, 1]


def test_orderings(ops: ModuleType) -> None:
    c = ops.COUNTS
    assert c["resnet152"] > c["resnet101"] > c["resnet50"] > c["resnet34"] > c["resnet18"]
    assert c["resnext50_32x4d"] == c["wide_resnet50_2"] == c["resnet50"]
    assert c["densenet201"] > c["densenet169"] > c["densenet121"]
    b = [c[f"efficientnet_b{i}"] for i in range(8)]
    assert b == sorted(b) and b[7] > b[0]
    assert c["efficientnet_v2_l"] > c["efficientnet_v2_m"] > c["efficientnet_v2_s"]
    assert c["vgg19_bn"] > c["vgg16_bn"] > c["vgg13_bn"] > c["vgg11_bn"] > c["vgg11"]
    assert c["mobilenet_v3_large"] > c["mobilenet_v3_small"]
    assert c["regnet_y_400mf"] > c["regnet_x_400mf"]  # SE blocks
    assert len({c[f"mnasnet{a}"] for a in ("0_5", "0_75", "1_0", "1_3")}) == 1
    assert c["convnext_large"] == c["convnext_base"] == c["convnext_small"] > c["convnext_tiny"]
