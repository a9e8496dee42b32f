"""FIKIT in an instance process: the measurement phase and the per-op decisions at the instance's
preemption points (torch module calls), through the device's board.

Who calls it: the instance's device gate (``instance.gate.DeviceGate``) owns one ``FikitHost``
when its device's board is in FIKIT mode (``tokens.board.open_board``; otherwise the instance
shares by tokens alone, as before). The batching thread calls ``begin_batch`` / ``end_batch``
around each batch, and the global torch forward pre-hook calls ``must_yield``, ``hold`` and
``before_op`` before every module call; the host installs its own forward (post) hook,
``after_op``, only while it measures or publishes gaps. The decisions are ``policy.priority``
(``live``: task switching, the gap after a kernel, the idle window and BestPrioFit over the
waiting launches; ``profile``: SK / SG; ``kernel_id``: an op's identity); this module
measures, reads and writes the board, and waits.

* **Kernels** are leaf modules (no children): their pre- and post-hook bracket the op's work.
  Their id is ``KernelId.cpu(type name, input tensor shapes)`` — also on CUDA, where the module
  hook sees no launch configuration (an op there may be several CUDA kernels; its span is from
  its first kernel's start to its last one's end, measured with CUDA events).
* **Measurement phase** (FIKIT §2.2, §3.2): the first ``measure_runs`` (T) batches of a
  function without a stored profile are measured — each leaf op's start and end — and added to
  its ``KernelProfile`` one run at a time; time the batch spent held (waiting for a higher class
  or a token) is taken out of the run's clock, so a wait is never measured as a gap (on CUDA,
  whose spans are device times, such a run is dropped instead). Then the instance is in the
  sharing phase; the controller stores the profile with the function.
* **Top class** (sharing phase): after a leaf op whose profile predicts a gap of at least
  ``MIN_GAP_MS`` (``fillable_kernels``) it publishes the predicted gap end on its slot; its next
  op closes it (runtime feedback). No other per-op work: one 8-byte read of the board's top class
  and two attribute tests (measured: ``bench/priority.py``, ``per_op_us``).
* **Lower class**: when the board's top class is above its own priority it gives its token back
  (``completed=False``) and holds the op. If the op's SK is known and fits the largest gap a
  running top-class task can open, it polls the board every ``poll_s`` and dispatches the op as a
  fill when BestPrioFit over the waiting launches picks it (the claim is serialised by the
  board's lock); otherwise it blocks in ``acquire``: the token server holds the request until
  its class may run (no polling).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeAlias, cast

from gshare.policy.priority import (
    FikitConfig,
    KernelId,
    KernelProfile,
    KernelSpan,
    ProfileError,
    TaskPhase,
)
from gshare.policy.priority.fikit import MIN_GAP_MS
from gshare.policy.priority.live import (
    FillCandidate,
    choose_fill,
    fillable_kernels,
    gap_end_after,
    must_yield,
    phase_of,
    window_end_ms,
)
from gshare.runtime.tokens.board import (
    H_TOP,
    PHASE_MEASURING,
    PHASE_SHARING,
    S_FILLS,
    S_GAPS,
    S_MAX_GAP_NS,
    S_MEASURE_NS,
    S_PHASE,
    S_PID,
    S_PREEMPTIONS,
    S_RUNS,
    S_STATE,
    S_WAIT_NS,
    S_WAIT_SINCE,
    S_WAIT_SK,
    STATE_BUSY,
    STATE_IDLE,
    BoardClient,
    BoardError,
    TopTask,
)

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

log = logging.getLogger(__name__)

FILL_POLL_S = 0.0002
"""How often a held launch that could fill a gap looks at the board (a ``time.sleep`` of 0.2 ms
wakes after about 0.28 ms on the 2-core VM; each look reads the top-class slots, about 4 us)."""
FILL_OVERHEAD_MS = 0.05
"""Charged per fill on top of its SK when fitting it (``best_prio_fit``'s overhead): the claim
under the board's lock (16 us measured on the 2-core VM, scan and BestPrioFit included) and the
return into the op, with margin. A late wake-up is not charged: the rest of the window is
measured when the claim is made (docs/journal/priority.md, "Live")."""

_Key = tuple[int, tuple[tuple[int, ...], ...]]
_Stamp: TypeAlias = "float | torch.cuda.Event"
"""When a measured op started or ended: ms into the run (CPU), or a recorded event (CUDA)."""


def _is_leaf(module: torch.nn.Module) -> bool:
    return not module._modules


class FikitHost:
    """One instance's FIKIT mechanism (module doc). Not thread-safe: the batching thread only
    (``worker_ident``); hooks fired by other threads are ignored."""

    def __init__(
        self,
        board: BoardClient,
        function: str,
        profile: Mapping[str, object] | None = None,
        *,
        device: str = "cpu",
        config: FikitConfig = FikitConfig(),
        fill_overhead_ms: float = FILL_OVERHEAD_MS,
        poll_s: float = FILL_POLL_S,
        pid: int = 0,
    ) -> None:
        import torch  # lazy: torch is heavy; a FIKIT host exists only where a handler uses it

        self._torch = torch
        self.board = board
        self._q = board.q
        self.function = function
        self.priority = board.priority
        self.cuda = device.startswith("cuda")
        self.measure_runs = config.measure_runs
        self.min_gap_ms = max(config.min_gap_ms, MIN_GAP_MS)
        self.fill_overhead_ms = fill_overhead_ms
        self.poll_s = poll_s
        self.profile = KernelProfile(function)
        if profile:
            try:
                self.profile = KernelProfile.from_records(profile)
            except ProfileError as e:
                log.warning("%s: ignoring a bad stored kernel profile: %s", function, e)
        self.worker_ident = -1
        self.phase = phase_of(self.profile.runs, self.measure_runs)
        self._sk: dict[_Key, float | None] = {}
        self._sg: dict[_Key, float | None] = {}
        self._fillable: frozenset[KernelId] = frozenset()
        self.publishing = False
        """Sharing phase with fillable kernels: the post-hook publishes gaps."""
        self._gap_open = False
        self._post: RemovableHandle | None = None
        # the measured run
        self._spans: list[tuple[KernelId, _Stamp, _Stamp]] = []
        self._stack: list[tuple[torch.nn.Module, KernelId, _Stamp]] = []
        self._run_t0 = 0.0
        self._held_s = 0.0
        self._run_ok = True
        self._cuda_base: torch.cuda.Event | None = None
        board.put(S_PID, pid)
        board.put(S_STATE, STATE_IDLE)
        self._enter_phase()

    # -- phases --------------------------------------------------------------------------------

    @property
    def measuring(self) -> bool:
        return self.phase is TaskPhase.MEASURING

    def _enter_phase(self) -> None:
        b = self.board
        b.put(S_RUNS, self.profile.runs)
        if self.measuring:
            b.put(S_PHASE, PHASE_MEASURING)
            b.put(S_MAX_GAP_NS, 0)
            self._set_post_hook(True)
            return
        self._fillable = fillable_kernels(self.profile, self.min_gap_ms)
        max_gap = max(
            (s.gap_mean_ms for s in self.profile.kernels() if s.kernel in self._fillable),
            default=0.0,
        )
        b.put(S_MAX_GAP_NS, int(max_gap * 1e6))
        b.put(S_PHASE, PHASE_SHARING)
        self.publishing = bool(self._fillable)
        self._sk.clear()
        self._sg.clear()
        self._set_post_hook(self.publishing)

    def _set_post_hook(self, on: bool) -> None:
        if on and self._post is None:
            # lazy: torch is heavy (see __init__)
            from torch.nn.modules.module import register_module_forward_hook

            self._post = register_module_forward_hook(self.after_op)
        elif not on and self._post is not None:
            self._post.remove()
            self._post = None

    def fills_possible(self) -> bool:
        """Sharing phase with a measured op profile: its ops can be held one by one and fill
        gaps (a handler without torch modules has no preemption point: it always waits for its
        token)."""
        return not self.measuring and len(self.profile) > 0

    def close(self) -> None:
        self._set_post_hook(False)
        with contextlib.suppress(Exception):
            self.board.put(S_STATE, STATE_IDLE)
            self.board.put(S_WAIT_SK, 0)

    # -- batches (the batching thread) -----------------------------------------------------------

    def begin_batch(self) -> None:
        """A batch (task) starts: the slot is busy; in the measurement phase a run starts."""
        b = self.board
        if not b.still_mine():  # re-registered (a share change): find the new slot
            try:
                b.refind()
            except BoardError:
                log.warning("%s: lost its board slot", self.function)
                return
            self.priority = b.priority
            self._enter_phase()
        b.put(S_STATE, STATE_BUSY)
        self._gap_open = False
        if self.measuring:
            self._spans.clear()
            self._stack.clear()
            self._held_s = 0.0
            self._run_ok = True
            self._run_t0 = time.perf_counter()
            if self.cuda:
                self._cuda_base = self._event()

    def end_batch(self, ok: bool = True) -> None:
        """The batch ended (``ok``: its predict ran once, without failures): the slot is idle;
        a measured run is added to the profile, and after T runs the sharing phase begins."""
        self.board.put(S_STATE, STATE_IDLE)
        self._gap_open = False
        if not self.measuring:
            return
        elapsed_s = time.perf_counter() - self._run_t0
        spans = self._finish_spans() if ok and self._run_ok and self._spans else None
        self._spans.clear()
        self._stack.clear()
        self.board.add(S_MEASURE_NS, int(elapsed_s * 1e9))
        if not spans:
            return
        try:
            self.profile.add_run(spans)
        except ProfileError as e:  # a clock oddity; the run is not counted
            log.warning("%s: measured run dropped: %s", self.function, e)
            return
        self.phase = phase_of(self.profile.runs, self.measure_runs)
        self._enter_phase()

    def held(self, seconds: float) -> None:
        """The batch waited ``seconds`` at a preemption point (a token, a higher class): taken
        out of the measured run's clock (CPU), or the run is dropped (CUDA)."""
        if self.measuring:
            if self.cuda:
                self._run_ok = False
            self._held_s += seconds

    def _finish_spans(self) -> list[KernelSpan]:
        if self.cuda:
            self._torch.cuda.synchronize()
            base = cast("torch.cuda.Event", self._cuda_base)  # recorded by begin_batch
            events = cast("list[tuple[KernelId, torch.cuda.Event, torch.cuda.Event]]", self._spans)
            return [
                KernelSpan(k, max(0.0, base.elapsed_time(s)), max(0.0, base.elapsed_time(e)))
                for k, s, e in events
            ]
        times_ms = cast("list[tuple[KernelId, float, float]]", self._spans)
        return [KernelSpan(k, s, e) for k, s, e in times_ms]

    # -- preemption points -------------------------------------------------------------------------

    def must_yield(self) -> bool:
        """A higher class is active (the board's top class): hold this op (``hold``)."""
        top = int(self._q[H_TOP])
        return must_yield(None if top < 0 else top, self.priority)

    def before_op(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        """Just before a module runs (after any hold): close an open gap (runtime feedback);
        in the measurement phase, a leaf op's start."""
        if self._gap_open:
            self._q[self.board.base + S_STATE] = STATE_BUSY
            self._gap_open = False
        if self.measuring and _is_leaf(module):
            start = self._event() if self.cuda else self._run_ms()
            self._stack.append((module, self._kernel_id(module, args), start))

    def after_op(self, module: torch.nn.Module, args: tuple[object, ...], output: object) -> None:
        """The global forward hook (installed only while measuring or publishing gaps)."""
        if threading.get_ident() != self.worker_ident or not _is_leaf(module):
            return
        if self.measuring:
            if self._stack and self._stack[-1][0] is module:
                _, kid, start = self._stack.pop()
                end = self._event() if self.cuda else self._run_ms()
                self._spans.append((kid, start, end))
            return
        if not self.publishing:
            return
        key = self._key(module, args)
        if key not in self._sg:
            kid = self._kernel_id(module, args)
            self._sg[key] = self.profile.sg_ms(kid) if kid in self._fillable else None
            self._sk[key] = self.profile.sk_ms(kid)
        sg = self._sg[key]
        if sg is None:
            return
        left = (self._sk.get(key) or 0.0) if self.cuda else 0.0
        end_ms = gap_end_after(
            time.monotonic_ns() / 1e6, sg, kernel_left_ms=left, min_gap_ms=self.min_gap_ms
        )
        if end_ms is not None:
            self._q[self.board.base + S_STATE] = int(end_ms * 1e6)
            self._gap_open = True
            self.board.add(S_GAPS)

    def hold(
        self, module: torch.nn.Module, args: tuple[object, ...], acquire: Callable[[], object]
    ) -> bool:
        """Task switching: hold this op while a higher class is active. Returns True when it is
        dispatched as a fill (no token: run it now), False once ``acquire`` returned a token (its
        class may run). The caller gave its token back first."""
        b = self.board
        t0 = time.monotonic_ns()
        b.add(S_PREEMPTIONS)
        sk = None
        if not self.measuring and _is_leaf(module):
            key = self._key(module, args)
            if key not in self._sk:
                kid = self._kernel_id(module, args)
                self._sk[key] = self.profile.sk_ms(kid)
                self._sg[key] = self.profile.sg_ms(kid) if kid in self._fillable else None
            sk = self._sk[key]
        try:
            if sk is not None:
                need_ns = int((sk + self.fill_overhead_ms) * 1e6)
                b.put(S_WAIT_SINCE, t0)
                b.put(S_WAIT_SK, max(1, int(sk * 1e6)))
                while True:
                    top = int(self._q[H_TOP])
                    if not must_yield(None if top < 0 else top, self.priority):
                        break
                    tasks = b.top_tasks(top)
                    if not any(need_ns <= t.max_gap_ns for t in tasks):
                        break  # no running top task ever leaves a gap this op fits: block
                    if self._try_fill(top, tasks, sk):
                        b.add(S_FILLS)
                        return True
                    time.sleep(self.poll_s)
                b.put(S_WAIT_SK, 0)
            acquire()  # the token server holds it until this class may run
            return False
        finally:
            b.put(S_WAIT_SK, 0)
            waited = time.monotonic_ns() - t0
            b.add(S_WAIT_NS, waited)
            self.held(waited / 1e9)

    def _try_fill(self, top: int, tasks: list[TopTask], sk_ms: float) -> bool:
        """Claim a fill for this instance's held op if BestPrioFit picks it for the open window."""
        now_ns = time.monotonic_ns()
        win = window_end_ms([t.gap_end_ns / 1e6 if t.gap_end_ns else None for t in tasks])
        if win is None or win - now_ns / 1e6 < sk_ms + self.fill_overhead_ms:
            return False  # no window, or too little of it left (checked again under the lock)
        b = self.board
        with b.lock():
            if int(self._q[H_TOP]) != top:
                return False
            tasks = b.top_tasks(top)
            win = window_end_ms([t.gap_end_ns / 1e6 if t.gap_end_ns else None for t in tasks])
            if win is None:
                return False
            win_ns = int(win * 1e6)
            fill_window, fill_end = b.fill_state()
            start_ns = max(now_ns, fill_end) if fill_window == win_ns else now_ns
            cands = [
                FillCandidate(str(w.slot), w.priority, w.sk_ns / 1e6, w.since_ns / 1e6)
                for w in b.waiters(top)
            ]
            pick = choose_fill(cands, (win_ns - start_ns) / 1e6, overhead_ms=self.fill_overhead_ms)
            if pick is None or pick.client_id != str(b.slot):
                return False
            b.set_fill_state(win_ns, start_ns + int((sk_ms + self.fill_overhead_ms) * 1e6))
        return True

    # -- helpers ---------------------------------------------------------------------------------

    def _run_ms(self) -> float:
        return (time.perf_counter() - self._run_t0 - self._held_s) * 1000.0

    def _event(self) -> torch.cuda.Event:
        ev = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ev.record()
        return ev

    def _shapes(self, args: tuple[object, ...]) -> tuple[tuple[int, ...], ...]:
        tensor = self._torch.Tensor
        return tuple(tuple(a.shape) for a in args if isinstance(a, tensor))

    def _key(self, module: torch.nn.Module, args: tuple[object, ...]) -> _Key:
        return (id(module), self._shapes(args))

    def _kernel_id(self, module: torch.nn.Module, args: tuple[object, ...]) -> KernelId:
        return KernelId.cpu(type(module).__name__, self._shapes(args))

    # -- reports ---------------------------------------------------------------------------------

    def report(self, with_profile: bool = False) -> dict[str, object]:
        """The instance's FIKIT state for the controller (``OP_CONTROL`` ``kernel_profile``)."""
        out: dict[str, object] = {
            "phase": self.phase.value,
            "runs": self.profile.runs,
            "kernels": len(self.profile),
            "fillable": len(self._fillable),
        }
        if with_profile and not self.measuring:  # the profile no longer changes
            out["profile"] = self.profile.to_records()
        return out


__all__ = ["FILL_OVERHEAD_MS", "FILL_POLL_S", "FikitHost"]
