"""An instance's memory limit on the CPU: measured per batch, grown by steps, shrunk when idle.

Who uses it: ``InstanceServer`` of an instance with a memory limit (``mem_mb`` > 0, or
resource-centric sizing: ``mem_mb: auto`` / ``{init, step, max}``; docs/DESIGN.md §5). The
batching thread calls ``begin_batch`` / ``end_batch`` around each ``predict`` and ``check`` at
its preemption points (the torch forward pre-hook); the governor's own thread (``run``) is the
watchdog.

What it does (BulkX §3, per resource component; the numbers are ``policy.sizing``'s):

* **Measure.** The model memory of the process is its private resident memory (RSS minus
  shared pages: the node's shared weights do not count) above ``baseline_mb``, the private RSS
  once the runtime was imported. Per batch the kernel's high-water mark is reset
  (``/proc/self/clear_refs`` ``5``) before ``predict`` and read (``VmHWM``) after it, so that
  the peak of a short allocation is seen even between two samples; each (peak MiB, execution
  s) is appended to ``<socket>.mem`` (two little-endian f64), which the node agent reads.
* **Grow.** The watchdog samples the model memory every ``BUSY_PERIOD_S`` while a batch runs
  (``IDLE_PERIOD_S`` otherwise). Above the limit it asks ``policy.sizing`` for the smallest
  limit ``init + k·step`` that covers it (at most ``max``) and the device's memory ledger
  (the token server's, over the memory channel) for that much; granted, the limit grows and
  the request goes on. Refused — the request needs more than ``max``, or the device has no
  memory free — the running batch is aborted at its next preemption point with
  ``MemoryLimitExceeded`` (a 503 naming the limit for that request only: the batch is re-run
  one request at a time, and the queue goes on), or, for a handler without preemption points
  that stays over the limit for ``ABORT_GRACE_S``, the instance fails its requests and exits
  (the agent restarts it), as a fixed limit does.
* **Shrink.** When the instance is idle (no batch queued or running) and its limit is above
  ``init``, freed heap is returned to the OS (``malloc_trim``) and the limit goes back to the
  smallest step that covers what is still in use.

What must hold: the limit the instance enforces is never above the reservation the ledger
granted; a refused grow fails only the request(s) that needed it, unless the handler cannot be
interrupted. The limit is soft: a sample every ``BUSY_PERIOD_S`` can miss a fast allocation
until the next sample (an OS-level cap is not applied).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import struct
import threading
import time
from collections.abc import Callable

from gshare.policy.memory import MemoryPlan, grow_limit, idle_limit
from gshare.runtime.node.partition import set_cuda_memory_fraction

log = logging.getLogger(__name__)

BUSY_PERIOD_S = 0.02
"""Watchdog sampling period while a batch runs."""
IDLE_PERIOD_S = 0.1
"""Watchdog sampling period while the instance is idle."""
ABORT_GRACE_S = 1.0
"""How long a refused batch may stay over the limit before the instance is restarted."""
SAMPLE = struct.Struct("<dd")
"""One measurement in ``<socket>.mem``: peak MiB above the baseline, execution seconds."""
_MB = float(1 << 20)


def read_samples(path: str, offset: int) -> tuple[int, list[tuple[float, float]]]:
    """The whole (peak MiB, execution s) samples appended to ``path`` after byte ``offset``,
    and the offset after them; a file shorter than ``offset`` (the instance restarted and began
    it again) is read from its start; a missing file is no sample. Who calls it: the node agent,
    which owns the offset."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < offset:
                offset = 0
            n = (size - offset) // SAMPLE.size
            if n <= 0:
                return offset, []
            f.seek(offset)
            data = f.read(n * SAMPLE.size)
    except OSError:
        return offset, []
    return offset + len(data), [(p, e) for p, e in SAMPLE.iter_unpack(data)]


class MemoryLimitExceeded(RuntimeError):
    """Raised inside ``predict`` (at a preemption point) when the request needs more memory
    than the instance may have; the message names the limit and what was needed."""


