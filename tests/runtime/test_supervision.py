"""``node.supervision``: the restart rule and the instance's files, without an agent."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.node.supervision import (
    MAX_RESTARTS,
    RESTART_WINDOW_S,
    Managed,
    exit_reason,
    exit_status_text,
    log_tail,
    read_ready,
    restart_refused,
)


def managed(tmp_path: Path, incarnation: int = 1) -> Managed:
    launch = InstanceLaunch(
        instance_id="f-1",
        function="f",
        spec={"name": "f", "model": "mlp", "device": "cpu"},
        sm_pct=100.0,
        quota_request=1.0,
        quota_limit=1.0,
        mem_mb=0.0,
        priority=0,
        max_batch=1,
        max_wait_ms=0.0,
        uds_path=str(tmp_path / "f-1.sock"),
    )
    return Managed(replace(launch, incarnation=incarnation))


def test_a_first_start_that_fails_is_not_restarted(tmp_path: Path) -> None:
    m = managed(tmp_path, incarnation=0)
    assert restart_refused(m, "ImportError", 10.0, start_failure=True) == "ImportError"
    assert m.total_restarts == 0
    # a crash after it served once is restarted, even on incarnation 0
    assert restart_refused(m, "killed", 10.0, start_failure=False) is None
    assert m.total_restarts == 1


def test_at_most_max_restarts_per_window(tmp_path: Path) -> None:
    m = managed(tmp_path)
    for k in range(MAX_RESTARTS):  # 3 restarts at t = 0, 1, 2
        assert restart_refused(m, "crash", float(k), start_failure=False) is None
    refused = restart_refused(m, "crash", 3.0, start_failure=False)
    assert refused is not None and "giving up" in refused and f"{MAX_RESTARTS} times" in refused
    # once the first ones leave the window (t - 0 >= 60 s), it may restart again
    assert restart_refused(m, "crash", RESTART_WINDOW_S + 0.5, start_failure=False) is None
    assert m.total_restarts == MAX_RESTARTS + 1


def test_the_files_next_to_the_socket(tmp_path: Path) -> None:
    m = managed(tmp_path)
    assert read_ready(m) is None and exit_reason(m, "process exited") == "process exited"
    Path(m.launch.uds_path + ".ready").write_text('{"pid": 7}')
    Path(m.launch.uds_path + ".exit").write_text("over its memory limit\n")
    assert read_ready(m) == {"pid": 7}
    assert exit_reason(m, "process exited") == "over its memory limit"
    Path(m.launch.uds_path + ".ready").write_text("{not json")
    assert read_ready(m) is None


def test_an_exit_status_reads_as_a_code_or_a_signal() -> None:
    assert exit_status_text(1) == " with code 1"
    assert exit_status_text(-9) == " (signal 9)"
    assert exit_status_text(None) == ""


def test_a_log_tail_is_its_last_non_blank_lines_cut_from_the_front(tmp_path: Path) -> None:
    log = tmp_path / "i.log"
    assert log_tail(log) == ""  # no file
    log.write_text("")
    assert log_tail(log) == ""
    log.write_text("starting\n\nTraceback (most recent call last):\n  x\nMemoryError\n\n")
    assert log_tail(log) == "Traceback (most recent call last): | x | MemoryError"
    assert log_tail(log, lines=1) == "MemoryError"
    log.write_text("a" * 5000 + "\nthe end\n")
    cut = log_tail(log, lines=2, max_chars=50)
    assert len(cut) == 50 and cut.startswith("...") and cut.endswith("| the end")
