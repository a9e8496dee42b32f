"""The token client: one per instance process (``tokens.protocol`` has the wire protocol, who
calls what and what must hold; ``policy.tokens`` the reuse and burst-prediction rules)."""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import TypeVarTuple

from gshare.policy.tokens import (
    DEFAULT_BURST_EWMA_ALPHA,
    predict_burst_ms,
    reuse_token,
    should_yield,
)
from gshare.runtime.tokens.protocol import (
    F64,
    FRAME,
    FRAME_SIZE,
    HELLO_MEMORY_CHANNEL,
    MEMORY_OVER_MAX,
    MEMORY_REFUSALS,
    OP_ACQUIRE,
    OP_ERROR,
    OP_GRANT,
    OP_HELLO,
    OP_MEMORY,
    OP_MEMORY_REPLY,
    OP_RELEASE,
    OP_WELCOME,
    PROTOCOL_VERSION,
    SEQ_MASK,
    TokenRuntimeError,
    error_for,
    hello_text,
)

log = logging.getLogger(__name__)

Args = TypeVarTuple("Args")


class TokenClient:
    """An instance's connection to its device's token server (blocking, one per instance).

    Called by the instance frontend from one thread: ``acquire()`` before a burst, ``release()``
    after it, never two ``acquire`` in a row. The constructor connects and identifies itself
    (HELLO): it raises ``UnknownClientError`` if the agent has not registered ``client_id``,
    ``ConnectionError`` if nobody serves ``socket_path``.

    ``timeout_s`` bounds every blocking call (``None``: wait for ever). When it expires the
    connection is closed (the server then forgets the request, or releases a token granted
    meanwhile) and ``TimeoutError`` is raised; the client cannot be used afterwards.
    """

    def __init__(
        self,
        socket_path: str,
        client_id: str,
        timeout_s: float | None = None,
        *,
        split_bursts: bool = False,
        busy_clock: Callable[[], float] = time.perf_counter,
        secret: str | None = None,
    ) -> None:
        raw = hello_text(client_id, secret)
        self.socket_path = socket_path
        self.client_id = client_id
        self.window_ms = 0.0
        """The server's window length (from WELCOME)."""
        self.token_ms: float | None = None
        """Length of the token held, or None."""
        self.elastic = False
        """Whether the token held is elastic (idle time beyond the guarantee)."""
        self._t_grant = 0.0
        self._busy_at_grant = 0.0
        """``busy_clock`` when the held token was granted."""
        self._used_ms = 0.0
        """Busy time of the bursts ended on the held token (reuse protocol)."""
        self._in_burst = False
        self._seg_t0 = 0.0
        """Start of the open burst segment (``busy_clock``), valid while ``_in_burst``."""
        self._burst_done_ms = 0.0
        """Busy time of the open burst on earlier tokens (a burst renewed mid-way)."""
        self.predicted_burst_ms = 0.0
        """EWMA of this client's completed bursts (0 = no history): the reuse test."""
        self.burst_ewma_alpha = DEFAULT_BURST_EWMA_ALPHA
        self.reused = 0
        """Bursts that ran on a token already held (no round trip to the server)."""
        self.split_bursts = split_bursts
        self.busy_clock = busy_clock
        self._busy_is_perf = busy_clock is time.perf_counter
        """The clock (seconds) that measures the busy time reported on a token; the token's
        own length is always wall time (``perf_counter``). Default ``perf_counter``: the
        device time a GPU burst holds, as the host sees it. A single-threaded CPU frontend may
        pass ``time.thread_time``: the CPU time it got, which leaves out the time its core was
        taken from it (another task, or the VM stopping the vCPU) while it held the token."""
        """Reuse a held token while any time is left on it, not only while its rest fits the
        predicted burst (``reusable``). For frontends that call ``should_yield`` before every
        kernel, so that a burst cut where the token ends never runs past it."""
        self._seq = 0
        self._out = bytearray(FRAME_SIZE)
        self._batch_release = False
        self._pending_release = b""
        """A RELEASE frame that ``renew`` leaves for ``acquire`` to send with its ACQUIRE."""
        self._in = bytearray(FRAME_SIZE)
        self._in_view = memoryview(self._in)
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            try:
                self._sock.connect(socket_path)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise ConnectionError(f"no token server on {socket_path}: {e}") from None
            self._io(
                self._sock.sendall, FRAME.pack(OP_HELLO, PROTOCOL_VERSION, len(raw), 0, 0.0) + raw
            )
            op, flags, length, _seq, value = self._read_frame()
            if op == OP_ERROR:
                raise error_for(flags, self._read_text(length))
            if op != OP_WELCOME:
                raise TokenRuntimeError(f"token server answered HELLO with op 0x{op:02x}")
            self.window_ms = value
            _kernel_timeouts(self._sock, timeout_s)
        except BaseException:
            self.close()
            raise

    # -- the burst protocol (instance frontend) -----------------------------------------------

    def acquire(self) -> float:
        """Block until the server grants a token; return its length in ms.

        Raises ``UnknownClientError`` if the client was removed, ``TokenRuntimeError`` if a
        token is already held, ``ConnectionError`` if the server went away, ``TimeoutError``.
        """
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        if self.token_ms is not None:
            raise TokenRuntimeError(f"client {self.client_id!r} already holds a token")
        seq = self._seq = (self._seq + 1) & SEQ_MASK
        FRAME.pack_into(self._out, 0, OP_ACQUIRE, 0, 0, seq, 0.0)
        out: bytes | bytearray = self._out
        if self._pending_release:  # ``renew``: the RELEASE goes in the same send
            out, self._pending_release = self._pending_release + self._out, b""
        try:  # inline (no helper calls): this is the grant's round trip
            sock.sendall(out)
            got = sock.recv_into(self._in_view, FRAME_SIZE)
            if got != FRAME_SIZE:
                _recv_rest(sock, self._in_view, got)
        except OSError as e:
            raise self._lost(e) from None
        while True:
            op, flags, length, rseq, value = FRAME.unpack_from(self._in)
            if op == OP_GRANT and rseq == seq:
                t = self._t_grant = time.perf_counter()
                self._busy_at_grant = t if self._busy_is_perf else self.busy_clock()
                token_ms: float = value
                self.token_ms = token_ms
                self.elastic = bool(flags & 1)
                self._used_ms = 0.0
                if self._in_burst:
                    self._seg_t0 = self._busy_at_grant
                return token_ms
            if op == OP_ERROR:
                text = self._read_text(length)
                if rseq == seq:
                    raise error_for(flags, text)
                log.warning(
                    "token server rejected an earlier release of %r: %s", self.client_id, text
                )
                self._recv_exact(self._in_view)
                continue
            self.close()
            raise TokenRuntimeError(
                f"unexpected reply op=0x{op:02x} seq={rseq} (waiting for {seq})"
            )

    def release(self, busy_ms: float, completed: bool = True) -> None:
        """Give the token back, having used ``busy_ms`` of device time on it.

        ``completed`` is False when the burst is not finished (the token ran out or was
        revoked by ``should_yield``). Does not wait for the server (no reply on success).
        """
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        if self.token_ms is None:
            raise TokenRuntimeError(f"client {self.client_id!r} holds no token")
        if not (math.isfinite(busy_ms) and busy_ms >= 0):
            raise ValueError(f"busy_ms must be finite and >= 0, got {busy_ms}")
        self._seq = (self._seq + 1) & SEQ_MASK
        FRAME.pack_into(self._out, 0, OP_RELEASE, 1 if completed else 0, 0, self._seq, busy_ms)
        self.token_ms = None
        self._used_ms = 0.0
        if self._batch_release:  # ``renew``: ``acquire`` sends it with its ACQUIRE
            self._pending_release = bytes(self._out)
            return
        try:
            sock.sendall(self._out)
        except OSError as e:
            raise self._lost(e) from None

    @contextlib.contextmanager
    def burst(self, reuse: bool = False) -> Iterator[float]:
        """``with client.burst() as token_ms: run()`` -- acquire, run, release the time measured
        with ``busy_clock`` (also when the body raises).

        ``reuse=True``: ``start_burst`` / ``end_burst`` instead -- the token is kept after the
        body for the next burst (yields the time left on it); call ``idle()`` when done."""
        if reuse:
            left = self.start_burst()
            try:
                yield left
            finally:
                self.end_burst()
            return
        token_ms = self.acquire()
        t0 = self._busy_at_grant
        try:
            yield token_ms
        finally:
            self.release((self.busy_clock() - t0) * 1000.0)

    # -- token reuse (Gemini: a token is a time slice) -----------------------------------------

    def reusable(self) -> bool:
        """True when a token is held and its rest fits the predicted next burst (the EWMA of
        this client's bursts; any rest > 0 before the first burst ends), or, with
        ``split_bursts``, when any time is left on it.

        NOTE — split bursts. Giving back a rest that cannot fit the next burst and asking again
        costs one round trip, as does cutting the burst where the token ends (revocation) and
        asking again for its remainder; but a rest given back is not charged, so the scheduler
        hands it out again later in the window, and while a neighbour time-shares the device
        that is one more hand-over (two wake-ups, device idle) per token: two clients with
        quota-sized tokens then swap four times per window instead of twice. A frontend that
        checks ``should_yield`` before every kernel can cut a burst anywhere without running
        past its token, so it keeps the rest (``split_bursts=True``). A frontend whose only
        preemption points are coarse (the instance's per-module hook, which yields once the
        token is spent) would instead overrun the token at every cut, so it keeps the default.
        """
        if self.token_ms is None:
            return False
        return reuse_token(
            self.token_left_ms(), self.predicted_burst_ms, split_bursts=self.split_bursts
        )

    def start_burst(self) -> float:
        """Begin a burst on the held token if its rest fits the predicted burst (``reusable``),
        else give it back (``completed=False``: work is still queued) and ``acquire`` a new
        one. Returns the time left on the token. End the burst with ``end_burst``; call
        ``release_if_held`` when the caller goes idle (no more work queued), so the protocol is
        paid once per token, not once per burst."""
        if self._in_burst:
            raise TokenRuntimeError(f"client {self.client_id!r} is already in a burst")
        token_ms = self.token_ms
        if token_ms is not None:  # the common case, inline: one clock read, no helper calls
            now = time.perf_counter()
            left_ms = token_ms - (now - self._t_grant) * 1000.0
            if reuse_token(left_ms, self.predicted_burst_ms, split_bursts=self.split_bursts):
                self.reused += 1
                self._in_burst = True
                self._seg_t0 = now if self._busy_is_perf else self.busy_clock()
                self._burst_done_ms = 0.0
                return left_ms
            self.renew()
        else:
            self.acquire()
        self.begin_burst()
        return self.token_left_ms()

    @property
    def in_burst(self) -> bool:
        """Between ``start_burst``/``begin_burst`` and ``end_burst``."""
        return self._in_burst

    def begin_burst(self) -> None:
        """Mark the start of a burst on the token held now (``start_burst`` without the
        acquire, for callers that acquire through their own reconnect logic)."""
        if self.token_ms is None:
            raise TokenRuntimeError(f"client {self.client_id!r} holds no token")
        self._in_burst = True
        self._seg_t0 = self.busy_clock()
        self._burst_done_ms = 0.0

    def end_burst(self) -> float:
        """End the burst: its busy time (measured since ``start_burst``, across renewed
        tokens) feeds the burst EWMA and is added to the time used on the held token, which is
        kept for the next burst. Returns the burst's busy ms."""
        if not self._in_burst:
            raise TokenRuntimeError(f"client {self.client_id!r} is not in a burst")
        self._in_burst = False
        seg_ms = (self.busy_clock() - self._seg_t0) * 1000.0 if self.token_ms is not None else 0.0
        self._used_ms += seg_ms
        burst_ms = self._burst_done_ms + seg_ms
        self._burst_done_ms = 0.0
        self.predicted_burst_ms = predict_burst_ms(
            self.predicted_burst_ms, burst_ms, self.burst_ewma_alpha
        )
        return burst_ms

    def release_if_held(self, completed: bool = True) -> bool:
        """Give back the held token, if any, charged with the busy time used on it (bursts
        ended on it plus the open burst's segment). Inside a burst (the token ran out mid-way,
        ``completed=False``) the burst stays open and continues on the next ``acquire``.
        Returns whether a token was released."""
        if self.token_ms is None:
            return False
        busy_ms = self._used_ms
        if self._in_burst:
            seg_ms = (self.busy_clock() - self._seg_t0) * 1000.0
            self._burst_done_ms += seg_ms
            busy_ms += seg_ms
        self.release(busy_ms, completed=completed)
        return True

    def renew(self) -> float:
        """``release_if_held(completed=False)`` then ``acquire()``, the RELEASE and the ACQUIRE
        in one send: the server reads both in one wake-up (on a busy machine each wake-up of the
        server may preempt the caller until the server has handled it). For a caller whose
        token ran out, or cannot fit its next burst, with work still queued: ``start_burst``,
        the instance's batch start and its preemption point. Raises like ``acquire``."""
        self._batch_release = True
        try:
            self.release_if_held(completed=False)
        finally:
            self._batch_release = False
        return self.acquire()

    def idle(self) -> bool:
        """The caller has no more work queued: ``release_if_held(completed=True)``."""
        return self.release_if_held(completed=True)

    def token_left_ms(self) -> float:
        """Time left on the held token (0 when none is held)."""
        if self.token_ms is None:
            return 0.0
        return self.token_ms - (time.perf_counter() - self._t_grant) * 1000.0

    def should_yield(self, next_kernel_ms: float) -> bool:
        """Gemini revocation: True when the next kernel does not fit in the token's rest."""
        return should_yield(self.token_left_ms(), next_kernel_ms)

    def close(self) -> None:
        """Close the connection (a held token is released by the server). Idempotent."""
        sock, self._sock = self._sock, None
        self.token_ms = None
        self._in_burst = False
        self._used_ms = 0.0
        if sock is not None:
            sock.close()

    def __enter__(self) -> TokenClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _io(self, fn: Callable[[*Args], object], *args: *Args) -> None:
        """``fn(*args)`` on the socket; a timeout or a lost connection closes the client and is
        raised as ``TimeoutError`` / ``ConnectionError`` naming the server (``_lost``)."""
        try:
            fn(*args)
        except OSError as e:
            raise self._lost(e) from None

    def _lost(self, e: OSError) -> OSError:
        """Close the client after ``e`` on its socket; the error to raise instead: a
        ``TimeoutError`` for a timeout (the socket's own, during the handshake, or the kernel's
        ``SO_RCVTIMEO`` / ``SO_SNDTIMEO`` afterwards, which fail the call with ``EAGAIN``), else
        a ``ConnectionError``."""
        self.close()
        if isinstance(e, (TimeoutError, BlockingIOError)):
            return TimeoutError(f"token server on {self.socket_path} did not answer in time")
        return ConnectionError(f"token server on {self.socket_path} went away: {e}")

    def _recv_exact(self, view: memoryview) -> None:
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        self._io(_recv_all, sock, view)

    def _read_frame(self) -> tuple[int, int, int, int, float]:
        self._recv_exact(self._in_view)
        op, flags, length, seq, value = FRAME.unpack_from(self._in)
        return op, flags, length, seq, value

    def _read_text(self, length: int) -> str:
        if length == 0:
            return ""
        buf = bytearray(length)
        self._recv_exact(memoryview(buf))
        return buf.decode("utf-8", errors="replace")


