"""The server's collector: ``runtime.server.freeze_startup_heap`` freezes the startup heap
once before the server serves, so a full collection no longer scans it (a 40-ms pause of every
request in flight), and the collector stays on for what serving allocates (run in a child
interpreter: freezing is process-wide); ``Metrics.watch_collector`` times each collection by
generation for ``/metrics``."""

from __future__ import annotations

import gc
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


def test_the_servers_collections_are_timed_by_generation_until_the_watch_stops() -> None:
    from prometheus_client import generate_latest

    from gshare.runtime.metrics import Metrics

    m = Metrics()

    def full_collections() -> float:
        for line in generate_latest(m.registry).decode().splitlines():
            if line.startswith('gshare_server_gc_pause_seconds_count{generation="2"}'):
                return float(line.split()[-1])
        return 0.0

    stop = m.watch_collector()
    try:
        gc.collect()
        gc.collect()
        assert full_collections() == 2.0
    finally:
        stop()
    gc.collect()
    assert full_collections() == 2.0  # no longer watched
    stop()  # twice is harmless
