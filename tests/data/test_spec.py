"""Function specs: every field's valid range, one-line errors naming field and range, YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gshare.resources import GpuShare
from gshare.spec import (
    BUILTIN_MODELS,
    FIELD_RULES,
    GENERATIVE_MODELS,
    Batching,
    FunctionSpec,
    Resources,
    SpecError,
    load_function_spec,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE: dict[str, Any] = {"name": "f", "model": "mlp"}
SHARE = {"sm_pct": 50, "quota_request": 0.5}


def spec(**over: Any) -> dict[str, Any]:
    return {**BASE, **over}


def test_defaults() -> None:
    s = load_function_spec(BASE)
    assert s.resources == "auto" and s.share() is None
    assert s.batching == Batching(max_batch=1, max_wait_ms=5.0)
    assert (s.device, s.slo_ms, s.min_instances, s.max_instances) == ("auto", None, 0, 4)
    assert (s.priority, s.keep_alive_s, s.weights, s.handler) == (0, 300.0, None, None)
    assert s.is_builtin


def test_quota_limit_defaults_to_request_and_share_converts() -> None:
    s = load_function_spec(spec(resources={**SHARE, "mem_mb": 512}))
    assert s.resources != "auto" and s.resources.mem_init_mb == 512
    assert isinstance(s.resources, Resources)
    assert s.resources.quota_limit == 0.5
    assert s.share() == GpuShare(50.0, 0.5, 0.5, 512.0)
    steps = load_function_spec(
        spec(resources={**SHARE, "mem_mb": {"init": 256, "step": 128, "max": 2048}})
    )
    assert steps.share() == GpuShare(50.0, 0.5, 0.5, 256.0)  # reserves init
    auto = load_function_spec(spec(resources={**SHARE, "mem_mb": "auto"}))
    assert auto.share() == GpuShare(50.0, 0.5, 0.5, 0.0)  # the controller sizes it


@pytest.mark.parametrize(
    "data",
    [
        spec(name="a"),
        spec(name="a" * 63),
        spec(name="resnet-50-v2"),
        spec(resources={"sm_pct": 100, "quota_request": 1, "quota_limit": 1, "mem_mb": 0}),
        spec(resources={"sm_pct": 0.5, "quota_request": 0.01, "quota_limit": 0.02}),
        spec(resources={**SHARE, "mem_mb": "auto"}),
        spec(resources={**SHARE, "mem_mb": {"init": 0, "step": 1, "max": 1}}),
        spec(resources={**SHARE, "mem_mb": {"init": 256, "step": 128, "max": 256}}),
        spec(batching={"max_batch": 256, "max_wait_ms": 0}),
        spec(batching={"max_batch": 1, "max_wait_ms": 10000}),
        spec(slo_ms=3_600_000),
        spec(slo_ms=None),
        spec(min_instances=4, max_instances=4),
        spec(max_instances=1024),
        spec(priority=9),
        spec(keep_alive_s=0),
        spec(device="cuda"),
        {"name": "h", "handler": "pkg.mod:Cls"},
        {"name": "h", "handler": "some/dir/file.py:Cls", "weights": "w.safetensors"},
        *[{"name": "m", "model": m} for m in BUILTIN_MODELS],
        *[{"name": "m", "model": m} for m in GENERATIVE_MODELS],
        {"name": "g", "model": "causal-lm-tiny", "slo": {"ttft_ms": 500, "tpot_ms": 50}},
        {"name": "g", "model": "causal-lm-tiny", "slo": {"ttft_ms": None}},
        {"name": "h", "handler": "pkg.mod:Gen", "slo": {"tpot_ms": 20}},  # checked at deploy
    ],
)
def test_valid_edges(data: dict[str, Any]) -> None:
    load_function_spec(data)


# (spec, dotted field, fragment of the message) — one row per way each field can be wrong.
INVALID: list[tuple[dict[str, Any], str, str]] = [
    ({"model": "mlp"}, "name", "required"),
    (spec(name=""), "name", FIELD_RULES["name"]),
    (spec(name="a" * 64), "name", "1..63"),
    (spec(name="Upper"), "name", "got 'Upper'"),
    (spec(name="under_score"), "name", "a DNS label"),
    (spec(name="-lead"), "name", "a DNS label"),
    (spec(name="trail-"), "name", "a DNS label"),
    (spec(name=7), "name", "got 7"),
    (spec(model="gpt5"), "model", "one of resnet50, bert-base, bert-large, vit-base, mlp"),
    ({"name": "f"}, "model", "exactly one of model or handler must be set, got neither"),
    (spec(handler="a:B"), "model", "got both"),
    ({"name": "f", "handler": "nocolon"}, "handler", "'module:Class'"),
    ({"name": "f", "handler": "mod:"}, "handler", "'module:Class'"),
    ({"name": "f", "handler": "1mod:Cls"}, "handler", "got '1mod:Cls'"),
    (spec(weights="w.bin"), "weights", "a path to a .safetensors file"),
    (spec(device="tpu"), "device", "one of cpu, cuda, auto"),
    (spec(resources="big"), "resources", "'auto' or a mapping"),
    (spec(resources=3), "resources", "got 3"),
    (spec(resources={"quota_request": 0.5}), "resources.sm_pct", "required"),
    (spec(resources={**SHARE, "sm_pct": 0}), "resources.sm_pct", "a number in (0, 100], got 0"),
    (spec(resources={**SHARE, "sm_pct": 150}), "resources.sm_pct", "(0, 100], got 150"),
    (spec(resources={**SHARE, "sm_pct": -1}), "resources.sm_pct", "(0, 100]"),
    (spec(resources={**SHARE, "sm_pct": "half"}), "resources.sm_pct", "got 'half'"),
    (spec(resources={**SHARE, "sm_pct": float("nan")}), "resources.sm_pct", "(0, 100]"),
    (spec(resources={**SHARE, "sm_pct": True}), "resources.sm_pct", "got True"),
    (spec(resources={"sm_pct": 50}), "resources.quota_request", "required"),
    (spec(resources={**SHARE, "quota_request": 0}), "resources.quota_request", "(0, 1], got 0"),
    (spec(resources={**SHARE, "quota_request": 1.5}), "resources.quota_request", "(0, 1]"),
    (
        spec(resources={**SHARE, "quota_limit": 0.3}),
        "resources.quota_limit",
        "[quota_request=0.5, 1], got 0.3",
    ),
    (spec(resources={**SHARE, "quota_limit": 1.2}), "resources.quota_limit", "[quota_request, 1]"),
    (spec(resources={**SHARE, "mem_mb": -1}), "resources.mem_mb", "(MiB), got -1"),
    (spec(resources={**SHARE, "mem_mb": "big"}), "resources.mem_mb", "'auto', or a mapping"),
    (
        spec(resources={**SHARE, "mem_mb": {"init": -1, "step": 1, "max": 20}}),
        "resources.mem_mb.init",
        "an integer in [0, 1048576] (MiB), got -1",
    ),
    (
        spec(resources={**SHARE, "mem_mb": {"init": 10, "step": 0, "max": 20}}),
        "resources.mem_mb.step",
        "an integer in [1, 1048576] (MiB), got 0",
    ),
    (
        spec(resources={**SHARE, "mem_mb": {"init": 30, "step": 5, "max": 20}}),
        "resources.mem_mb.max",
        "an integer >= init=30 (MiB), got 20",
    ),
    (
        spec(resources={**SHARE, "mem_mb": {"init": 30, "step": 5, "max": 40, "min": 1}}),
        "resources.mem_mb.min",
        "unknown field (allowed: init, step, max)",
    ),
    (spec(resources={**SHARE, "mem_mb": 1.5}), "resources.mem_mb", "an integer in [0, "),
    (spec(resources={**SHARE, "mem_mb": 1 << 40}), "resources.mem_mb", "got 1099511627776"),
    (
        spec(resources={**SHARE, "gpus": 1}),
        "resources.gpus",
        "unknown field (allowed: sm_pct, quota_request, quota_limit, mem_mb)",
    ),
    (spec(batching=[1]), "batching", "a mapping"),
    (spec(batching={"max_batch": 0}), "batching.max_batch", "an integer in [1, 256], got 0"),
    (spec(batching={"max_batch": 257}), "batching.max_batch", "[1, 256]"),
    (spec(batching={"max_wait_ms": -1}), "batching.max_wait_ms", "[0, 10000], got -1"),
    (spec(batching={"max_wait_ms": 10001}), "batching.max_wait_ms", "[0, 10000]"),
    (spec(slo_ms=0), "slo_ms", "(0, 3600000] or null, got 0"),
    (spec(slo_ms=3_600_001), "slo_ms", "(0, 3600000]"),
    (spec(slo_ms=float("inf")), "slo_ms", "(0, 3600000]"),
    (spec(slo={"ttft_ms": 100}), "slo", "generative functions only"),
    (spec(model="causal-lm-tiny", slo=5), "slo", "a mapping with ttft_ms, tpot_ms"),
    (spec(model="causal-lm-tiny", slo={"ttft_ms": 0}), "slo.ttft_ms", "(0, 3600000] or null"),
    (spec(model="causal-lm-tiny", slo={"tpot_ms": -1}), "slo.tpot_ms", "got -1"),
    (spec(model="causal-lm-tiny", slo={"ttf": 1}), "slo.ttf", "unknown field (allowed: ttft_ms"),
    (spec(min_instances=-1), "min_instances", "an integer in [0, max_instances]"),
    (spec(min_instances=5), "min_instances", "[0, max_instances=4], got 5"),
    (spec(max_instances=0), "max_instances", "an integer in [1, 1024], got 0"),
    (spec(max_instances=1025), "max_instances", "[1, 1024]"),
    (spec(priority=10), "priority", "an integer in [0, 9], got 10"),
    (spec(priority=-1), "priority", "[0, 9]"),
    (spec(keep_alive_s=-1), "keep_alive_s", "a number in [0, 86400], got -1"),
    (spec(keep_alive_s=86_401), "keep_alive_s", "[0, 86400]"),
    (spec(predict_timeout_s=0), "predict_timeout_s", "a number in (0, 86400] or null, got 0"),
    (spec(replicas=3), "replicas", "unknown field (allowed: name, model, handler"),
]


@pytest.mark.parametrize(("data", "field", "fragment"), INVALID)
def test_invalid_field_names_itself_and_its_range(
    data: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as ei:
        load_function_spec(data)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{field}: ") or f"; {field}: " in msg, msg
    assert fragment in msg, msg


def test_every_field_has_an_invalid_case() -> None:
    tested = {field for _, field, _ in INVALID}
    assert set(FIELD_RULES) <= tested, set(FIELD_RULES) - tested
    assert set(FunctionSpec.model_fields) <= tested | {"batching"}


def test_several_errors_in_one_line() -> None:
    with pytest.raises(SpecError) as ei:
        load_function_spec(spec(priority=12, resources={**SHARE, "sm_pct": 200}))
    msg = str(ei.value)
    assert "\n" not in msg and "resources.sm_pct" in msg and "priority" in msg


def test_example_message_of_the_api() -> None:
    with pytest.raises(
        SpecError, match=r"^resources\.sm_pct: must be a number in \(0, 100\], got 150$"
    ):
        load_function_spec(spec(resources={**SHARE, "sm_pct": 150}))


def test_yaml_text_file_and_roundtrip(tmp_path: Path) -> None:
    text = """
