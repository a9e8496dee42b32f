"""A simulated GPU executing bursts under ``policy.tokens`` in virtual time.

A *burst* is one batch of one instance: ``work_ms`` of execution at the instance's SM share when
running alone (the profile table's latency at quota 100 %). The GPU model

* asks its ``TokenScheduler`` for a token before a burst runs and releases it after, exactly as
  the live runtime's token client does, so the same policy decides in both worlds;
* runs every burst holding a token concurrently (their SM shares never exceed 100 %: the SM
  adapter sees to it), each slowed by **interference** from the others (memory bandwidth, L2),
  which the solo-measured profiles cannot show (``InterferenceModel``);
* stops a burst when its token runs out (Gemini token revocation at kernel granularity, modelled
  as preemptible work) and re-requests a token for the rest, unless ``preemptible=False``, where
  a burst runs to the end and any overrun is charged by the scheduler;
* optionally (``run_burst(..., device_ms=...)``) runs a **launch-gated** burst, the way
  FaST-GShare's hook really throttles: the token gates the *host-side kernel launches*
  (``work_ms`` of launch work, the token-charged part), while the device drains what was
  launched; the burst completes at ``max(launches done, start + device_ms)`` (see the NOTE
  below);
* optionally (``token_reuse=True``) lets a client keep its token after a burst, as the live
  runtime's instances do (Gemini: a token is a time slice): a burst that starts at the instant
  the previous one ended runs on the held token while its rest fits the predicted burst
  (``policy.tokens.reuse_token``, the client's burst EWMA ``policy.tokens.predict_burst_ms``);
  a token nobody starts a burst on at that instant is released, charged with the time of all
  the bursts that ran on it. The instance starts its next burst at that instant exactly when
  its next batch is ready (``policy.batching``), which is the runtime's
  ``keep_token_for_next_batch``. Launch-gated bursts release at the end of their launches, as
  without reuse (their device drain needs no token);
* optionally (``kernel_ms``) uses a token in whole kernels, as the live CUDA interposer does:
  a kernel is launched only if it ends ``launch_margin_ms`` before the token does, the token is
  given back when the next one does not fit, a token too short for one kernel is held idle to
  its end (the interposer's reaper), and a token is charged the time its kernels ran (the
  interposer reports device busy time, not the token's wall time);
* optionally (``run_burst(..., point_work_ms=...)``) notices a token's end only at the burst's
  next preemption point, every ``point_work_ms`` of its work, as the live CPU instance checks
  its token in a torch module hook (``runtime.instance.gate``: a module call starts while any
  time is left on the token and runs to its end): the burst runs past its token by up to one
  point's work, charged to the token (see the NOTE on preemption points);
* optionally (``token_release_ms``) processes the release of a token given back by an idle
  client that long after its last burst ended: the device stays held, idle and uncharged,
  until then (the live release's trip to the token server; a client that asks again first
  has it processed with its request);
* optionally (``token_wakeup_ms``) charges a client that had to *wait* for its token a wake-up
  time at the start of that token (the blocked hook thread resumes, the token travels over the
  socket) during which it makes no progress;
* optionally (``token_grant_ms``) starts a token granted the moment it was asked for (not a
  kept one) that long after the grant, without charging it to the token: the live CPU
  runtime's acquire round trip, after which the token client starts the token's clock (a
  token waited for pays ``token_wakeup_ms`` instead);
* integrates the metrics the papers report: utilisation (time at least one burst runs) and SM
  occupancy (time-weighted SM % of running bursts).

Who calls it: ``sim.instance.SimInstance`` calls ``add_client`` / ``run_burst`` /
``remove_client``; experiments read ``stats``. The ``token-share`` and ``token-fidelity``
experiments drive it directly (closed loops of bursts; the latter with launch-gated bursts and
``token_wakeup_ms``) and read ``token_log``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gshare.policy.tokens import (
    ClientSpec,
    Grant,
    TokenConfig,
    TokenScheduler,
    predict_burst_ms,
    reuse_token,
)
from gshare.sim.engine import EventLoop
from gshare.sim.priorities import PRIO_GPU, PRIO_TICK

# NOTE — interference model. The shipped V100 profiles were measured with one instance alone
# on the GPU; bursts that share a GPU through MPS still contend for memory bandwidth and L2. We
# model a running burst's speed as 1 / (1 + beta * S_others / 100), where S_others is the SM %
# held by the *other* running bursts. beta = 1.07 is calibrated on the one reference point of
# FaST-GShare Fig. 10 (ResNet-50: eight 12 % pods reach 296.8 req/s against 71.37 req/s for one
# racing pod, a 4.16x gain, while the solo profiles alone predict 7.9x): 1 + beta * 0.84 = 1.9.
DEFAULT_INTERFERENCE_BETA = 1.07

# NOTE — launch-gated bursts (FaST-GShare §3.3.2: the hook intercepts cuLaunchKernel and asks
# for a token "for further CUDA kernel executions"; Gemini's hook likewise only blocks at a
# launch). What a token gates is the host's launch stream of a request, not the GPU's execution
# of what was already launched: once the launches are through, the host waits in a
# synchronisation call and needs no token while the device drains its queue. A launch-gated
# burst therefore has two parts: ``work_ms`` of launch work that progresses only while the
# client holds a token (at host speed, rate 1: interference slows kernels, not launches) and is
# what the scheduler charges, and ``device_ms`` of device time measured from the burst's start
# (the solo quota-100 latency). It completes at max(launches done, start + device_ms). The SM
# adapter counts token holders only (as the real backend does), so a draining burst does not
# hold SMs in the scheduler's view; ``GpuStats`` follows the scheduler's view.


@dataclass(frozen=True, slots=True)
class InterferenceModel:
    """Slowdown of a burst caused by the other bursts running beside it on one GPU."""

    enabled: bool = True
    beta: float = DEFAULT_INTERFERENCE_BETA

    def slowdown(self, others_sm_pct: float) -> float:
        """Factor (>= 1) by which a burst runs slower than alone."""
        if not self.enabled or others_sm_pct <= 0:
            return 1.0
        return 1.0 + self.beta * others_sm_pct / 100.0


@dataclass
class GpuStats:
    """Time integrals of one GPU, closed at ``until_ms`` by ``SimGpu.stats``."""

    busy_ms: float = 0.0
    """Time at least one burst was running."""
    sm_pct_ms: float = 0.0
    """Integral of the SM % of running bursts over time."""
    bursts: int = 0
    tokens: int = 0
    window_ms: float = 0.0
    elapsed_ms: float = 0.0

    @property
    def utilisation(self) -> float:
        return self.busy_ms / self.elapsed_ms if self.elapsed_ms > 0 else 0.0

    @property
    def sm_occupancy(self) -> float:
        """Time-weighted fraction of the SMs in use (0..1)."""
        return self.sm_pct_ms / 100.0 / self.elapsed_ms if self.elapsed_ms > 0 else 0.0


@dataclass(slots=True)
class _Burst:
    client_id: str
    work_left_ms: float
    on_done: Callable[[], None]
    token: Grant | None = None
    token_used_ms: float = 0.0
    token_busy_ms: float = 0.0
    """Time this token's work made progress (what ``kernel_ms`` mode charges)."""
    rate: float = 1.0
    last_ms: float = 0.0
    version: int = 0
    device_done_ms: float | None = None
    """Launch-gated bursts only: when the device has drained (start + device_ms)."""
    requested_ms: float = 0.0
    """When the burst last asked the scheduler for a token."""
    stall_until_ms: float = 0.0
    """No progress before this time (the wake-up after a waited-for token)."""
    busy_ms: float = 0.0
    """Time it has run holding a token, over all its tokens (its length, for the burst EWMA)."""
    work_ms: float = 0.0
    """Its whole work (``work_left_ms`` at its start)."""
    point_work_ms: float = 0.0
    """Work between two of its preemption points (``run_burst``); 0: anywhere."""
    token_wait_ms: float = 0.0
    """Its waits for a token so far, from asking to the grant (``SimGpu.last_token_wait_ms``)."""