def _statm_private_mb(page: int = os.sysconf("SC_PAGE_SIZE")) -> float:
    """Private resident memory of this process (RSS minus shared pages), MiB."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * page / _MB


def _hwm_and_shared_mb(page: int = os.sysconf("SC_PAGE_SIZE")) -> tuple[float, float]:
    """(the resident high-water mark since the last reset, the shared resident pages), MiB."""
    hwm_kb = 0
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                hwm_kb = int(line.split()[1])
                break
    with open("/proc/self/statm", "rb") as f:
        shared = int(f.read().split()[2])
    return hwm_kb / 1024.0, shared * page / _MB


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryGovernor:
    """See the module doc. ``ask(limit_mb, steps)`` asks the device's ledger for a new limit
    and returns ``(granted, limit_held_mb, reason)``; ``over_max()`` reports a request that
    needed more than ``max``; ``die(used_mb, limit_mb)`` fails every request and exits (the
    fixed-limit path); ``idle()`` tells whether no batch is queued or running."""

    def __init__(
        self,
        instance_id: str,
        plan: MemoryPlan,
        baseline_mb: float,
        history_path: str,
        *,
        ask: Callable[[float, int], tuple[bool, float, str]],
        over_max: Callable[[], None],
        die: Callable[[float, float], None],
        idle: Callable[[], bool],
    ) -> None:
        self.instance_id = instance_id
        self.plan = plan
        self.baseline_mb = baseline_mb
        self.limit_mb = plan.init_mb
        self.history_path = history_path
        self._ask, self._over_max, self._die, self._idle = ask, over_max, die, idle
        self._abort: str | None = None
        """A refusal the batching thread has not raised yet."""
        self._aborting = False
        """Refused, until the batching thread freed the aborted batch's memory."""
        self._abort_since = 0.0
        self._busy = False
        self._hwm_ok = _reset_hwm()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.grows = 0
        with contextlib.suppress(OSError):
            open(history_path, "wb").close()

    # -- the batching thread -------------------------------------------------------------------

    def used_mb(self) -> float:
        return _statm_private_mb() - self.baseline_mb

    def begin_batch(self) -> None:
        self._busy = True
        self._abort, self._aborting = None, False  # a refusal is for the batch it was made in
        if self._hwm_ok:
            self._hwm_ok = _reset_hwm()

    def end_batch(self, exec_s: float) -> None:
        """Record the batch's peak model memory (the high-water mark less the shared pages)."""
        self._busy = False
        if self._hwm_ok:
            hwm, shared = _hwm_and_shared_mb()
            peak = max(self.used_mb(), hwm - shared - self.baseline_mb)
        else:
            peak = self.used_mb()
        with contextlib.suppress(OSError), open(self.history_path, "ab") as f:
            f.write(SAMPLE.pack(max(0.0, peak), max(0.0, exec_s)))

    def check(self) -> None:
        """At a preemption point of the batching thread: raise ``MemoryLimitExceeded`` when the
        watchdog refused the memory the running batch needs."""
        reason = self._abort
        if reason is not None:
            self._abort = None
            raise MemoryLimitExceeded(reason)

    def after_abort(self) -> None:
        """The batch that needed too much was aborted and its frames are gone: free what it
        held; the watchdog judges the memory again from now on."""
        gc.collect()
        _malloc_trim()
        self._abort = None
        self._aborting = False

    # -- the watchdog thread -------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(BUSY_PERIOD_S if self._busy else IDLE_PERIOD_S):
            try:
                self._tick()
            except Exception as e:  # keep watching
                log.warning("memory watchdog of %s: %s", self.instance_id, e)

    def _tick(self) -> None:
        used = self.used_mb()
        if used <= self.limit_mb:
            self._abort, self._aborting = None, False  # the memory went down by itself
            if not self._busy and self.limit_mb > self.plan.init_mb and self._idle():
                self._shrink()
            return
        if self._aborting:  # refused already: wait for the batch to be aborted and freed
            if time.monotonic() - self._abort_since > ABORT_GRACE_S:
                self._die(used, self.limit_mb)
            return
        if self.plan.fixed:
            self._die(used, self.limit_mb)
            return
        decision = grow_limit(
            self.limit_mb, used, self.plan.init_mb, self.plan.step_mb, self.plan.cap_mb
        )
        if decision.limit_mb is None:
            self._over_max()
            self._refuse(
                f"the request needs {used:.0f} MiB of memory, more than the function's "
                f"max {self.plan.cap_mb:.0f} MiB (limit {self.limit_mb:.0f} MiB, init "
                f"{self.plan.init_mb:.0f} + steps of {self.plan.step_mb:.0f} MiB)"
            )
            return
        granted, held, reason = self._ask(decision.limit_mb, decision.steps)
        if granted:
            self.limit_mb = held
            self.grows += 1
            return
        self._refuse(
            f"the request needs {used:.0f} MiB of memory; its limit {self.limit_mb:.0f} MiB "
            f"cannot grow to {decision.limit_mb:.0f} MiB: {reason}"
        )

    def _refuse(self, reason: str) -> None:
        log.warning("instance %s: %s", self.instance_id, reason)
        self._abort_since = time.monotonic()
        self._aborting = True
        self._abort = f"instance {self.instance_id}: {reason}"

    def _shrink(self) -> None:
        _malloc_trim()
        target = idle_limit(self.used_mb(), self.plan.init_mb, self.plan.step_mb, self.plan.cap_mb)
        if target < self.limit_mb - 1e-9:
            granted, held, _ = self._ask(target, 0)
            if granted:
                self.limit_mb = held

    def set_plan(self, plan: MemoryPlan) -> None:
        """A new sizing from the controller; takes effect at the next grow or shrink."""
        self.plan = plan