name: img
model: resnet50
resources: {sm_pct: 25, quota_request: 0.25, quota_limit: 0.5, mem_mb: 1024}
batching: {max_batch: 8, max_wait_ms: 2.5}
slo_ms: 80
"""
    a = load_function_spec(text)
    f = tmp_path / "img.yaml"
    f.write_text(text)
    b = load_function_spec(f)
    c = load_function_spec(str(f))
    assert a == b == c
    assert load_function_spec(a.to_yaml()) == a
    assert load_function_spec(a) is a
    assert FunctionSpec.model_validate(a.model_dump(mode="json")) == a


def test_file_errors_are_one_line_and_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read function spec .*missing.yaml"):
        load_function_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError) as ei:
        load_function_spec(bad)
    assert str(bad) in str(ei.value) and "not valid YAML" in str(ei.value)
    assert "\n" not in str(ei.value)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: f\nmodel: mlp\npriority: 99\n")
    with pytest.raises(SpecError, match=rf"^{wrong}: priority: must be an integer in \[0, 9\]"):
        load_function_spec(wrong)
    with pytest.raises(SpecError, match="must be a mapping"):
        load_function_spec("- just\n- a list\n")


def test_relative_paths_resolve_against_the_spec_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "h.yaml"
    f.parent.mkdir()
    f.write_text("name: h\nhandler: my_handler.py:H\nweights: w/model.safetensors\n")
    s = load_function_spec(f)
    assert s.handler == f"{f.parent.resolve() / 'my_handler.py'}:H"
    assert s.weights == str(f.parent.resolve() / "w" / "model.safetensors")
    # Dotted module handlers are left alone.
    f.write_text("name: h\nhandler: pkg.mod:H\n")
    assert load_function_spec(f).handler == "pkg.mod:H"


def test_shipped_examples_are_valid() -> None:
    specs = {p.name: load_function_spec(p) for p in sorted(EXAMPLES.glob("*.yaml"))}
    assert {"resnet50.yaml", "mlp.yaml", "text-classifier.yaml"} <= set(specs)
    r, m = specs["resnet50.yaml"], specs["mlp.yaml"]
    assert r.model == "resnet50" and m.model == "mlp"
    assert r.share() != m.share()  # different quotas
    h = specs["text-classifier.yaml"]
    assert h.handler is not None and Path(h.handler.rpartition(":")[0]).is_file()
