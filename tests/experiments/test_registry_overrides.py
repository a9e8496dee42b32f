"""``gshare experiment run --set KEY=VALUE``: the overrides (``registry.override``) and the
command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gshare.experiments.registry import ParamError, override

PARAMS: dict[str, Any] = {
    "horizon_ms": 5000.0,
    "count": 100,
    "pair_sets": {"services": [["a", "b"]]},
    "policy": "esg",
    "enabled": True,
    "limit": None,
    "offset_ms": -1.0,
}


def test_values_are_read_as_yaml_and_keep_their_kind() -> None:
    out = override(
        PARAMS,
        [
            "horizon_ms=2000",  # an integer where a float is expected: 2000.0
            "count=3",
            "pair_sets.services=[[c, d], [e, f]]",
            "policy=fast-gshare",
            "enabled=false",
            "limit=[1, 2]",  # a default of None takes anything
            "offset_ms=-2.5",  # a negative default may stay negative
        ],
    )
    assert out == {
        "horizon_ms": 2000.0,
        "count": 3,
        "pair_sets": {"services": [["c", "d"], ["e", "f"]]},
        "policy": "fast-gshare",
        "enabled": False,
        "limit": [1, 2],
        "offset_ms": -2.5,
    }
    assert isinstance(out["horizon_ms"], float)
    assert PARAMS["pair_sets"] == {"services": [["a", "b"]]}  # the defaults are not changed


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("horizon_ms", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("nope=1", "no such parameter (known: count, enabled, horizon_ms, limit, offset_ms"),
        ("pair_sets.other=1", "no such parameter (known: services)"),
        ("count.x=1", "count is not a mapping"),
        ("count=2.5", "expected an integer like 100, got a number 2.5"),
        ("horizon_ms=fast", "expected a number like 5000.0, got a string 'fast'"),
        ("enabled=1", "expected a bool like True, got an integer 1"),
        ("pair_sets=[1]", "expected a mapping"),
        ("horizon_ms=-5", "must be >= 0"),
        ("horizon_ms=[1", "not valid YAML"),
    ],
)
def test_a_bad_override_is_one_line_naming_it(assignment: str, message: str) -> None:
    with pytest.raises(ParamError) as e:
        override(PARAMS, [assignment])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_experiments_own_parameters_round_trip() -> None:
    """Setting each top-level parameter of every experiment to its own value (written as JSON,
    which is YAML) is accepted and changes nothing: the kinds the check expects are the ones
    the experiments declare."""
    from gshare.experiments.registry import all_experiments

    def plain(x: Any) -> Any:
        return json.loads(json.dumps(x))

    checked = 0
    for exp in all_experiments():
        for quick in (False, True):
            params = exp.params(quick)
            sets = [f"{k}={json.dumps(v)}" for k, v in params.items() if v is not None]
            assert plain(override(params, sets)) == plain(params), exp.name
            checked += len(sets)
    assert checked > 100


@pytest.mark.slow
def test_the_command_runs_with_overrides_and_records_them(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "gshare.cli", "experiment", "run", "fikit-sharing", "--quick"]
    ok = subprocess.run(
        [*cmd, "--set", "horizon_ms=150", "--set", "switch_variants_ms=[0.05]",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    doc = json.loads((tmp_path / "fikit-sharing" / "results.json").read_text())
    assert doc["params"]["horizon_ms"] == 150.0
    prov = doc["provenance"]  # how the result came about, for whoever reads it later
    assert prov["quick"] is True
    assert prov["overrides"] == ["horizon_ms=150", "switch_variants_ms=[0.05]"]
    assert prov["gshare_version"] and prov["python"] and prov["wall_s"] > 0
    assert prov["git_commit"] is None or len(prov["git_commit"]) == 40
    # the headline switch cost always runs; the other one is reported beside it
    assert {r["switch_ms"] for r in doc["rows"]} == {0.025, 0.05}
    bad = subprocess.run(
        [*cmd, "--set", "horizn_ms=1"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("gshare: error: --set horizn_ms")


def test_summaries_over_seeds_aggregate_leaf_by_leaf() -> None:
    from gshare.experiments.results import aggregate_summaries

    agg = aggregate_summaries(
        [
            {"hit": 1.0, "n": 10, "by": {"a": 2.0, "b": "x"}, "name": "esg", "only0": 1},
            {"hit": 0.5, "n": 20, "by": {"a": 4.0, "b": "y"}, "name": "esg"},
            {"hit": 0.0, "n": 30, "by": {"a": 6.0, "b": "x"}, "name": "esg", "flag": True},
        ]
    )
    # mean 0.5, sample std 0.5 (deviations -0.5, 0, 0.5: sum of squares 0.5 over n-1 = 2)
    assert agg["hit"] == {
        "mean": 0.5,
        "std": 0.5,
        "min": 0.0,
        "max": 1.0,
        "median": 0.5,
        "p05": 0.05,  # the 90 % interval over seeds, linear between order statistics
        "p95": 0.95,
        "values": [1.0, 0.5, 0.0],
    }
    assert agg["n"]["mean"] == 20.0 and agg["n"]["std"] == 10.0
    assert agg["by"]["a"]["mean"] == 4.0 and agg["by"]["b"] == ["x", "y", "x"]
    assert agg["name"] == "esg"  # every seed agrees: kept
    assert agg["only0"] == [1, None, None] and agg["flag"] == [None, None, True]
    one = aggregate_summaries([{"hit": 0.9}])
    assert one["hit"]["std"] == 0.0 and one["hit"]["values"] == [0.9]
    with pytest.raises(ValueError):
        aggregate_summaries([])


@pytest.mark.slow
def test_seeds_write_each_run_and_their_aggregate(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "gshare.cli", "experiment", "run", "fast-packing", "--quick"]
    r = subprocess.run(
        [*cmd, "--seed", "4", "--seeds", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "fast-packing"
    runs = [json.loads((folder / f"seed-{k}" / "results.json").read_text()) for k in (4, 5)]
    agg = json.loads((folder / "results.json").read_text())
    assert agg["seeds"] == [4, 5] and [d["seed"] for d in runs] == [4, 5]
    util = agg["summary"]["util_ratio"]
    assert util["values"] == [d["summary"]["util_ratio"] for d in runs]
    assert util["min"] <= util["mean"] <= util["max"]
