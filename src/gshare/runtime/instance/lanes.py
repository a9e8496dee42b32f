"""Shared-memory lanes: large payloads between the gateway and an instance on the same node
without passing through the socket.

Why: a 1 MiB tensor sent as a frame on the Unix socket is copied into the kernel, out of it,
into asyncio's buffers (and moved down them as the send buffer drains), into the frame reader
and out of it again — about 300–400 MB/s of tensor per direction on a small machine
(docs/journal/oip.md). Through a lane it is written once into memory the other side has
mapped, and the frame on the socket carries only where it is.

The design (who calls what):

* The gateway (``gateway.channel.InstanceChannel``) creates two anonymous memory files per
  Unix-socket connection (``GatewayLanes``, ``os.memfd_create``): the **request lane**, which
  only the gateway writes, and the **response lane**, which only the instance writes. It
  passes both to the instance in its ``OP_LANES`` frame, with ``SCM_RIGHTS``
  (``send_with_fds``), right after ``OP_AUTH``. The instance's walls give it a private
  ``/dev/shm``, so a named shared-memory object would not reach it; a passed descriptor does.
* The instance (``instance.wire``) takes the descriptors from its first read of a new
  connection (``recv_with_fds``) and maps them (``InstanceLanes``). TCP connections (another
  node) have no lanes: everything goes inline, as before.
* A payload of ``LANE_MIN_BYTES`` or more that fits goes through a lane: its frame's encoding
  has ``ENC_IN_LANE`` set and its payload is ``LANE_REF`` (the position and the length in
  the lane). Anything else — small payloads, a full lane, a payload larger than half
  a lane — is sent inline; the two kinds mix freely on one connection.
* **Request lane**: the gateway allocates (``FirstFit``: the lowest gap), writes, and frees a
  request's bytes when the instance's answer to it arrives (whatever its status) — until then
  the instance may be reading them, even after the gateway gave up on the request. The
  instance reads them in place: an OIP request's tensors are ``numpy.frombuffer`` views of the
  lane, so a handler's inputs are valid until its ``predict`` returns (as with Triton's shared
  memory); a handler that keeps an input beyond that must copy it.
* **Response lane**: the instance allocates and writes; the gateway copies each answer out as
  it reads the frame (frames arrive in the order the instance allocated them) — or lends it
  as a view to a caller that writes it somewhere at once (an output into a client's
  shared-memory region) and gives it back — and publishes how far the instance may overwrite
  in the lane's first 8 bytes (``RingCursor``): up to the first answer not yet given back.
* **Memory**: a lane is address space until its pages are first written; requests take the
  lowest gap and the response ring starts again at its front whenever it empties
  (``Ring.alloc``), so the memory a lane holds follows the most data in flight on it at once,
  not its size. Request-lane pages are charged to the
  gateway; response-lane pages to the instance that wrote them (its answers; under walls, to
  its memory cgroup — they are shared pages, so not to its model memory, ``instance.memory``).

What must hold: both ends compute a response's offset the same way (``Ring``: positions only
grow, an allocation never wraps; it skips to the lane's start instead), a position and length
from the socket are checked against the lane before use (``InstanceLanes.request_view``,
``GatewayLanes.take_response``), and a lane is never unmapped while a view of it may be alive
(each lives as long as its connection).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import mmap
import os
import socket
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

ENC_IN_LANE: Final[int] = 0x80
"""Set in a frame's encoding byte: its payload is a ``LANE_REF``, the bytes are in a lane."""
LANE_REF: Final = struct.Struct("<QQ")
"""A lane frame's payload: absolute position in the lane's ring, length in bytes."""
LANES_MSG: Final = struct.Struct("<QQ")
"""``OP_LANES``'s payload: the request lane's and the response lane's sizes in bytes."""
LANE_MIN_BYTES: Final[int] = 64 * 1024
"""Payloads smaller than this go inline: a frame on the socket costs less than the lane's
bookkeeping."""
HEADER_BYTES: Final[int] = 64
"""The response lane's header: the gateway's read cursor (u64) at offset 0; data after it."""
DEFAULT_REQUEST_LANE_MB: Final[int] = 256
"""The gateway's default request lane per instance connection (the response lane: half)."""
MAX_FDS: Final[int] = 2


class LaneError(Exception):
    """A lane reference that does not fit the lane, or lanes that cannot be set up."""


