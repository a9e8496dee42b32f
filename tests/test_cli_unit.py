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
