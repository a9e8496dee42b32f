"""ESG's function and application catalogue (§4.1, Table 3)."""

from __future__ import annotations

import pytest

from gshare.workflows.catalogue import (
    APPLICATION_CHAINS,
    ARRIVAL_INTERVAL_MS,
    FUNCTIONS,
    application,
    applications,
    min_config_latency_ms,
)
from gshare.workflows.config import (
    CLUSTER_NODES,
    NODE_VCPUS,
    NODE_VGPUS,
    VCPU_USD_PER_HOUR,
    VGPU_USD_PER_HOUR,
)

TABLE3 = [
    # name, model, exec ms, cold start ms, input MB
    ("super_resolution", "SRGAN", 86, 3503, 2.7),
    ("segmentation", "deeplabv3_resnet50", 293, 16510, 2.5),
    ("deblur", "DeblurGAN", 319, 22343, 1.1),
    ("classification", "ResNet50", 147, 18299, 0.147),
    ("background_removal", "U2Net", 1047, 3729, 2.5),
    ("depth_recognition", "MiDaS", 828, 16479, 0.648),
]


def test_functions_are_table3() -> None:
    got = [
        (f.name, f.model, f.exec_ms_at_min, f.cold_start_ms, f.input_mb) for f in FUNCTIONS.values()
    ]
    assert got == TABLE3


def test_applications_are_the_four_pipelines_of_section_4_1() -> None:
    assert dict(APPLICATION_CHAINS) == {
        "image-classification": ("super_resolution", "segmentation", "classification"),
        "depth-recognition": ("deblur", "super_resolution", "depth_recognition"),
        "background-elimination": ("super_resolution", "deblur", "background_removal"),
        "expanded-image-classification": (
            "deblur",
            "super_resolution",
            "background_removal",
            "segmentation",
            "classification",
        ),
    }
    for name, wf in applications().items():
        assert wf.is_chain()
        assert tuple(s.function for s in wf.stages) == APPLICATION_CHAINS[name]


@pytest.mark.parametrize(
    ("app", "L"),
    [
        ("image-classification", 86 + 293 + 147),  # 526
        ("depth-recognition", 319 + 86 + 828),  # 1233
        ("background-elimination", 86 + 319 + 1047),  # 1452
        ("expanded-image-classification", 319 + 86 + 1047 + 293 + 147),  # 1892
    ],
)
def test_slo_levels_are_factors_of_L(app: str, L: float) -> None:
    assert min_config_latency_ms(app) == L
    assert application(app).critical_path_ms() == L
    assert application(app, "strict").slo_ms == pytest.approx(0.8 * L)
    assert application(app, "moderate").slo_ms == pytest.approx(L)
    assert application(app, "relaxed").slo_ms == pytest.approx(1.2 * L)
    assert application(app, slo_ms=77).slo_ms == 77


def test_unknown_application_and_level_are_named() -> None:
    with pytest.raises(KeyError, match="unknown application 'x'.*image-classification"):
        application("x")
    with pytest.raises(KeyError, match="unknown SLO level 'lax'"):
        application("image-classification", "lax")  # type: ignore[arg-type]


def test_cluster_prices_and_workload_constants() -> None:
    assert (CLUSTER_NODES, NODE_VCPUS, NODE_VGPUS) == (16, 16, 7)
    assert (VCPU_USD_PER_HOUR, VGPU_USD_PER_HOUR) == (0.034, 0.67)
    assert ARRIVAL_INTERVAL_MS["heavy"] == (10.0, 16.8)
    assert ARRIVAL_INTERVAL_MS["light"] == (40.0, 67.2)
