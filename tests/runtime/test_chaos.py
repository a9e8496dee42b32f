"""The fault-injection suite (docs/DESIGN.md §12.1): ``bench/chaos.py --quick`` — ``kill -9`` of an
instance, the fork template, the node agent and ``gshare serve`` itself, each under steady
load — and what users are promised: no request lost silently, service back within the stated
bound of each kind, nothing left after a clean stop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_kill_9_of_every_process_kind_under_load() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import chaos
    finally:
        sys.path.remove(str(BENCH))
    s = chaos.main(["--quick"])
    rows = {r["kind"]: r for r in s["rows"]}
    assert set(rows) == set(chaos.KINDS)
    assert s["lost"] == 0, s  # every request got its answer or an explicit error
    assert s["dropped"] == 0, s  # no broken connection while the server process lived
    for kind, r in rows.items():
        assert r["recovery_s"] is not None, f"no service {r['bound_s']} s after killing {kind}"
        assert r["errors_without_message"] == 0 and r["timeouts"] == 0, r
    assert s["leaks"] == [] and s["clean_stop"], s
