"""An instance's device gate: its time tokens, its preemption points, FIKIT and its memory limit.

Who calls it: ``instance.server.InstanceServer`` owns one ``DeviceGate``, built in cold-start
step 3 (after the model loaded). The batching thread calls ``bind_worker`` once, then around
each ``predict`` ``begin_batch`` (acquire or reuse a token), ``failure`` / ``after_failure``
(in and after a failed ``predict``'s ``except``), ``end_batch`` (in its ``finally``) and
``end_burst`` (the batch's busy and token-wait time), and ``idle_tokens`` when the queue has no
batch ready. torch calls ``_token_hook`` before every module's forward, on any thread; the
memory watchdog's thread (``MemoryGovernor.run``, started by ``start_memory``) calls
``_ask_memory`` / ``_over_max``; ``close`` and ``close_tokens`` come from ``stop``.

Preemption points (FaST-GShare §3.3.2's hook library, at the framework level): FaST's
frontend intercepts every kernel launch and asks for a new token once the one it holds is
consumed, so no client runs far past its token. A CPU burst (one ``predict``) can take longer
than a whole token window, so the instance installs a global torch forward pre-hook: before
every ``nn.Module`` call inside a burst it checks the token, and when it is used up releases
it (``completed=False``, charging the time used) and blocks for the next one before the module
runs. A burst therefore overruns its token by at most one module's forward, and bursts of two
instances interleave at layer granularity. Handlers that do not use torch modules are
preempted only between batches.

Priority classes (FIKIT, ``instance.fikit``; when the device's board is in FIKIT mode): the
same preemption point reads the board's top active class (one 8-byte load); below it, the
instance gives its token back and holds the op — as a fill into a higher class's predicted idle
gap when BestPrioFit picks it, else until its class may run (the token server holds its
ACQUIRE). Its first T batches are measured (each leaf module's span: the function's kernel
profile, kept by the controller; ``kernel_profile`` in the launch skips it).

What must hold: ``tokens`` (the token client; replaced on a reconnect) is used by the batching
thread only, apart from ``close_tokens``; the hook acts only on the batching thread and only
inside a burst (between ``begin_batch`` and ``end_batch``), where the burst clock (segment start,
busy and re-wait time) is valid; with the interposer (``native_tokens``) the driver gates the
kernels and no hook is installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gshare.policy.memory import MemoryPlan
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.errors import function_error
from gshare.runtime.instance.fikit import FikitHost
from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.instance.memory import MemoryGovernor, MemoryLimitExceeded
from gshare.runtime.instance.oscap import SLACK_MB, is_memory_error
from gshare.runtime.native import NativeTokens
from gshare.runtime.tokens import MemoryChannel, TokenClient, TokenRuntimeError
from gshare.runtime.tokens.board import open_board

if TYPE_CHECKING:
    import torch

    from gshare.runtime.instance.oscap import MemoryCap


class DeviceGate:
    """The instance's share of its device over time and memory (module doc)."""

    def __init__(
        self, launch: InstanceLaunch, native_tokens: bool, os_cap: MemoryCap | None = None
    ) -> None:
        self.launch = launch
        self.os_cap = os_cap
        """The kernel's hard memory cap (``instance.oscap``), None when there is none."""
        self.tokens: TokenClient | NativeTokens
        if native_tokens:  # the interposer holds this instance's one token connection
            self.tokens = NativeTokens()
        else:
            self.tokens = TokenClient(
                launch.token_socket, launch.instance_id, secret=launch.token_secret or None
            )
        self._in_burst = False
        self._worker_ident = -1
        self._seg_start = self._busy_s = self._rewait_s = 0.0
        self.fikit: FikitHost | None = None
        """The ``FikitHost`` when the device's board is in FIKIT mode, else None."""
        self._fikit_filling = False
        self.mem: MemoryGovernor | None = None
        """The memory governor (``start_memory``), None without a limit of the instance's own."""
        self._batch_mem: MemoryGovernor | None = None
        self._mem_channel: MemoryChannel | None = None
        self._mem_aborted = False
        if "torch" in sys.modules and not native_tokens:
            # lazy: torch is heavy, and hooked only when the handler imported it
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._hook = register_module_forward_pre_hook(self._token_hook)
        # FIKIT across priority classes, when the device's board says so (instance.fikit).
        if "torch" in sys.modules:
            self.fikit = open_fikit(launch)

    def bind_worker(self) -> None:
        """(On the batching thread, first) the thread whose module calls are preemption points."""
        self._worker_ident = threading.get_ident()
        if self.fikit is not None:
            self.fikit.worker_ident = self._worker_ident

    def start_memory(
        self, baseline_mb: float, die: Callable[[float, float], None], idle: Callable[[], bool]
    ) -> None:
        """Start the memory governor and its watchdog thread (``instance.memory``): ``die`` fails
        every request and exits, ``idle`` tells whether no batch is queued or running."""
        launch = self.launch
        self.mem = MemoryGovernor(
            launch.instance_id,
            MemoryPlan(launch.mem_mb, launch.mem_step_mb, launch.mem_max_mb),
            baseline_mb,
            launch.uds_path + ".mem",
            ask=self._ask_memory,
            over_max=self._over_max,
            die=die,
            idle=idle,
        )
        threading.Thread(target=self.mem.run, name="gshare-mem", daemon=True).start()

    # -- one batch (the batching thread) ---------------------------------------------------------

    def begin_batch(self) -> float:
        """Get a token for the batch (or keep the held one, or give way to a higher class) and
        open the burst; returns its start (``time.perf_counter``)."""
        fk = self.fikit
        self._fikit_filling = False
        if fk is not None:
            fk.begin_batch()
        give_way = fk is not None and fk.must_yield()  # FIKIT: a higher class is active
        if give_way and fk is not None and fk.fills_possible():
            # give the token back now; the first preemption point holds the first op (a gap
            # fill, or the token once this class may run)
            self.tokens.release_if_held(completed=False)
            self._fikit_filling = True
        else:
            # token reuse: a held token whose rest fits the batch (not while giving way)
            if give_way or not self.tokens.reusable():
                self._acquire(renew=True)
            self.tokens.begin_burst()
        t0 = time.perf_counter()
        self._seg_start = t0
        self._busy_s = 0.0
        self._rewait_s = 0.0
        self._in_burst = True
        mem = self._batch_mem = self.mem
        if mem is not None:
            mem.begin_batch()
        return t0

    def end_batch(self, t0: float, ok: bool) -> None:
        """Close the burst (in the batch's ``finally``); ``ok``: the whole batch's ``predict``
        succeeded at the first try."""
        self._in_burst = False
        mem = self._batch_mem
        if mem is not None:
            mem.end_batch(time.perf_counter() - t0)
        if self.fikit is not None:
            self.fikit.end_batch(ok=ok)

    def end_burst(self, t_ask: float, t0: float) -> tuple[float, float]:
        """After ``end_batch``: keep the token for the next batch (see the server's batch
        loop) and return the batch's busy time and token wait (ms) since ``t_ask``."""
        seg_s = time.perf_counter() - self._seg_start
        if self.tokens.in_burst:
            self.tokens.end_burst()  # the token is kept for the next batch (server._batch_loop)
        busy_ms = (self._busy_s + seg_s) * 1000.0
        token_wait_ms = (t0 - t_ask + self._rewait_s) * 1000.0
        return busy_ms, token_wait_ms

    def failure(self) -> tuple[int, int, bytes]:
        """The response of the request whose ``predict`` raised (call in ``except``): a
        refused memory grow is a memory-limit error (the memory it held is freed first)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, MemoryLimitExceeded):
            self._mem_aborted = True
            return P.ST_MEMORY_LIMIT, P.ENC_RAW, str(exc).encode()
        if self.os_cap is not None and exc is not None and is_memory_error(exc):
            self._mem_aborted = self.mem is not None
            cap = self.os_cap
            plan_mb = cap.cap_mb - SLACK_MB
            return (
                P.ST_MEMORY_LIMIT,
                P.ENC_RAW,
                (
                    f"the request exceeded the function's memory limit: the operating system "
                    f"({cap.kind.value}) refused an allocation past the function's max "
                    f"{plan_mb:.0f} MiB (mem_mb {plan_mb:.0f} MiB + {SLACK_MB:.0f} MiB for the "
                    f"runtime)"
                ).encode(),
            )
        return function_error()

    def after_failure(self) -> None:
        """After a memory-limit abort (outside its ``except``): free what the batch held."""
        if self._mem_aborted and self.mem is not None:
            self._mem_aborted = False
            self.mem.after_abort()

    def idle_tokens(self) -> None:
        """Release the held token, if any (the batch queue is empty: token reuse ends)."""
        # A failure closes the client; the next ``_acquire`` reconnects.
        with contextlib.suppress(TokenRuntimeError, ConnectionError, TimeoutError, ValueError):
            if self.tokens.in_burst:
                self.tokens.end_burst()
            self.tokens.idle()

    def _token_hook(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        """Global torch forward pre-hook: the frontend's preemption point (module doc)."""
        if not self._in_burst or threading.get_ident() != self._worker_ident:
            return
        mem = self.mem
        if mem is not None:
            mem.check()  # a refused memory grow aborts the batch here
        fk = self.fikit
        if fk is not None:  # FIKIT: task switching and gap fills (instance.fikit)
            if fk.must_yield():
                self._fikit_hold(fk, module, args)
            else:
                self._fikit_filling = False
            fk.before_op(module, args)
            if self._fikit_filling:
                return  # dispatched into a higher class's gap: runs without a token
        if self.tokens.token_left_ms() > 0.0:
            return
        now = time.perf_counter()
        seg_s = now - self._seg_start
        self._busy_s += seg_s
        self._acquire(renew=True)
        if not self.tokens.in_burst:  # a new client after a reconnect
            self.tokens.begin_burst()
        t1 = time.perf_counter()
        self._rewait_s += t1 - now
        self._seg_start = t1
        if fk is not None:
            fk.held(t1 - now)

    def _fikit_hold(self, fk: FikitHost, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        """A higher class is active: give the token back and hold this op (``FikitHost.hold``)
        until it is dispatched as a gap fill or this class may run again (a token)."""
        now = time.perf_counter()
        self._busy_s += now - self._seg_start
        self.tokens.release_if_held(completed=False)
        self._fikit_filling = bool(fk.hold(module, args, self._acquire))
        if not self._fikit_filling and not self.tokens.in_burst:
            self.tokens.begin_burst()
        t1 = time.perf_counter()
        self._rewait_s += t1 - now
        self._seg_start = t1

    def _acquire(self, renew: bool = False) -> float:
        """``TokenClient.acquire`` (with ``renew``: ``renew``, which gives a held token back in
        the same send); when the agent re-registered this client (a quota change: the
        profiler's sweep) or the token server restarted, reconnect and ask again."""
        try:
            return self.tokens.renew() if renew else self.tokens.acquire()
        except (TokenRuntimeError, ConnectionError):
            pass
        deadline = time.monotonic() + 10.0
        while True:
            with contextlib.suppress(Exception):
                self.tokens.close()
            try:
                self.tokens = TokenClient(
                    self.launch.token_socket,
                    self.launch.instance_id,
                    secret=self.launch.token_secret or None,
                )
                return self.tokens.acquire()
            except (TokenRuntimeError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    # -- memory limit (instance.memory): the watchdog's thread -------------------------------

    def _ask_memory(self, limit_mb: float, steps: int) -> tuple[bool, float, str]:
        """Ask the device's memory ledger for a new limit (the memory watchdog's thread)."""
        for attempt in range(2):
            try:
                if self._mem_channel is None:
                    self._mem_channel = MemoryChannel(
                        self.launch.token_socket,
                        self.launch.instance_id,
                        secret=self.launch.token_secret or None,
                    )
                r = self._mem_channel.resize(limit_mb, steps)
                return r.granted, r.limit_mb, r.refusal
            except Exception as e:  # the agent re-registered us, or its server restarted
                if self._mem_channel is not None:
                    with contextlib.suppress(Exception):
                        self._mem_channel.close()
                self._mem_channel = None
                if attempt:
                    return False, limit_mb, f"the node's memory ledger is unreachable ({e})"
        raise AssertionError("unreachable")

    def _over_max(self) -> None:
        with contextlib.suppress(Exception):
            if self._mem_channel is not None:
                self._mem_channel.over_max()

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop FIKIT and the memory watchdog (``stop``; the token client stays open)."""
        if self.fikit is not None:
            with contextlib.suppress(Exception):
                self.fikit.close()
        if self.mem is not None:
            self.mem.stop()

    def close_tokens(self) -> None:
        with contextlib.suppress(Exception):
            self.tokens.close()


def open_fikit(launch: InstanceLaunch) -> FikitHost | None:
    """The instance's ``FikitHost`` when its device's board is in FIKIT mode, else None (token
    sharing alone; also when the board cannot be used: a warning says why)."""
    try:
        board = open_board(launch.token_socket, launch.instance_id)
        if board is None:
            return None
        return FikitHost(
            board, launch.function, launch.kernel_profile, device=launch.device, pid=os.getpid()
        )
    except Exception as e:  # FIKIT is an optimisation: never fail a start over it
        print(f"gshare: FIKIT is off for {launch.instance_id}: {e!r}", file=sys.stderr)
        return None


__all__ = ["DeviceGate", "open_fikit"]