# -- the ring both ends agree on ------------------------------------------------------------------


class Ring:
    """Allocation in a ring of ``size`` bytes by absolute positions that only grow.

    ``alloc(n)`` gives the position of ``n`` contiguous bytes, or None when they would
    overwrite bytes not yet released (``release_to``) or are more than half the ring. An
    allocation never wraps: when it would, it starts at the ring's next turn instead (the
    skipped bytes are released with it). ``offset(pos)`` = ``pos % size``.
    """

    __slots__ = ("size", "head", "tail")

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise LaneError(f"a lane must have a positive size, not {size}")
        self.size = size
        self.head = 0
        """Where the next allocation may start."""
        self.tail = 0
        """Everything before this is released."""

    def alloc(self, n: int) -> int | None:
        if n <= 0 or 2 * n > self.size:
            return None
        if self.head == self.tail and self.head % self.size:
            # empty: start again at the front, so that the pages in use (memory is committed
            # as it is first touched) follow the bytes in flight, not the lane's size
            self.head = self.tail = self.head + (self.size - self.head % self.size)
        off = self.head % self.size
        pos = self.head if off + n <= self.size else self.head + (self.size - off)
        if pos + n - self.tail > self.size:
            return None
        self.head = pos + n
        return pos

    def offset(self, pos: int) -> int:
        return pos % self.size

    def release_to(self, pos: int) -> None:
        if pos > self.tail:
            self.tail = min(pos, self.head)


class FirstFit:
    """The request lane's allocator (gateway only): the lowest gap of ``n`` bytes among the
    allocations still held, which are released in any order. Keeping allocations at the front
    keeps the lane's touched pages — its memory — at the most bytes ever in flight at once. At
    most a few dozen allocations are held (a connection's requests in flight), so a scan is
    cheap. Positions are offsets (``pos % size == pos``)."""

    __slots__ = ("size", "_starts", "_ends")

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise LaneError(f"a lane must have a positive size, not {size}")
        self.size = size
        self._starts: list[int] = []
        """The held allocations' starts, sorted."""
        self._ends: dict[int, int] = {}

    def alloc(self, n: int) -> int | None:
        if n <= 0 or 2 * n > self.size:
            return None
        prev_end = 0
        for i, start in enumerate(self._starts):
            if start - prev_end >= n:
                self._starts.insert(i, prev_end)
                self._ends[prev_end] = prev_end + n
                return prev_end
            prev_end = self._ends[start]
        if self.size - prev_end < n:
            return None
        self._starts.append(prev_end)
        self._ends[prev_end] = prev_end + n
        return prev_end

    def release(self, pos: int) -> None:
        if self._ends.pop(pos, None) is not None:
            self._starts.remove(pos)

    @property
    def held(self) -> int:
        return len(self._starts)


class RingCursor:
    """The response lane's read cursor, in shared memory: written by the gateway after it
    copied an answer out, read by the instance before it allocates. An aligned 8-byte load or
    store (``ctypes``) is one instruction on the machines we run on, so neither side sees a
    torn value."""

    __slots__ = ("_cell",)

    def __init__(self, mm: mmap.mmap) -> None:
        self._cell = ctypes.c_uint64.from_buffer(mm, 0)

    def get(self) -> int:
        return int(self._cell.value)

    def set(self, pos: int) -> None:
        self._cell.value = pos

    def release(self) -> None:
        """Drop the view of the mapping (before it is closed)."""
        del self._cell


