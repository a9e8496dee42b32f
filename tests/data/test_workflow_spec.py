"""Workflow specs: YAML loading, the DAG view, and validation errors that name the problem."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gshare.workflows.spec as spec_module
from gshare.workflows.dag import render_stages
from gshare.workflows.spec import (
    MAX_SLO_MS,
    WorkflowSpec,
    WorkflowSpecError,
    find_cycle,
    load_workflow,
    parse_workflow,
)

DIAMOND = """
name: diamond
slo_ms: 900
stages:
  - {name: up,    function: super_resolution}
  - {name: left,  function: deblur,         after: [up]}
  - {name: right, function: segmentation,   after: [up]}
  - {name: join,  function: classification, after: [left, right]}
"""


def test_yaml_text_loads_into_a_dag() -> None:
    wf = load_workflow(DIAMOND)
    assert wf.name == "diamond" and wf.slo_ms == 900
    assert wf.stage_names == ("up", "left", "right", "join")
    assert wf.predecessors()["join"] == ("left", "right")
    assert wf.successors()["up"] == ("left", "right")
    assert wf.sources() == ("up",) and wf.sinks() == ("join",)
    assert wf.topological_order() == ("up", "left", "right", "join")
    assert not wf.is_chain()
    g = wf.graph()
    assert set(g.edges) == {("up", "left"), ("up", "right"), ("left", "join"), ("right", "join")}
    assert g.nodes["join"]["function"] == "classification"
    assert g.graph["slo_ms"] == 900


def test_yaml_file_loads(tmp_path: Path) -> None:
    p = tmp_path / "wf.yaml"
    p.write_text(DIAMOND)
    assert load_workflow(p).stage_names == load_workflow(str(p)).stage_names


def test_critical_path_uses_table3_times_by_default() -> None:
    # longest path: up (86) -> left/deblur (319) -> join/classification (147) = 552;
    # the right branch (segmentation, 293) is shorter than deblur's 319
    assert load_workflow(DIAMOND).critical_path_ms() == pytest.approx(86 + 319 + 147)


def _errors(text: str, **kw: object) -> str:
    with pytest.raises(WorkflowSpecError) as e:
        load_workflow(text, **kw)  # type: ignore[arg-type]
    return str(e.value)


def test_empty_workflow_is_named() -> None:
    assert "is empty: it needs at least one stage" in _errors("name: w\nslo_ms: 10\nstages: []")


def test_duplicate_stage_names_are_named() -> None:
    msg = _errors(
        "name: w\nslo_ms: 10\nstages:\n"
        "  - {name: a, function: deblur}\n  - {name: a, function: deblur}\n"
    )
    assert "duplicate stage names: a" in msg


def test_unknown_predecessor_is_named_with_the_stages() -> None:
    msg = _errors(
        "name: w\nslo_ms: 10\nstages:\n"
        "  - {name: a, function: deblur}\n  - {name: b, function: deblur, after: [zz]}\n"
    )
    assert "stage 'b' runs after unknown stage 'zz'" in msg
    assert "(stages: a, b)" in msg


def test_cycle_is_named() -> None:
    msg = _errors(
        "name: w\nslo_ms: 10\nstages:\n"
        "  - {name: a, function: deblur, after: [c]}\n"
        "  - {name: b, function: deblur, after: [a]}\n"
        "  - {name: c, function: deblur, after: [b]}\n"
        "  - {name: d, function: deblur}\n"
    )
    assert "has a cycle: a -> b -> c -> a" in msg


def test_self_loop_is_a_cycle() -> None:
    msg = _errors("name: w\nslo_ms: 10\nstages:\n  - {name: a, function: deblur, after: [a]}\n")
    assert "has a cycle: a -> a" in msg


def test_unknown_function_is_named_with_the_known_ones() -> None:
    msg = _errors("name: w\nslo_ms: 10\nstages:\n  - {name: a, function: yolo}\n")
    assert "unknown function 'yolo' (stage 'a')" in msg
    assert "known functions: background_removal, classification, deblur" in msg


def test_known_functions_can_be_supplied() -> None:
    text = "name: w\nslo_ms: 10\nstages:\n  - {name: a, function: yolo}\n"
    assert load_workflow(text, known_functions=["yolo"]).stage("a").function == "yolo"
    assert "known functions: other" in _errors(text, known_functions=["other"])


@pytest.mark.parametrize("slo", ["0", "-5", "1e12", ".nan", ".inf"])
def test_bad_slo_names_the_allowed_range(slo: str) -> None:
    msg = _errors(f"name: w\nslo_ms: {slo}\nstages:\n  - {{name: a, function: deblur}}\n")
    assert f"slo_ms: slo_ms must be in (0, {MAX_SLO_MS:.0f}] ms" in msg


def test_missing_and_extra_fields_are_named() -> None:
    assert "slo_ms" in _errors("name: w\nstages:\n  - {name: a, function: deblur}\n")
    msg = _errors("name: w\nslo_ms: 5\nstages:\n  - {name: a, function: deblur, gpu: 3}\n")
    assert "stages.0.gpu" in msg


def test_bad_names_are_named() -> None:
    assert "stage name 'a b'" in _errors(
        "name: w\nslo_ms: 5\nstages:\n  - {name: a b, function: deblur}\n"
    )


def test_yaml_and_file_errors_are_one_clear_line() -> None:
    assert "not valid YAML" in _errors("name: [unclosed\n  slo: 3\n")
    assert "must be a mapping" in _errors("- just\n- a list\n")
    assert "cannot read workflow file" in _errors("/nonexistent/wf.yaml")
    with pytest.raises(WorkflowSpecError, match="must be a mapping"):
        parse_workflow([1, 2])  # type: ignore[arg-type]


def test_spec_is_frozen_and_with_slo_revalidates() -> None:
    wf = load_workflow(DIAMOND)
    with pytest.raises(ValueError, match="frozen"):
        wf.slo_ms = 5
    assert wf.with_slo(123).slo_ms == 123
    with pytest.raises(ValueError, match="slo_ms must be in"):
        wf.with_slo(-1)


def test_model_validate_with_context_and_direct_construction() -> None:
    data = {"name": "w", "slo_ms": 5, "stages": [{"name": "a", "function": "f"}]}
    assert WorkflowSpec.model_validate(data, context={"known_functions": ["f"]}).name == "w"
    with pytest.raises(ValueError, match="unknown function 'f'"):
        WorkflowSpec.model_validate(data)


def test_find_cycle() -> None:
    assert find_cycle({"a": (), "b": ("a",)}) == []
    assert find_cycle({"a": ("b",), "b": ("a",)}) == ["a", "b"]


def test_spec_does_not_import_the_catalogue() -> None:
    """The spec reads the function table from ``workflows.functions``; the catalogue builds
    specs, so importing it from here (even inside a function) would be a cycle."""
    tree = ast.parse(Path(spec_module.__file__).read_text())
    gshare_imports = [
        (node.lineno, node.module if isinstance(node, ast.ImportFrom) else node.names[0].name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    gshare_imports = [(n, m) for n, m in gshare_imports if m and m.startswith("gshare")]
    assert all(not m.startswith("gshare.workflows.catalogue") for _, m in gshare_imports)
    top_level = {id(n) for n in tree.body}
    nested = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("gshare")
        and id(node) not in top_level
    ]
    assert nested == [], f"function-level gshare imports in spec.py at lines {nested}"


@pytest.mark.parametrize(
    ("stages", "line"),
    [
        ([{"name": "a", "function": "f"}], "a(f)"),
        (
            [{"name": "a", "function": "f"}, {"name": "b", "function": "g", "after": ["a"]}],
            "a(f) -> b(g)",
        ),
        (  # a split (examples/workflows/scene.yaml): both run once sr has answered
            [
                {"name": "sr", "function": "swin2sr"},
                {"name": "seg", "function": "segformer", "after": ["sr"]},
                {"name": "depth", "function": "dpt", "after": ["sr"]},
            ],
            "sr(swin2sr) -> {seg(segformer) | depth(dpt)}",
        ),
        (  # two sources and a join; listed out of order, placed by level
            [
                {"name": "j", "function": "h", "after": ["a", "b"]},
                {"name": "a", "function": "f"},
                {"name": "b", "function": "g", "after": []},
            ],
            "{a(f) | b(g)} -> j(h)",
        ),
        (  # a skip edge: c waits for b, so it is on b's next level, not a's
            [
                {"name": "a", "function": "f"},
                {"name": "b", "function": "g", "after": ["a"]},
                {"name": "c", "function": "h", "after": ["a", "b"]},
            ],
            "a(f) -> b(g) -> c(h)",
        ),
    ],
)
def test_a_workflow_renders_by_level(stages: list[dict[str, object]], line: str) -> None:
    assert render_stages(stages) == line
