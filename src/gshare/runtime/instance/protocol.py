"""The gateway ↔ instance data-path protocol: length-prefixed binary frames.

Ray places and supervises instances but carries no request: the gateway keeps one persistent
stream connection per instance (a Unix domain socket when both are on the same node, TCP
across nodes) and multiplexes requests on it by id, so many requests are in flight on one
connection and responses may come back in any order (batches complete out of arrival order
when an instance is restarted or a request is retried).

Request frame (gateway → instance), little-endian::

    u32 length of the rest | u64 request id | u8 op | u8 encoding | payload (length - 10 bytes)

Response frame (instance → gateway)::

    u32 length of the rest | u64 request id | u8 status | u8 encoding
    | f32 queue_ms | f32 token_wait_ms | f32 exec_ms | u16 batch | payload (length - 24 bytes)

``queue_ms`` is the time the request waited at the instance before its batch started (batching
wait included), ``token_wait_ms`` the time the batch waited for its time token, ``exec_ms`` the
batch's busy time (the time reported to the token server), ``batch`` the batch size.

Ops: ``OP_INVOKE`` (run the handler on the payload), ``OP_EXAMPLE`` (run the handler on its
own ``example_input()``; the profiler's closed loop uses it so it needs no knowledge of the
function's input format), ``OP_CONTROL`` (payload: JSON command, e.g. ``{"cmd":
"set_batching", "max_batch": 4, "max_wait_ms": 500}``; answered with a JSON object).

Encodings: ``ENC_RAW`` (bytes, handed to the handler as ``bytes``), ``ENC_JSON`` (a JSON
document, decoded with ``json.loads``), ``ENC_OIP`` (an Open Inference Protocol v2 request as
the client sent it — HTTP JSON, HTTP with binary tensor data, or a serialized gRPC
``ModelInferRequest`` — behind ``gateway.oip``'s envelope: transport, JSON header length, model
version; the instance validates and decodes the tensors, checks them against the handler's
``input_spec`` and hands it ``torch`` tensors). Responses to ``ENC_OIP`` requests are
``ENC_JSON`` (an OIP JSON response), ``ENC_OIP_BINARY`` (u32 length of the JSON header, the
JSON header, then the outputs' binary data: the binary tensor data extension) or
``ENC_PROTOBUF`` (a serialized ``ModelInferResponse``).

Statuses: ``ST_OK``; ``ST_BAD_INPUT`` (the input was rejected: a 4xx for the client);
``ST_FUNCTION_ERROR`` (the handler raised: a 5xx); ``ST_MEMORY_LIMIT`` (the instance went
over its memory limit while the request was queued or running; it is being restarted);
``ST_DRAINING`` (the instance is stopping and did not accept the request: the gateway sends it
elsewhere); ``ST_INTERNAL``. Error payloads are UTF-8 messages.

Streamed answers (``OP_GENERATE``, a generative function: ``instance.generative.serving``):
the request's payload is ``ENC_JSON`` ``{"prompt": str | [token ids], "parameters": {...}}``
(``GenerationParams``: ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``). The
instance answers it with zero or more ``ST_CHUNK`` frames, then exactly one final frame with
the request's id. A ``ST_CHUNK`` frame's payload is ``ENC_JSON`` ``{"text": str, "tokens":
n}`` (the new text, complete UTF-8 characters, and how many tokens it stands for; text may be
empty while a token's bytes are held back); its ``batch`` field is the number of sequences in
the step that produced it. The final frame is ``ST_OK`` with ``ENC_JSON`` ``{"text", "tokens",
"finish_reason": "stop" | "length", "prompt_tokens", "completion_tokens", "ttft_ms",
"tpot_ms", "queued_ms", "preemptions"}`` (its ``text`` is the last piece, not the whole), or
an error status with a UTF-8 message: ``ST_BAD_INPUT`` (a bad prompt or parameters, or a
request that can never fit the model's context or KV memory), ``ST_FUNCTION_ERROR`` (the
handler raised), ``ST_CANCELLED`` (after ``OP_CANCEL``: the generation stopped at a step
boundary and its KV cache was freed). Chunks are small and always inline (never in a lane).
``OP_INVOKE`` on a generative function answers the whole completion in one frame
(``{"text", "finish_reason", "tokens"}``, as the handler's ``predict``).

``ST_STATS`` frames (request id 0, no request of their own): a generative instance's engine
counters as ``ENC_JSON`` (``running``, ``waiting``, ``kv_bytes``, ``kv_limit_bytes``,
``tokens_generated``, ``cancelled``, ``finished``, ``refused``, ``preemptions``, ``steps``),
sent on each connection that has submitted a generation, at most every ``STATS_PERIOD_S``
while it works and once when it goes idle; the gateway keeps the last per connection
(``/metrics``).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import TYPE_CHECKING, Final

from gshare.runtime.instance.lanes import nbytes

if TYPE_CHECKING:
    import asyncio

REQ_HEADER: Final = struct.Struct("<IQBB")
"""length, request id, op, encoding."""
RESP_HEADER: Final = struct.Struct("<IQBBfffH")
"""length, request id, status, encoding, queue_ms, token_wait_ms, exec_ms, batch."""
REQ_REST: Final = struct.Struct("<QBB")
"""A request frame after its length prefix (``FrameReader`` strips the prefix)."""
RESP_REST: Final = struct.Struct("<QBBfffH")
"""A response frame after its length prefix."""
REQ_FIXED: Final[int] = REQ_REST.size
RESP_FIXED: Final[int] = RESP_REST.size
MAX_FRAME_BYTES: Final[int] = 1 << 30
"""Frames larger than this are a protocol error (the gateway's body limit is far below)."""

OP_INVOKE: Final[int] = 1
OP_CONTROL: Final[int] = 2
OP_EXAMPLE: Final[int] = 3
OP_AUTH: Final[int] = 5
"""The first frame on every connection to an instance launched with a channel secret
(``InstanceLaunch.channel_secret``; the controller gives every instance one), over its Unix
socket as over TCP: its payload is the secret. Anything else first, or a wrong secret, and the
instance closes the connection — another tenant's handler, running as the same user, cannot
invoke, drain or reconfigure an instance by its socket."""
OP_LANES: Final[int] = 6
"""Sent by the gateway right after ``OP_AUTH`` on a Unix-socket connection, with two memory
files passed along (``SCM_RIGHTS``): the connection's shared-memory lanes (``instance.lanes``;
payload ``lanes.LANES_MSG``). No answer. A frame whose encoding has ``lanes.ENC_IN_LANE`` set
then carries a ``lanes.LANE_REF`` instead of its payload, in either direction."""
OP_CANCEL: Final[int] = 4
"""Drop request ``request_id`` (the frame's id) if it has not started: its caller went away.
The instance answers the dropped request with ``ST_CANCELLED``; one already in a batch runs to
the end and is answered as usual — except a generation (``OP_GENERATE``), which stops at the
next step boundary and is answered ``ST_CANCELLED``. The cancel frame itself gets no answer."""
OP_GENERATE: Final[int] = 7
"""Generate from a prompt, answered by a stream of ``ST_CHUNK`` frames and one final frame
(module doc)."""

ENC_RAW: Final[int] = 0
ENC_JSON: Final[int] = 1
ENC_OIP: Final[int] = 2
ENC_OIP_BINARY: Final[int] = 3
ENC_PROTOBUF: Final[int] = 4

ST_OK: Final[int] = 0
ST_BAD_INPUT: Final[int] = 1
ST_FUNCTION_ERROR: Final[int] = 2
ST_MEMORY_LIMIT: Final[int] = 3
ST_DRAINING: Final[int] = 4
ST_INTERNAL: Final[int] = 5
ST_CANCELLED: Final[int] = 6
ST_TIMEOUT: Final[int] = 7
"""The instance's ``predict`` ran past the function's ``predict_timeout_s`` (504)."""
ST_CHUNK: Final[int] = 8
"""A part of a streamed answer; more frames with the same id follow (module doc)."""
ST_STATS: Final[int] = 9
"""A generative instance's engine counters, request id 0 (module doc)."""
STATS_PERIOD_S: Final[float] = 0.1

STATUS_NAMES: Final[dict[int, str]] = {
    ST_OK: "ok",
    ST_BAD_INPUT: "bad input",
    ST_FUNCTION_ERROR: "function error",
    ST_MEMORY_LIMIT: "memory limit",
    ST_DRAINING: "draining",
    ST_INTERNAL: "internal error",
    ST_CANCELLED: "cancelled",
    ST_CHUNK: "chunk",
    ST_STATS: "stats",
}


Payload = bytes | tuple[bytes | memoryview, ...]
"""A request's payload at the gateway: one buffer, or its parts in order (an HTTP body as it
arrived, behind its envelope), joined only if it is sent inline (``payload_bytes``)."""


def payload_bytes(payload: Payload) -> bytes:
    return payload if isinstance(payload, bytes) else b"".join(payload)


def payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else nbytes(payload)


class ProtocolError(Exception):
    """A malformed frame; the connection is closed."""


def encode_request(request_id: int, op: int, encoding: int, payload: bytes) -> bytes:
    return REQ_HEADER.pack(REQ_FIXED + len(payload), request_id, op, encoding) + payload


def encode_response(
    request_id: int,
    status: int,
    encoding: int,
    payload: bytes,
    queue_ms: float = 0.0,
    token_wait_ms: float = 0.0,
    exec_ms: float = 0.0,
    batch: int = 0,
) -> bytes:
    return (
        RESP_HEADER.pack(
            RESP_FIXED + len(payload),
            request_id,
            status,
            encoding,
            queue_ms,
            token_wait_ms,
            exec_ms,
            min(batch, 0xFFFF),
        )
        + payload
    )


class FrameReader:
    """Incremental splitter of a byte stream into frames (``feed`` returns complete frames,
    each without its u32 length prefix). Used by both ends."""

    __slots__ = ("_buf", "_min")

    def __init__(self, min_frame: int) -> None:
        self._buf = bytearray()
        self._min = min_frame

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (length,) = struct.unpack_from("<I", buf, pos)
            if length < self._min or length > MAX_FRAME_BYTES:
                raise ProtocolError(f"bad frame length {length}")
            end = pos + 4 + length
            if end > n:
                break
            # one copy, through a view: a bytearray slice would be a second large buffer,
            # and a fresh allocation of a large frame costs page faults, not just a memcpy
            out.append(bytes(memoryview(buf)[pos + 4 : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out


def call_once(
    uds_path: str,
    op: int,
    encoding: int,
    payload: bytes,
    timeout_s: float = 60.0,
    secret: str = "",
) -> tuple[int, bytes]:
    """One blocking request on a fresh connection to an instance's Unix socket (``secret``: its
    channel secret, sent first when given); returns ``(status, payload)``. For tools, benches
    and tests (the gateway multiplexes instead). Raises ``ProtocolError`` when the instance
    closes the connection without an answer."""
    closed = "the instance closed the connection without an answer"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout_s)
        s.connect(uds_path)
        try:
            if secret:
                s.sendall(encode_request(0, OP_AUTH, ENC_RAW, secret.encode()))
            s.sendall(encode_request(1, op, encoding, payload))
            reader = FrameReader(RESP_FIXED)
            while True:
                data = s.recv(1 << 16)
                if not data:
                    raise ProtocolError(closed)
                for frame in reader.feed(data):
                    _rid, status, *_rest = RESP_REST.unpack_from(frame)
                    return int(status), frame[RESP_FIXED:]
        except (BrokenPipeError, ConnectionResetError):  # closed while we were still talking
            raise ProtocolError(closed) from None


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle off on a TCP transport (both ends of a gateway ↔ instance connection send
    small frames that must not wait); Unix sockets are left alone."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


__all__ = [
    "ENC_JSON",
    "ENC_OIP",
    "ENC_OIP_BINARY",
    "ENC_PROTOBUF",
    "ENC_RAW",
    "OP_CONTROL",
    "OP_EXAMPLE",
    "OP_GENERATE",
    "OP_INVOKE",
    "OP_LANES",
    "Payload",
    "payload_bytes",
    "payload_size",
    "REQ_FIXED",
    "REQ_HEADER",
    "REQ_REST",
    "RESP_FIXED",
    "RESP_REST",
    "RESP_HEADER",
    "STATUS_NAMES",
    "STATS_PERIOD_S",
    "ST_BAD_INPUT",
    "ST_CHUNK",
    "ST_DRAINING",
    "ST_FUNCTION_ERROR",
    "ST_INTERNAL",
    "ST_MEMORY_LIMIT",
    "ST_OK",
    "ST_STATS",
    "FrameReader",
    "ProtocolError",
    "call_once",
    "encode_request",
    "encode_response",
    "set_nodelay",
]