def nbytes(parts: Sequence[bytes | memoryview]) -> int:
    """Bytes in ``parts`` (a view's ``len`` counts its items, not its bytes)."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


def _write_parts(mm: mmap.mmap, at: int, parts: Sequence[bytes | memoryview]) -> None:
    for part in parts:
        n = part.nbytes if isinstance(part, memoryview) else len(part)
        mm[at : at + n] = part
        at += n


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


# -- the gateway's side ---------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Loan:
    """A borrowed answer (``GatewayLanes.borrow_response``): where it is in the lane."""

    start: int
    end: int
    returned: bool = False


class GatewayLanes:
    """One connection's two lanes on the gateway's side (module doc): it writes requests into
    the request lane and reads answers out of the response lane."""

    def __init__(self, request_bytes: int, response_bytes: int) -> None:
        if response_bytes <= HEADER_BYTES:
            raise LaneError(f"a response lane needs more than {HEADER_BYTES} bytes")
        self.request_bytes = request_bytes
        self.response_bytes = response_bytes
        self._fds = [
            os.memfd_create("gshare-request-lane", os.MFD_CLOEXEC),
            os.memfd_create("gshare-response-lane", os.MFD_CLOEXEC),
        ]
        try:
            os.ftruncate(self._fds[0], request_bytes)
            os.ftruncate(self._fds[1], response_bytes)
            self._req = _map(self._fds[0], request_bytes)
            self._resp = _map(self._fds[1], response_bytes)
        except OSError:
            self.close_fds()
            raise
        self._req_space = FirstFit(request_bytes)
        self._held: dict[int, int] = {}
        """Request id → its allocation in the request lane, until the instance answers."""
        self._cursor = RingCursor(self._resp)
        self._resp_size = response_bytes - HEADER_BYTES
        """The response ring's size (the instance allocates in it: ``Ring``)."""
        self._loans: deque[Loan] = deque()
        """Answers read and not yet given back, in the lane's order."""
        self._seen_end = 0
        """Where the last answer read ends."""
        self._closed = False
        self.responses_in_lane = 0

    def fds(self) -> list[int]:
        """The two descriptors to pass (``send_with_fds``); ``close_fds`` once passed."""
        return list(self._fds)

    def hello(self) -> bytes:
        """``OP_LANES``'s payload."""
        return LANES_MSG.pack(self.request_bytes, self.response_bytes)

    def close_fds(self) -> None:
        """The descriptors are no longer needed once passed (the mappings stay)."""
        close_fds(self._fds)
        self._fds = []

    def put_request(self, req_id: int, parts: Sequence[bytes | memoryview]) -> bytes | None:
        """Write a payload (``parts``, in order) into the request lane for request ``req_id``:
        the frame payload (``LANE_REF``) to send instead, or None (send it inline) when it is
        small or does not fit now."""
        n = nbytes(parts)
        if n < LANE_MIN_BYTES:
            return None
        pos = self._req_space.alloc(n)
        if pos is None:
            return None
        _write_parts(self._req, pos, parts)
        self._held[req_id] = pos
        return LANE_REF.pack(pos, n)

    def release_request(self, req_id: int) -> None:
        """The instance answered request ``req_id``: its bytes may be overwritten."""
        pos = self._held.pop(req_id, None)
        if pos is not None:
            self._req_space.release(pos)

    def borrow_response(self, ref: bytes | memoryview) -> tuple[memoryview, Loan]:
        """An answer in the response lane (its frame's ``LANE_REF``) as a view, and the loan
        to ``give_back`` once it has been used: until then the instance does not overwrite
        it (nor anything after it: answers are given back in any order, the instance reuses
        the lane in order). ``LaneError`` when the reference does not fit the lane."""
        pos, n = LANE_REF.unpack_from(ref)
        size = self._resp_size
        off = pos % size  # as Ring.offset
        # the answer starts after the last one read and, if an earlier one is still lent,
        # ends within one turn of that one's start (the instance may not overwrite it)
        if (
            n <= 0
            or off + n > size
            or pos < self._seen_end
            or (self._loans and pos + n - self._loans[0].start > size)
        ):
            raise LaneError(f"an answer at {pos} ({n} bytes) is outside the response lane")
        self._seen_end = pos + n
        start = HEADER_BYTES + off
        loan = Loan(pos, pos + n)
        self._loans.append(loan)
        self.responses_in_lane += 1
        return memoryview(self._resp)[start : start + n], loan

    def give_back(self, loan: Loan) -> None:
        """A borrowed answer has been used: the instance may overwrite it (and every answer
        before it that was given back too)."""
        loan.returned = True
        loans = self._loans
        end = -1
        while loans and loans[0].returned:
            end = loans.popleft().end
        if end >= 0 and not self._closed:
            self._cursor.set(end)

    def take_response(self, ref: bytes | memoryview) -> bytes:
        """A copy of an answer in the response lane, whose bytes the instance may then reuse
        (``borrow_response``, copied, given back)."""
        view, loan = self.borrow_response(ref)
        try:
            return bytes(view)
        finally:
            view.release()
            self.give_back(loan)

    def close(self) -> None:
        """Unmap both lanes (the connection is gone; a borrowed answer's view keeps its
        mapping until it goes)."""
        if self._closed:
            return
        self._closed = True
        self.close_fds()
        self._cursor.release()
        for mm in (self._req, self._resp):
            with contextlib.suppress(BufferError):
                mm.close()