class MemoryReply:
    """The server's answer to ``MemoryChannel.resize``."""

    __slots__ = ("free_mb", "limit_mb", "refusal")

    def __init__(self, limit_mb: float, free_mb: float, refusal: str) -> None:
        self.limit_mb = limit_mb
        """The limit the instance holds now (unchanged when refused)."""
        self.free_mb = free_mb
        """The device's unreserved memory after the answer."""
        self.refusal = refusal
        """Empty when granted, else the reason (``protocol.MEMORY_REFUSALS``)."""

    @property
    def granted(self) -> bool:
        return not self.refusal


class MemoryChannel:
    """An instance's memory channel to its device's token server (``tokens.protocol``):
    ``resize`` asks the device's memory ledger for a new limit. Blocking; used by one thread
    (the instance's memory watchdog). Raises like ``TokenClient`` (``UnknownClientError``,
    ``ConnectionError``, ``TimeoutError``)."""

    def __init__(
        self,
        socket_path: str,
        client_id: str,
        timeout_s: float = 5.0,
        *,
        secret: str | None = None,
    ) -> None:
        raw = hello_text(client_id, secret)
        self.client_id = client_id
        self._seq = 0
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            try:
                self._sock.connect(socket_path)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise ConnectionError(f"no token server on {socket_path}: {e}") from None
            flags = PROTOCOL_VERSION | HELLO_MEMORY_CHANNEL
            self._sock.sendall(FRAME.pack(OP_HELLO, flags, len(raw), 0, 0.0) + raw)
            op, flags, length, _seq, _value = FRAME.unpack(self._recv(FRAME_SIZE))
            if op == OP_ERROR:
                raise error_for(flags, self._recv(length).decode("utf-8", "replace"))
            if op != OP_WELCOME:
                raise TokenRuntimeError(f"token server answered HELLO with op 0x{op:02x}")
        except BaseException:
            self.close()
            raise

    def resize(self, limit_mb: float, steps: int = 0) -> MemoryReply:
        """Ask for a memory limit of ``limit_mb`` (``steps``: how many steps of growth it is)."""
        return self._ask(limit_mb, max(0, min(steps, 0x7F)))

    def over_max(self) -> MemoryReply:
        """Report that a request needed more than the instance's ``max`` (counted)."""
        return self._ask(0.0, MEMORY_OVER_MAX)

    def _ask(self, limit_mb: float, flags: int) -> MemoryReply:
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"memory channel of {self.client_id!r} is closed")
        seq = self._seq = (self._seq + 1) & SEQ_MASK
        try:
            sock.sendall(FRAME.pack(OP_MEMORY, flags, 0, seq, float(limit_mb)))
            op, code, length, _rseq, value = FRAME.unpack(self._recv(FRAME_SIZE))
            text = self._recv(length)
        except OSError as e:
            self.close()
            raise ConnectionError(f"memory channel of {self.client_id!r}: {e}") from None
        if op == OP_ERROR:
            raise error_for(code, text.decode("utf-8", "replace"))
        if op != OP_MEMORY_REPLY or len(text) != F64.size:
            self.close()
            raise TokenRuntimeError(f"token server answered MEMORY with op 0x{op:02x}")
        reason = MEMORY_REFUSALS[code] if code < len(MEMORY_REFUSALS) else f"refused ({code})"
        return MemoryReply(value, F64.unpack(text)[0], reason)

    def _recv(self, n: int) -> bytes:
        assert self._sock is not None
        buf = bytearray(n)
        if n:
            _recv_all(self._sock, memoryview(buf))
        return bytes(buf)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def _kernel_timeouts(sock: socket.socket, timeout_s: float | None) -> None:
    """Make ``sock`` blocking, with ``timeout_s`` (None: none) enforced by the kernel
    (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``: a call that waits longer fails with ``EAGAIN``).

    A Python socket with its own timeout is non-blocking and polls before every send and
    receive: two more system calls per round trip than a blocking socket. Called once the
    handshake (which keeps the Python timeout, so ``connect`` is bounded too) is done."""
    sock.settimeout(None)
    if timeout_s is None:
        return
    whole_s = int(timeout_s)
    usec = min(999_999, round((timeout_s - whole_s) * 1e6))
    if whole_s == 0 and usec == 0:
        usec = 1  # an all-zero timeval means no timeout at all
    tv = struct.pack("@ll", whole_s, usec)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _recv_rest(sock: socket.socket, view: memoryview, got: int) -> None:
    """Fill the rest of ``view`` after a first ``recv_into`` that returned ``got`` bytes;
    ``ConnectionError`` if the peer closed (``got`` 0, or before the rest came)."""
    if got == 0:
        raise ConnectionError("closed by the server")
    _recv_all(sock, view[got:])


def _recv_all(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``ConnectionError`` if the peer closes first."""
    got, want = 0, len(view)
    while got < want:
        k = sock.recv_into(view[got:], want - got) if got else sock.recv_into(view, want)
        if k == 0:
            raise ConnectionError("closed by the server")
        got += k


__all__ = ["MemoryChannel", "MemoryReply", "TokenClient"]
