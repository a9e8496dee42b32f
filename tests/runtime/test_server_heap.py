"""``runtime.server.freeze_startup_heap``: the server freezes its startup heap once before it
serves, so a full collection no longer scans it (a 40-ms pause of every request in flight);
the collector stays on for what serving allocates. Run in a child interpreter: freezing is
process-wide and the test process's own collector must not change."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_startup_heap_is_frozen_and_new_cycles_are_still_collected() -> None:
    code = textwrap.dedent(
        """
        import gc
        from gshare.runtime.server import freeze_startup_heap
        kept = [{"i": i} for i in range(5000)]
        assert gc.get_freeze_count() == 0
        n = freeze_startup_heap()
        assert n == gc.get_freeze_count() >= 5000, n
        assert gc.isenabled()
        a = []; b = [a]; a.append(b)  # a cycle made after the freeze
        del a, b
        assert gc.collect() >= 2  # is still found and freed
        print(n)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 5000
