"""Time tokens over a Unix domain socket: the live runtime's FaST Backend (FaST-GShare §3.3.2).

Who uses what (docs/DESIGN.md §5):

* the **node agent** owns one ``TokenServer`` per device. It registers every instance it starts
  (``add_client`` with the instance's ``ClientSpec``) *before* the instance connects, and
  removes it (``remove_client``) when the instance is gone. The server runs its own thread; it
  drives the pure ``gshare.policy.tokens.TokenScheduler`` with the wall clock and is the only
  place that touches the scheduler (all calls go through one lock, so ``add_client``,
  ``remove_client``, ``snapshot`` and ``token_records`` are safe from any thread).
* every **instance process** owns one ``TokenClient`` (one connection per instance). Its
  frontend calls ``acquire()`` before each burst (one batch on the device), runs the burst, and
  calls ``release(busy_ms)`` after it, or uses ``with client.burst(): ...``. Before each kernel
  it may ask ``should_yield(next_kernel_ms)`` and give the token back early (Gemini
  revocation, ``release(..., completed=False)``) rather than overrun it. A frontend with work
  queued back to back reuses its token instead (Gemini: a token is a time slice):
  ``start_burst()`` runs the next burst on the held token while its rest fits the predicted
  burst (the EWMA of its own bursts; with ``split_bursts=True``, for a frontend that checks
  ``should_yield`` before every kernel: while any time is left on it), else releases it and
  acquires another; ``end_burst()``
  keeps the token; ``idle()`` releases it, charged with the busy time of all its bursts, when
  the queue is empty. The round trip (100-300 us where waking a sleeping thread is slow) is then
  paid once per token, not once per burst.

What must hold:

* every decision is the scheduler's: the server only turns socket events into ``request`` /
  ``release`` calls, calls ``tick`` at ``next_wakeup_ms()`` while a client waits, and delivers
  the returned grants; the SM adapter, quotas and limits are therefore exactly the policy's;
* a grant goes only to the connection that asked for it; a grant that nobody can receive (its
  client disconnected while waiting, or has no request outstanding) is given back at once
  (``release(busy_ms=0, completed=False)``), so it never blocks the device;
* a connection that drops while holding a token releases it, charged with the wall time since
  the grant (``completed=False``); the client stays registered (the agent removes clients) and
  may reconnect under the same id;
* a malformed frame closes that connection only (logged); an event the scheduler rejects
  (unknown client, acquire while holding, release without a token, bad ``busy_ms``) gets an
  error reply and the connection stays open; nothing a client sends stops the server.

Wire protocol (version 1). Every message is a 16-byte little-endian frame, optionally
followed by ``length`` bytes of UTF-8 text::

    offset  size  field
    0       u8    op
    1       u8    flags
    2       u16   length  (bytes of text after the frame; 0 except HELLO and ERROR)
    4       u32   seq     (the client's sequence number of the message, echoed in replies)
    8       f64   value   (milliseconds)

    client -> server
      0x01 HELLO    flags = protocol version (| 0x80: the memory channel, below),
                    length = len(text) in 1..MAX_HELLO_BYTES, text = client_id, or
                    client_id NUL secret when the agent registered the client with a secret
      0x02 ACQUIRE  seq = n                       -> GRANT(seq = n) when the token is dispatched
      0x03 RELEASE  seq = n, value = busy_ms, flags bit 0 = completed     (no reply on success)
      0x04 MEMORY   seq = n, value = the memory limit wanted (MiB), flags = its steps (0..127)
                    or 0x80: "a request needed more than my max" (counted, value ignored)
                                                  -> MEMORY_REPLY(seq = n)
    server -> client
      0x81 WELCOME  value = window_ms             (reply to HELLO)
      0x82 GRANT    seq = the ACQUIRE's seq, value = token length ms, flags bit 0 = elastic
      0x83 MEMORY_REPLY value = the limit held now (MiB), flags = 0 granted, else
                    1 device memory full, 2 no reservation, 3 bad value; length = 8 and
                    text = the device's free MiB after it as a little-endian f64
      0xEE ERROR    flags = error code, seq = the offending message's seq, text = message

The memory channel: an instance with a memory limit opens a second connection whose HELLO
has flag 0x80, and sends only MEMORY on it (its watchdog thread, so that a grow never waits
behind a token). The limit is the device's ``policy.memory.DeviceMemory`` ledger's: the agent
reserved the instance's starting limit; a MEMORY grows it when the device has the memory free
and always shrinks it.

Identity: the agent registers each instance with a random secret (``add_client(spec,
secret)``) and hands it to that instance only (in its launch, not its environment); a HELLO
without it, or with another, is refused with error 5 (bad credentials), so a process that
learnt an instance id (they are predictable and listed in ``/metrics``) cannot take over its
tokens. A client registered without a secret (tests, benches) is identified by its id alone.
Busy times stay self-reported: an instance can under-report its own use (the runtime's
frontends measure it; a tenant's handler code runs inside that frontend).

Error codes: 1 unknown client, 2 connection not identified (no HELLO yet), 3 bad state
(ACQUIRE while waiting or holding, RELEASE without a token, second HELLO, client id already
connected), 4 bad value (``busy_ms`` negative or not finite). A RELEASE has no reply, so one
request + release costs one round trip; an ERROR for a RELEASE reaches the client with its
next ``acquire`` and is logged there (the server's state is authoritative). Anything else -- an
unknown op, a non-zero length on ACQUIRE/RELEASE, a bad version, an id that is not UTF-8 --
is malformed and closes the connection.

Priority classes (FIKIT, ``TokenServer(priority_classes=True)``: the agent's default, ``gshare
serve --priority-sharing fikit``): the server keeps ``policy.priority.plan_classes`` over its
clients (active: asking, holding a token, or within a window of a RELEASE with
``completed=False`` — such a client asks again at once). An ACQUIRE of a client below the top
active class is held — no GRANT, no error — until its class may run, then handed to the token
scheduler like any other; a grant for a client that a higher class overtook meanwhile is given
back and its request held again. The top class is published on the device's board
(``tokens.board``), where a token holder below it reads it at its next preemption point and
gives its token back (RELEASE, ``completed=False``): the wire protocol is unchanged.

Limits: the server never takes a token back (a device burst cannot be pre-empted; an overrun
is charged as debt by the policy), so an instance that hangs while holding one blocks its SM
band until its connection drops -- the agent's liveness check must kill such an instance. A
RELEASE is asynchronous: ``snapshot`` may show the token held until the server has read it.

Latency: the client uses a blocking socket (its timeout is the kernel's ``SO_RCVTIMEO`` /
``SO_SNDTIMEO``, so a round trip is one send and one receive, with no poll before each) and
reuses its frame buffers; a token given back to ask for the next at once (``renew``) goes in
the same send as the ACQUIRE. The server is one epoll loop (``select.epoll``, one wake-up per
read). Where an acquire + release spends its time: docs/journal/tokens.md. The server thread
needs the GIL to answer, so keep CPU-bound Python threads out of the process that hosts it (or
lower ``sys.setswitchinterval``): a busy thread can delay a grant by the switch interval (5 ms
by default).
"""