class CudaMemory:
    """The same sizing on a CUDA device (never run here: no GPU; see the README's Status).

    The model memory is what PyTorch's caching allocator holds for the process; the limit is
    its per-process memory fraction (``partition.set_cuda_memory_fraction``), so an allocation
    over it raises ``torch.cuda.OutOfMemoryError`` inside ``predict`` instead of being sampled.
    Per batch ``begin_batch`` resets the allocator's peak and ``end_batch`` records
    ``max_memory_allocated`` (the CUDA allocator's peak) to ``<socket>.mem``. ``grow_after_oom``
    — called by the batching thread when ``predict`` ran out of memory — asks the ledger for
    the next step (``policy.memory.grow_limit`` from the peak it reached) and sets the new
    fraction; the batch is then re-run. ``shrink`` returns to ``init`` when idle."""

    def __init__(
        self,
        device: str,
        plan: MemoryPlan,
        history_path: str,
        *,
        ask: Callable[[float, int], tuple[bool, float, str]],
    ) -> None:
        import torch  # lazy: torch is heavy; only a CUDA instance's governor needs it

        self.torch = torch
        self.device = device
        self.plan = plan
        self.limit_mb = plan.init_mb
        self.history_path = history_path
        self._ask = ask
        self.total_mb = float(torch.cuda.get_device_properties(device).total_memory) / _MB
        self.grows = 0
        self._apply()
        with contextlib.suppress(OSError):
            open(history_path, "wb").close()

    def _apply(self) -> None:
        set_cuda_memory_fraction(min(1.0, max(self.limit_mb, 1.0) / self.total_mb), self.device)

    def begin_batch(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def end_batch(self, exec_s: float) -> None:
        peak = float(self.torch.cuda.max_memory_allocated(self.device)) / _MB
        with contextlib.suppress(OSError), open(self.history_path, "ab") as f:
            f.write(SAMPLE.pack(peak, max(0.0, exec_s)))

    def grow_after_oom(self) -> str | None:
        """After an out-of-memory error: grow by the steps the peak needs; None when granted
        (re-run the batch), else why not (the request fails with a memory-limit error)."""
        need = max(self.limit_mb, float(self.torch.cuda.max_memory_allocated(self.device)) / _MB)
        if self.plan.fixed:
            return f"the request needs more than the memory limit {self.limit_mb:.0f} MiB"
        decision = grow_limit(
            self.limit_mb, need + 1e-6, self.plan.init_mb, self.plan.step_mb, self.plan.cap_mb
        )
        if decision.limit_mb is None:
            return f"the request needs more than the function's max {self.plan.cap_mb:.0f} MiB"
        granted, held, reason = self._ask(decision.limit_mb, decision.steps)
        if not granted:
            return f"its limit {self.limit_mb:.0f} MiB cannot grow: {reason}"
        self.limit_mb = held
        self.grows += 1
        self.torch.cuda.empty_cache()
        self._apply()
        return None

    def shrink(self) -> None:
        if self.limit_mb > self.plan.init_mb:
            granted, held, _ = self._ask(self.plan.init_mb, 0)
            if granted:
                self.limit_mb = held
                self.torch.cuda.empty_cache()
                self._apply()


__all__ = ["CudaMemory", "MemoryGovernor", "MemoryLimitExceeded"]
