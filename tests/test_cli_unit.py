"""Pure helpers of the CLI."""

from __future__ import annotations

import pytest

from gshare.cli.serving import _new_lines


@pytest.mark.parametrize(
    ("before", "now", "new"),
    [
        ([], ["a", "b"], ["a", "b"]),  # nothing seen yet: all of it
        (["a", "b"], ["a", "b"], []),  # no change
        (["a", "b"], ["a", "b", "c"], ["c"]),  # grew
        (["a", "b", "c"], ["b", "c", "d", "e"], ["d", "e"]),  # the window slid
        (["a", "b"], ["x", "y"], ["x", "y"]),  # no overlap: more than the window arrived
        (["a", "b"], ["b", "a", "b", "c"], ["c"]),  # the last repetition of the end counts
    ],
)
def test_new_lines(before: list[str], now: list[str], new: list[str]) -> None:
    assert _new_lines(before, now) == new


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import gshare
    from gshare.cli import main

    main(["--version"])  # prints and returns (no command runs)
    assert capsys.readouterr().out.strip() == f"gshare {gshare.__version__}"


def test_describe_says_what_the_memory_plan_means() -> None:
    from gshare.cli.serving import _memory_text

    assert _memory_text(None) == "no limit"
    plan = {"init_mb": 256, "step_mb": 128, "max_mb": 1024, "auto": False, "measured_batches": 0}
    assert _memory_text(plan) == "starts at 256 MiB, grows by 128 MiB steps up to 1024 MiB"
    auto = {**plan, "max_mb": None, "auto": True}
    assert _memory_text(auto).endswith(
        "up to what the device has free (auto: a first guess until batches are measured)"
    )
    assert "solved from 12 measured batches" in _memory_text({**auto, "measured_batches": 12})
