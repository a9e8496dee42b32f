"""The GPU kit's dry run: the whole orchestration on the CPU, against the stub driver.

``python -m gshare.gpukit --dry-run`` runs as ``make gpu-check`` would on a GPU machine —
setup, every part in its own process under one deadline, the result files — with the stub
``libcuda.so.1`` of tests/native as the driver and CPU torch. What needs a GPU is skipped with
the reason; the driver-level checks run on the stub (interception and per-launch cost through
the probe, token shares, the kernel table). This keeps the kit from rotting between GPU
windows: a part that breaks here breaks there. Skipped without gcc or the toolkit's cuda.h.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gshare.gpukit import PARTS
from gshare.gpukit.analysis import KERNEL_COLUMNS
from gshare.gpukit.results import STATUSES, validate
from gshare.runtime import native

ROOT = Path(__file__).resolve().parents[2]
_SKIP = native.build_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"interposer not buildable: {_SKIP}")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu-results")
    work = tmp_path_factory.mktemp("gpu-work")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gshare.gpukit",
            "--dry-run",
            "--out",
            str(out),
            "--work",
            str(work),
            "--budget-s",
            "300",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), p.stdout


def _figures(doc: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in doc["parts"][key]["figures"]}


def test_the_result_files_have_the_schema(dry_run: tuple[Path, dict[str, Any], str]) -> None:
    out, doc, _ = dry_run
    validate(doc)  # raises naming the first problem
    assert doc["dry_run"] is True
    assert doc["gpu"].startswith("none (dry run")
    assert set(doc["parts"]) == {p.key for p in PARTS}  # every part, none dropped
    for key in ("gshare_commit", "torch", "python", "wall_s", "libcuda", "cuda_devices"):
        assert key in doc["provenance"], key
    assert doc["provenance"]["cuda_devices"] == 0
    # a window brings back at most 8 files from one folder
    assert len(list(out.iterdir())) <= 8
    md = (out / "RESULTS.md").read_text()
    for p in PARTS:
        assert f"## {p.key}. {p.title}" in md


def test_nothing_fails_and_gpu_parts_say_why_they_were_skipped(
    dry_run: tuple[Path, dict[str, Any], str],
) -> None:
    _, doc, stdout = dry_run
    for key, part in doc["parts"].items():
        assert part["status"] in STATUSES
        assert part["status"] != "fail", (key, part["reason"], stdout[-2000:])
        if part["status"] == "skipped":
            assert "dry run" in part["reason"] or "no GPU" in part["reason"], (key, part)
        for f in part["figures"]:
            if f["on"] == "gpu":  # nothing is claimed for a GPU in a dry run
                assert f["measured"] is None and f["pass"] is None, (key, f)


def test_the_probe_is_governed_on_the_stub(dry_run: tuple[Path, dict[str, Any], str]) -> None:
    _, doc, _ = dry_run
    deployments = ["preload"] if native.shim_skip_reason() else ["preload", "shim"]
    for dep in deployments:  # governed = what the stub device ran, in both deployments
        a = _figures(doc, "a")[f"probe_governed_launches_{dep}"]
        assert a["on"] == "stub" and a["pass"] is True and a["measured"] > 0, a
        assert f"ran as '{dep}'" in a["note"]
    b = _figures(doc, "b")["added_ns_per_launch_token_held_preload"]
    assert b["on"] == "stub" and isinstance(b["measured"], float)
    c = _figures(doc, "c")
    # the pair's shares were measured (device time and throughput); no verdict on the stub
    pair = c["max_abs_share_error_pp_probe_pair"]
    assert isinstance(pair["measured"], float) and pair["pass"] is None
    assert c["max_over_limit_pp_probe_pair"]["measured"] >= 0.0


def test_the_kernel_table_has_orions_columns_and_the_gap(
    dry_run: tuple[Path, dict[str, Any], str],
) -> None:
    out, doc, _ = dry_run
    with open(out / "fikit-kernels.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(KERNEL_COLUMNS)
    (row,) = rows  # the probe's one kernel ID on the stub: gk_busy, 200 us
    assert row["Name"] == "gk_busy" and int(row["Count"]) > 0
    assert 150_000 <= int(row["Duration"]) <= 400_000  # ns (the stub runs it for 200 us)
    assert _figures(doc, "e")["kernel_table_rows"]["measured"] == 1


def test_a_bad_part_name_is_one_line(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gshare.gpukit",
            "--dry-run",
            "--parts",
            "a,zz",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "unknown part zz" in p.stderr and "a (interception)" in p.stderr
    assert not (tmp_path / "results.json").exists()