# -- the instance's side --------------------------------------------------------------------------


class InstanceLanes:
    """One connection's two lanes on the instance's side (module doc): it reads requests in
    place from the request lane and writes answers into the response lane. ``put_response``
    is called only from the batching thread, in the order the frames are then written."""

    def __init__(self, fds: Sequence[int], request_bytes: int, response_bytes: int) -> None:
        if len(fds) != 2:
            raise LaneError(f"OP_LANES carries 2 descriptors, not {len(fds)}")
        for fd, want in zip(fds, (request_bytes, response_bytes), strict=True):
            have = os.fstat(fd).st_size
            if have < want or want <= HEADER_BYTES:
                raise LaneError(f"a lane of {have} bytes cannot hold the {want} announced")
        self._req = _map(fds[0], request_bytes)
        self._resp = _map(fds[1], response_bytes)
        self.request_bytes = request_bytes
        self._cursor = RingCursor(self._resp)
        self._resp_ring = Ring(response_bytes - HEADER_BYTES)
        self._view = memoryview(self._req)

    def request_view(self, ref: bytes | memoryview) -> memoryview:
        """The request's bytes in the lane (``LANE_REF``), without a copy. ``LaneError``."""
        if len(ref) != LANE_REF.size:
            raise LaneError(f"a lane reference is {LANE_REF.size} bytes, not {len(ref)}")
        pos, n = LANE_REF.unpack_from(ref)
        if n <= 0 or pos + n > self.request_bytes:
            raise LaneError(f"a request at {pos} ({n} bytes) is outside the request lane")
        return self._view[pos : pos + n]

    def put_response(self, parts: Sequence[bytes | memoryview]) -> bytes | None:
        """Write an answer into the response lane: the frame payload (``LANE_REF``) to send
        instead, or None (send it inline) when it is small or does not fit now."""
        n = nbytes(parts)
        if n < LANE_MIN_BYTES:
            return None
        ring = self._resp_ring
        ring.release_to(self._cursor.get())
        pos = ring.alloc(n)
        if pos is None:
            return None
        _write_parts(self._resp, HEADER_BYTES + ring.offset(pos), parts)
        return LANE_REF.pack(pos, n)


# -- passing the descriptors ----------------------------------------------------------------------


def close_fds(fds: Sequence[int]) -> None:
    """Close descriptors received or made for a connection, whatever state they are in."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def send_with_fds(sock: socket.socket, data: bytes, fds: Sequence[int]) -> None:
    """Send ``data`` with ``fds`` attached (``SCM_RIGHTS``) on a connected Unix socket; the
    whole of ``data`` (small: the connection's first frames) or ``OSError``."""
    sent = sock.sendmsg(
        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    )
    if sent < len(data):
        sock.setblocking(True)
        try:
            sock.sendall(data[sent:])
        finally:
            sock.setblocking(False)


def recv_with_fds(sock: socket.socket, max_bytes: int = 1 << 16) -> tuple[bytes, list[int]]:
    """One read of a Unix socket with any descriptors passed with it (at most ``MAX_FDS``;
    more, or a truncated set, are closed and ``LaneError`` raised)."""
    fd_size = array.array("i").itemsize
    data, ancdata, flags, _addr = sock.recvmsg(max_bytes, socket.CMSG_SPACE(MAX_FDS * fd_size))
    fds: list[int] = []
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(cdata[: len(cdata) - (len(cdata) % fd_size)])
            fds.extend(a)
    if flags & socket.MSG_CTRUNC:
        close_fds(fds)
        raise LaneError("more descriptors were passed than a connection takes")
    return data, fds


__all__ = [
    "DEFAULT_REQUEST_LANE_MB",
    "ENC_IN_LANE",
    "HEADER_BYTES",
    "LANES_MSG",
    "LANE_MIN_BYTES",
    "LANE_REF",
    "FirstFit",
    "GatewayLanes",
    "InstanceLanes",
    "LaneError",
    "Loan",
    "Ring",
    "close_fds",
    "nbytes",
    "RingCursor",
    "recv_with_fds",
    "send_with_fds",
]
