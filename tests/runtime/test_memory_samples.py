"""The instance's per-batch memory samples file as the node agent reads it
(``instance.memory.read_samples``): only whole new samples, from where it left off, and from
the start again when a restarted instance began the file anew."""

from __future__ import annotations

from pathlib import Path

from gshare.runtime.instance.memory import SAMPLE, read_samples


def test_new_whole_samples_from_the_offset_and_a_restart_reads_from_the_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "i.sock.mem"
    assert read_samples(str(path), 0) == (0, [])  # no file yet: nothing
    path.write_bytes(SAMPLE.pack(10.0, 0.5) + SAMPLE.pack(20.0, 0.25) + b"\x00" * 5)
    off, got = read_samples(str(path), 0)
    assert (off, got) == (2 * SAMPLE.size, [(10.0, 0.5), (20.0, 0.25)])  # the torn tail waits
    assert read_samples(str(path), off) == (off, [])
    path.write_bytes(SAMPLE.pack(7.0, 1.0))  # the instance restarted: a shorter, new file
    assert read_samples(str(path), off) == (SAMPLE.size, [(7.0, 1.0)])