from __future__ import annotations

import logging
import struct

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
FRAME = struct.Struct("<BBHId")  # op, flags, length, seq, value_ms: 16 bytes
FRAME_SIZE = FRAME.size

OP_HELLO = 0x01
OP_ACQUIRE = 0x02
OP_RELEASE = 0x03
OP_MEMORY = 0x04
OP_WELCOME = 0x81
OP_GRANT = 0x82
OP_MEMORY_REPLY = 0x83
OP_ERROR = 0xEE

ERR_UNKNOWN_CLIENT = 1
ERR_NOT_IDENTIFIED = 2
ERR_BAD_STATE = 3
ERR_BAD_VALUE = 4
ERR_BAD_CREDENTIALS = 5
MAX_HELLO_BYTES = 512
"""Longest HELLO text: the client id (at most ``MAX_ID_BYTES``), NUL and its secret."""

HELLO_MEMORY_CHANNEL = 0x80
"""HELLO flag: this connection is the client's memory channel."""
MEMORY_OVER_MAX = 0x80
"""MEMORY flag: a request needed more than the instance's own ``max`` (a refusal to count)."""
MEMORY_REFUSALS = ("", "device memory full", "no reservation", "bad value")
"""MEMORY_REPLY flags -> the reason."""
F64 = struct.Struct("<d")

MAX_ID_BYTES = 255
MAX_ERROR_BYTES = 1024
SEQ_MASK = 0xFFFFFFFF
SELECT_FD_LIMIT = 1024  # FD_SETSIZE: select(2) takes no descriptor at or above it


class TokenRuntimeError(RuntimeError):
    """The token server refused a message (``code`` is the wire error code), or the client was
    used out of order (``code`` 0)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class UnknownClientError(TokenRuntimeError):
    """The server has no client of that id (never added by the agent, or removed since)."""


def error_for(code: int, message: str) -> TokenRuntimeError:
    if code == ERR_UNKNOWN_CLIENT:
        return UnknownClientError(message, code)
    return TokenRuntimeError(message, code)


def hello_text(client_id: str, secret: str | None) -> bytes:
    """The text of a HELLO; ``ValueError`` for an id that is not 1..``MAX_ID_BYTES`` bytes."""
    raw = client_id.encode("utf-8")
    if not 0 < len(raw) <= MAX_ID_BYTES or b"\0" in raw:
        raise ValueError(f"client_id must be 1..{MAX_ID_BYTES} bytes of UTF-8, got {client_id!r}")
    return raw + b"\0" + secret.encode("ascii") if secret else raw


__all__ = [
    "hello_text",
    "FRAME",
    "FRAME_SIZE",
    "HELLO_MEMORY_CHANNEL",
    "MEMORY_OVER_MAX",
    "MEMORY_REFUSALS",
    "PROTOCOL_VERSION",
    "TokenRuntimeError",
    "UnknownClientError",
    "error_for",
]