@dataclass
class SimGpu:
    """One simulated GPU. See the module docstring."""

    loop: EventLoop
    gpu_id: int = 0
    token_config: TokenConfig = field(default_factory=TokenConfig)
    interference: InterferenceModel = field(default_factory=InterferenceModel)
    preemptible: bool = True
    token_wakeup_ms: float = 0.0
    """Wake-up time charged at the start of a token granted to a burst that had to wait for it
    (granted later than it asked). 0 (the default) models an instantaneous hand-over."""
    token_grant_ms: float = 0.0
    """Delay from the scheduler's grant to the start of a token granted the moment it was
    asked for (not one kept after a burst, ``token_reuse``; one waited for pays
    ``token_wakeup_ms``), not charged to it: the holder makes no progress, and its token's
    length and the time charged count from the end of the delay (module doc)."""
    token_reuse: bool = False
    """Keep a token after a burst for a burst that starts at once (module doc). Off by
    default: the papers' experiments release after every burst."""
    token_release_ms: float = 0.0
    """Delay from an idle client's last burst to the processing of its token's release (module
    doc); 0 (the default): at once."""
    token_log: list[tuple[str, float, float]] | None = None
    """When a list: every token use is appended as ``(client_id, start_ms, end_ms)`` at its
    release (experiments measure per-window shares from it; with ``kernel_ms``, ``end_ms`` is
    the start plus the time charged). None (the default): no log."""
    kernel_ms: float = 0.0
    """Kernel length of the work (solo ms) when a token is used in whole kernels (module doc);
    0 (the default): continuous work, revoked at the token's end."""
    launch_margin_ms: float = 0.0
    """With ``kernel_ms``: a kernel must end this long before its token does (the live
    interposer's margin, ``GSHARE_MARGIN_US``: 200 us)."""
    # NOTE — kernel-granular token use. On an H200 the GPU kit's share scenes (500-us kernels
    # saturating at quotas 0.3 / 0.6, 0.2-0.5 and three 0.2-0.6) lost 1-1.4 pp of each quota
    # and 11 % of the device in the three-way scene, which continuous work cannot lose: a
    # token's tail shorter than a kernel plus the margin is idle (docs/journal/fidelity.md).

    def __post_init__(self) -> None:
        if self.kernel_ms < 0 or self.launch_margin_ms < 0:
            raise ValueError(
                f"kernel_ms and launch_margin_ms must be >= 0, got {self.kernel_ms}, "
                f"{self.launch_margin_ms}"
            )
        if self.kernel_ms > 0 and (self.token_reuse or not self.preemptible):
            raise ValueError("kernel_ms needs preemptible bursts without token_reuse")
        if not self.token_release_ms >= 0:
            raise ValueError(f"token_release_ms must be >= 0, got {self.token_release_ms}")
        self.scheduler = TokenScheduler(self.token_config, window_start_ms=self.loop.now_ms)
        self._bursts: dict[str, _Burst] = {}  # at most one burst per client
        self._running: dict[str, _Burst] = {}
        self._held: dict[str, tuple[Grant, float]] = {}
        """Tokens kept after a burst (``token_reuse``): client -> (grant, time used on it)."""
        self._holding: dict[str, float] = {}
        """Kept tokens held over the instance's loop gap (``hold_token``): client -> since."""
        self._releasing: dict[str, tuple[Grant, float]] = {}
        """Releases not processed yet (``token_release_ms``): client -> (grant, time used)."""
        self._predicted_burst_ms: dict[str, float] = {}
        """Burst-length EWMA per client (``token_reuse``), as the runtime's token client keeps."""
        self.reused = 0
        """Bursts that ran on a token kept from the previous burst."""
        self.last_token_wait_ms: dict[str, float] = {}
        """Per client, its last completed burst's waits for a token (``SimInstance`` gives
        them to the burst's requests as the live ``x-gshare-token-wait-ms``)."""
        self._tick_at: float | None = None
        self._stats = GpuStats(window_ms=self.token_config.window_ms)
        self._stats_since = self.loop.now_ms
        self._last_change = self.loop.now_ms
        self._sm_running = 0.0
        self.sm_allocated_pct = 0.0
        """SM % reserved by placed instances (for placement views)."""

    # -- lifecycle ----------------------------------------------------------------------------

    def add_client(self, spec: ClientSpec) -> None:
        self.scheduler.add_client(spec, self.loop.now_ms)

    def remove_client(self, client_id: str) -> None:
        """Forget an instance; a burst it had in flight is dropped without completing."""
        self._settle()
        self._held.pop(client_id, None)  # the scheduler forgets its token with it
        self._holding.pop(client_id, None)
        self._releasing.pop(client_id, None)
        self._predicted_burst_ms.pop(client_id, None)
        b = self._bursts.pop(client_id, None)
        if b is not None and client_id in self._running:
            del self._running[client_id]
            self._sm_running -= self.scheduler.clients[client_id].spec.sm_pct
        self._apply(self.scheduler.remove_client(client_id, self.loop.now_ms))
        self._reschedule_all()

    # -- bursts -------------------------------------------------------------------------------

    def run_burst(
        self,
        client_id: str,
        work_ms: float,
        on_done: Callable[[], None],
        *,
        device_ms: float | None = None,
        point_work_ms: float = 0.0,
    ) -> None:
        """Run a burst for ``client_id``; call ``on_done`` when it is finished.

        Without ``device_ms``: ``work_ms`` of solo-speed work, all of it under tokens (the
        default model, used by ``SimInstance``). With ``device_ms``: a launch-gated burst —
        ``work_ms`` of token-gated launch work, completion at
        ``max(launches done, start + device_ms)`` (see the NOTE above). ``point_work_ms`` > 0
        (continuous bursts, not with ``kernel_ms``): the burst's preemption points, every
        this much of its work (module doc).
        """
        if client_id in self._bursts:
            raise RuntimeError(f"client {client_id} already has a burst in flight")
        self._process_release(client_id)  # asked again first: released with this request
        now = self.loop.now_ms
        b = _Burst(client_id, max(0.0, work_ms), on_done, requested_ms=now)
        b.work_ms = b.work_left_ms
        if point_work_ms > 0 and device_ms is None and self.kernel_ms <= 0:
            b.point_work_ms = point_work_ms
        if device_ms is not None:
            b.device_done_ms = now + max(0.0, device_ms)
        self._bursts[client_id] = b
        self._stats.bursts += 1
        held = self._held.pop(client_id, None)
        since_ms = self._holding.pop(client_id, None)
        if held is not None:
            grant, used_ms = held
            if since_ms is not None:  # held over the loop gap: its clock ran
                used_ms += now - since_ms
            left_ms = grant.quota_ms - used_ms
            predicted = self._predicted_burst_ms.get(client_id, 0.0)
            if reuse_token(left_ms, predicted, split_bursts=False):
                self.reused += 1
                self._settle()
                b.token, b.token_used_ms, b.last_ms = grant, used_ms, now
                self._running[client_id] = b
                self._sm_running += self.scheduler.clients[client_id].spec.sm_pct
                self._reschedule_all()
                return
            # the rest does not fit: give it back (work is queued) and ask again
            self._release(client_id, grant, used_ms, completed=False)
        self._apply(self.scheduler.request(client_id, now))

    def hold_token(self, client_id: str) -> bool:
        """Keep ``client_id``'s token, kept after the burst that just completed
        (``token_reuse``), until its next ``run_burst``: the instance's batching loop sends the
        answers and takes the next batch before it starts it (``SimInstance``'s loop gap), and
        the token's clock runs meanwhile, as the live token client's does (wall time since its
        grant). Called by the instance from the burst's ``on_done``; False (nothing kept) when
        no token is held, so the next burst asks for one."""
        if client_id not in self._held:
            return False
        self._holding[client_id] = self.loop.now_ms
        return True

    def active_sm_pct(self, exclude: str | None = None) -> float:
        """SM % of the clients with a burst in flight (running, waiting or draining)."""
        return sum(
            self.scheduler.clients[cid].spec.sm_pct for cid in self._bursts if cid != exclude
        )

    # -- metrics ------------------------------------------------------------------------------

    def stats(self) -> GpuStats:
        """Integrals from the last ``reset_stats`` to now."""
        self._settle_metrics()
        s = self._stats
        s.elapsed_ms = self.loop.now_ms - self._stats_since
        return s

    def reset_stats(self) -> None:
        self._settle_metrics()
        self._stats = GpuStats(window_ms=self.token_config.window_ms)
        self._stats_since = self.loop.now_ms

    @property
    def running_clients(self) -> list[str]:
        return list(self._running)

    @property
    def has_clients(self) -> bool:
        return bool(self.scheduler.clients)

    # -- internals ----------------------------------------------------------------------------

    def _settle_metrics(self) -> None:
        now = self.loop.now_ms
        dt = now - self._last_change
        if dt > 0:
            if self._running:
                self._stats.busy_ms += dt
            self._stats.sm_pct_ms += self._sm_running * dt
        self._last_change = now

    def _settle(self) -> None:
        """Advance every running burst's progress to now at its current rate."""
        now = self.loop.now_ms
        self._settle_metrics()
        for b in self._running.values():
            dt = now - b.last_ms
            if dt > 0:
                productive = now - max(b.last_ms, b.stall_until_ms)
                if productive > 0:
                    b.work_left_ms -= productive * b.rate
                    b.token_busy_ms += productive
                b.token_used_ms += dt
                b.busy_ms += dt
                b.last_ms = now

    def _apply(self, grants: list[Grant]) -> None:
        if grants:
            self._settle()
            now = self.loop.now_ms
            for g in grants:
                b = self._bursts.get(g.client_id)
                if b is None:  # a token for a client without work (should not happen): return it
                    self._apply(self.scheduler.release(g.client_id, 0.0, now))
                    continue
                b.token = g
                b.token_used_ms = 0.0
                b.token_busy_ms = 0.0
                b.last_ms = now
                if now > b.requested_ms + 1e-9:  # waited for
                    b.token_wait_ms += now - b.requested_ms
                    if self.token_wakeup_ms > 0:
                        b.stall_until_ms = now + self.token_wakeup_ms
                elif self.token_grant_ms > 0:
                    # the grant's round trip: the token's clock starts when it ends
                    b.stall_until_ms = now + self.token_grant_ms
                    b.token_used_ms = -self.token_grant_ms
                self._running[g.client_id] = b
                self._sm_running += self.scheduler.clients[g.client_id].spec.sm_pct
                self._stats.tokens += 1
            self._reschedule_all()
        self._ensure_tick()

    def _reschedule_all(self) -> None:
        sms = {cid: self.scheduler.clients[cid].spec.sm_pct for cid in self._running}
        total = sum(sms.values())
        now = self.loop.now_ms
        for cid, b in self._running.items():
            if b.device_done_ms is None:
                b.rate = 1.0 / self.interference.slowdown(total - sms[cid])
            else:
                b.rate = 1.0  # launch work runs at host speed
            b.version += 1
            finish_in = max(0.0, b.stall_until_ms - now) + max(0.0, b.work_left_ms) / b.rate
            if self.preemptible and b.token is not None:
                left_ms = max(0.0, b.token.quota_ms - b.token_used_ms)
                if self.kernel_ms > 0:
                    left_ms = self._kernels_fit_ms(b, left_ms, now)
                elif b.point_work_ms > 0 and left_ms > 0:
                    left_ms = self._next_point_ms(b, left_ms, now)
                finish_in = min(finish_in, left_ms)
            self.loop.at(
                now + finish_in, functools.partial(self._on_burst_event, b, b.version), PRIO_GPU
            )

    def _on_burst_event(self, b: _Burst, version: int) -> None:
        if b.version != version or self._running.get(b.client_id) is not b:
            return  # superseded by a later rate change
        self._settle()
        now = self.loop.now_ms
        cid = b.client_id
        done = b.work_left_ms <= 1e-9
        del self._running[cid]
        self._sm_running -= self.scheduler.clients[cid].spec.sm_pct
        if done and self.token_reuse and b.device_done_ms is None and b.token is not None:
            # Token reuse: keep the token; the next burst may start on it at this instant.
            self._predicted_burst_ms[cid] = predict_burst_ms(
                self._predicted_burst_ms.get(cid, 0.0),
                b.busy_ms,
                self.token_config.burst_ewma_alpha,
            )
            self._held[cid] = (b.token, b.token_used_ms)
            b.token = None
            del self._bursts[cid]
            self._reschedule_all()
            self._done(b)
            if cid in self._holding:  # its next burst starts after the instance's loop gap
                return
            held = self._held.pop(cid, None)
            if held is not None:  # no burst started at once: the client is idle
                if self.token_release_ms > 0:
                    self._releasing[cid] = held
                    self.loop.at(
                        now + self.token_release_ms,
                        functools.partial(self._process_release, cid, held[0]),
                        PRIO_GPU,
                    )
                else:
                    self._release(cid, held[0], held[1], completed=True)
            return
        charged_ms = b.token_busy_ms if self.kernel_ms > 0 else b.token_used_ms
        grants = self.scheduler.release(cid, charged_ms, now, completed=done)
        if self.token_log is not None and b.token is not None:
            end_ms = b.token.start_ms + charged_ms if self.kernel_ms > 0 else now
            self.token_log.append((cid, b.token.start_ms, end_ms))
        b.token = None
        if done and b.device_done_ms is not None and b.device_done_ms > now + 1e-9:
            # Launch-gated: the launches are through; the device drains without a token.
            self._reschedule_all()
            self._apply(grants)
            self.loop.at(b.device_done_ms, functools.partial(self._on_drained, b), PRIO_GPU)
        elif done:
            del self._bursts[cid]
            self._reschedule_all()
            self._apply(grants)
            self._done(b)
        else:
            # Token ran out (revoked at kernel granularity): ask again for the rest.
            self._reschedule_all()
            self._apply(grants)
            b.requested_ms = now
            self._apply(self.scheduler.request(cid, now))

    # NOTE — preemption points (the live CPU instance, ``runtime.instance.gate``'s module hook).
    # The hook lets a module call start while any time is left on the token, so a token that
    # ends inside a call is noticed when the call returns. On ``priority-pair`` (2-ms calls of
    # the priority-1 function) its mean token wait was 5.7-5.9 ms simulated with the token cut
    # at its end against 4.5-4.8 ms live, and 4.9-5.1 ms with the calls run to their end (4.2-4.3
    # against 4.1-4.2 ms in a faster run; docs/journal/fidelity.md).
    def _next_point_ms(self, b: _Burst, left_ms: float, now: float) -> float:
        """``b``'s time from now to the first of its preemption points at or after its token's
        end (``left_ms`` from now): where the live hook gives the token back."""
        start_ms = max(0.0, b.stall_until_ms - now)
        done_ms = b.work_ms - b.work_left_ms
        at_end = done_ms + max(0.0, left_ms - start_ms) * b.rate
        point = math.ceil(at_end / b.point_work_ms - 1e-9) * b.point_work_ms
        return start_ms + max(0.0, point - done_ms) / b.rate

    def _kernels_fit_ms(self, b: _Burst, left_ms: float, now: float) -> float:
        """``kernel_ms`` mode: how long ``b`` holds its token from now — a wake-up still to
        come, then the whole kernels (at its current rate) that end ``launch_margin_ms``
        before the token does. When not one fits, the token is held idle to its end (``b``
        stalls until then). Kernels are counted from now: after a rate change in the middle of
        a token the boundaries are approximate (the scenes that use this mode run one client
        at a time)."""
        start_ms = max(now, b.stall_until_ms)
        fit_ms = now + left_ms - start_ms - self.launch_margin_ms
        kernel_wall_ms = self.kernel_ms / b.rate
        n = math.floor(fit_ms / kernel_wall_ms + 1e-9) if fit_ms > 0 else 0
        if n >= 1:
            return start_ms - now + n * kernel_wall_ms
        b.stall_until_ms = now + left_ms
        return left_ms

    def _done(self, b: _Burst) -> None:
        """``b`` is complete: note its token waits for its client, then tell it."""
        self.last_token_wait_ms[b.client_id] = b.token_wait_ms
        b.on_done()

    def _process_release(self, client_id: str, grant: Grant | None = None) -> None:
        """Process ``client_id``'s pending release (``token_release_ms``), if it is still the
        one of ``grant`` (any, when None)."""
        pending = self._releasing.get(client_id)
        if pending is None or (grant is not None and pending[0] is not grant):
            return
        del self._releasing[client_id]
        self._release(client_id, pending[0], pending[1], completed=True)

    def _release(self, client_id: str, grant: Grant, used_ms: float, *, completed: bool) -> None:
        """Give back a kept token (``token_reuse``), charged with the time used on it."""
        now = self.loop.now_ms
        if self.token_log is not None:
            self.token_log.append((client_id, grant.start_ms, now))
        self._apply(self.scheduler.release(client_id, used_ms, now, completed=completed))

    def _on_drained(self, b: _Burst) -> None:
        """A launch-gated burst's device work has drained: the burst is complete."""
        if self._bursts.get(b.client_id) is not b:
            return  # the client was removed meanwhile
        del self._bursts[b.client_id]
        self._done(b)

    def _ensure_tick(self) -> None:
        """Keep one timer pending at the next window boundary while any client waits."""
        if self._tick_at is not None:
            return  # pending ticks are never later than the next boundary (windows only advance)
        if not any(c.waiting for c in self.scheduler.clients.values()):
            return
        self._tick_at = self.scheduler.next_wakeup_ms()
        self.loop.at(self._tick_at, self._on_tick, PRIO_TICK)

    def _on_tick(self) -> None:
        self._tick_at = None
        self._apply(self.scheduler.tick(self.loop.now_ms))
