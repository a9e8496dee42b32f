"""The shared-memory lanes between the gateway and an instance (``instance.lanes``): the two
allocators' invariants, the descriptors passed over a real Unix socket pair, payloads read in
place (no copy) on the instance's side, and references checked before use; and the
protobuf splitter (``oip.grpc_wire``) that lets a gRPC tensor stay where it is."""

from __future__ import annotations

import os
import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.lanes import (
    HEADER_BYTES,
    LANE_MIN_BYTES,
    LANE_REF,
    FirstFit,
    GatewayLanes,
    InstanceLanes,
    LaneError,
    Ring,
    recv_with_fds,
    send_with_fds,
)
from gshare.runtime.oip.grpc_wire import REQUEST_RAW_FIELD, raw_field, split_message
from gshare.runtime.oip.header import TRANSPORT_GRPC, TRANSPORT_HTTP, OipError, wrap
from gshare.runtime.oip.payload import decode_request

MiB = 1 << 20

# -- the allocators ------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 600)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_first_fit_never_overlaps_and_packs_at_the_front(seq: list[tuple[str, int]]) -> None:
    size = 1000
    ff = FirstFit(size)
    held: dict[int, int] = {}
    for op, x in seq:
        if op == "alloc":
            pos = ff.alloc(x)
            if 2 * x > size:
                assert pos is None
                continue
            if pos is None:  # refused only when no gap of x bytes is free
                ends = sorted((p, p + n) for p, n in held.items())
                gaps = [
                    b[0] - a[1] for a, b in zip([(0, 0), *ends], [*ends, (size, size)], strict=True)
                ]
                assert max(gaps) < x
                continue
            assert pos >= 0 and pos + x <= size
            for p, n in held.items():
                assert pos + x <= p or p + n <= pos, "two held allocations overlap"
            # first fit: no lower gap was big enough
            lower = sorted((p, p + n) for p, n in held.items() if p < pos)
            starts = [0] + [e for _s, e in lower]
            stops = [s for s, _e in lower] + [pos]
            assert all(b - a < x for a, b in zip(starts[:-1], stops[:-1], strict=True))
            held[pos] = x
        elif held:
            pos = sorted(held)[x % len(held)]
            ff.release(pos)
            del held[pos]
    assert ff.held == len(held)
    for pos in list(held):
        ff.release(pos)
    assert ff.alloc(10) == 0  # empty: back at the front


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.booleans()), max_size=120))
def test_ring_allocations_never_wrap_or_overwrite_unreleased_bytes(
    seq: list[tuple[int, bool]],
) -> None:
    size = 1000
    ring = Ring(size)
    live: list[tuple[int, int]] = []  # FIFO, like the response lane's reader
    for n, release_first in seq:
        if release_first and live:
            pos, m = live.pop(0)
            ring.release_to(pos + m)
        pos = ring.alloc(n)
        if pos is None:
            assert 2 * n > size or live, "an empty ring must take anything up to half its size"
            continue
        off = ring.offset(pos)
        assert off + n <= size, "an allocation wrapped around the end"
        for p, m in live:
            assert pos >= p + m, "positions only grow"
            assert pos + n - p <= size, "it would overwrite bytes not yet read"
        live.append((pos, n))


def test_ring_starts_again_at_the_front_when_empty() -> None:
    ring = Ring(1000)
    a = ring.alloc(300)
    assert a == 0
    ring.release_to(300)
    b = ring.alloc(100)
    assert b is not None and ring.offset(b) == 0  # not at 300: pages stay the same few


# -- the lanes over a real socket pair -----------------------------------------------------------


@pytest.fixture
def pair() -> tuple[GatewayLanes, InstanceLanes]:
    """Lanes made by the gateway, passed over a Unix socket pair, mapped by the instance."""
    g = GatewayLanes(4 * MiB, 2 * MiB)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        hello = P.encode_request(0, P.OP_LANES, P.ENC_RAW, g.hello())
        send_with_fds(a, hello, g.fds())
        g.close_fds()
        data, fds = recv_with_fds(b)
    assert data == hello and len(fds) == 2
    req = P.FrameReader(P.REQ_FIXED).feed(data)[0]
    req_bytes, resp_bytes = struct.unpack_from("<QQ", req, P.REQ_FIXED)
    inst = InstanceLanes(fds, req_bytes, resp_bytes)
    for fd in fds:
        os.close(fd)
    return g, inst


def test_a_request_is_read_in_place_and_released_on_its_answer(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    body = os.urandom(MiB)
    ref = g.put_request(7, (b"head", body))
    assert ref is not None
    view = inst.request_view(ref)
    assert bytes(view) == b"head" + body
    # the same memory, not a copy: what the instance writes the gateway's mapping shows
    view[0:4] = b"HEAD"
    ref2 = g.put_request(8, (b"x" * LANE_MIN_BYTES,))
    assert ref2 is not None and LANE_REF.unpack(ref2)[0] >= MiB + 4  # request 7 still held
    g.release_request(7)
    g.release_request(8)
    ref3 = g.put_request(9, (body,))
    assert ref3 is not None and LANE_REF.unpack(ref3)[0] == 0  # freed: the front again


def test_small_or_oversized_payloads_stay_inline(pair: tuple[GatewayLanes, InstanceLanes]) -> None:
    g, inst = pair
    assert g.put_request(1, (b"x" * (LANE_MIN_BYTES - 1),)) is None
    assert g.put_request(2, (b"x" * (2 * MiB + 1),)) is None  # more than half the lane
    assert inst.put_response([b"y" * (LANE_MIN_BYTES - 1)]) is None


def test_a_full_request_lane_falls_back_until_an_answer_frees_it(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, _inst = pair
    big = b"z" * (2 * MiB)
    assert g.put_request(1, (big,)) is not None
    assert g.put_request(2, (big,)) is not None
    assert g.put_request(3, (big,)) is None  # full: this one goes inline
    g.release_request(1)
    assert g.put_request(3, (big,)) is not None


def test_answers_go_through_the_response_lane_in_order(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    a = np.arange(LANE_MIN_BYTES // 4, dtype=np.float32)
    refs = [inst.put_response([b"hdr", a.data]) for _ in range(3)]
    assert all(r is not None for r in refs)
    for r in refs:
        assert r is not None
        assert g.take_response(r) == b"hdr" + a.tobytes()
    assert g.responses_in_lane == 3
    # the whole lane is free again once everything was read
    big = inst.put_response([b"q" * ((2 * MiB - HEADER_BYTES) // 2)])
    assert big is not None


def test_the_instance_waits_for_the_gateway_to_read_before_reusing_answers(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    half = (2 * MiB - HEADER_BYTES) // 2
    first = inst.put_response([b"a" * half])
    second = inst.put_response([b"b" * half])
    assert first is not None and second is not None
    assert inst.put_response([b"c" * LANE_MIN_BYTES]) is None  # nothing read yet: full
    assert g.take_response(first) == b"a" * half
    third = inst.put_response([b"c" * LANE_MIN_BYTES])
    assert third is not None
    assert g.take_response(second) == b"b" * half
    assert g.take_response(third) == b"c" * LANE_MIN_BYTES


def test_answers_after_the_ring_emptied_start_again_at_the_front(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    half = (2 * MiB - HEADER_BYTES) // 2
    for n in (LANE_MIN_BYTES, half, LANE_MIN_BYTES, half, half):
        ref = inst.put_response([b"r" * n])
        assert ref is not None
        pos, _ = LANE_REF.unpack(ref)
        assert pos % (2 * MiB - HEADER_BYTES) == 0  # the front, every time: nothing unread
        assert g.take_response(ref) == b"r" * n


def test_lent_answers_are_reused_only_once_given_back_in_lane_order(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    half = (2 * MiB - HEADER_BYTES) // 2
    first = inst.put_response([b"a" * half])
    assert first is not None
    view, loan = g.borrow_response(first)
    assert bytes(view[:3]) == b"aaa"
    second = inst.put_response([b"b" * half])
    assert second is not None
    assert g.take_response(second) == b"b" * half  # copied and given back...
    # ...but the lent first answer still holds the lane: nothing may overwrite it
    assert inst.put_response([b"c" * LANE_MIN_BYTES]) is None
    assert bytes(view[:3]) == b"aaa"
    g.give_back(loan)
    assert inst.put_response([b"c" * LANE_MIN_BYTES]) is not None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_random_exchange_never_corrupts_or_refuses_an_answer(seed: int) -> None:
    """The instance writes answers while the gateway reads some late, copies most and lends
    some (given back in any order): every answer read is the one written, no lent answer is
    overwritten, and no valid reference is refused (the ring restarting at its front and
    skipping to a new turn included)."""
    import random

    rng = random.Random(seed)
    g = GatewayLanes(4 * MiB, 4 * MiB)
    inst = InstanceLanes(g.fds(), 4 * MiB, 4 * MiB)
    sent: list[tuple[bytes, bytes, int]] = []  # written, frame not read yet
    lent: list[tuple[memoryview, object, bytes]] = []
    for step in range(20_000):
        if rng.random() < 0.5:
            n = rng.choice([LANE_MIN_BYTES, 300_000, MiB, 1_900_000])
            tag = step.to_bytes(8, "little")
            ref = inst.put_response([tag, bytes(n - 8)])
            if ref is not None:
                sent.append((ref, tag, n))
        elif sent:
            ref, tag, n = sent.pop(0)
            if rng.random() < 0.3:
                view, loan = g.borrow_response(ref)
                assert bytes(view[:8]) == tag
                lent.append((view, loan, tag))
            else:
                data = g.take_response(ref)
                assert data[:8] == tag and len(data) == n
        if lent and rng.random() < 0.3:
            view, loan, tag = lent.pop(rng.randrange(len(lent)))
            assert bytes(view[:8]) == tag, "a lent answer was overwritten"
            g.give_back(loan)  # type: ignore[arg-type]
    assert g.responses_in_lane > 1000


@pytest.mark.parametrize(
    "pos, n",
    [(0, 0), (4 * MiB - 10, 100), (1 << 62, 10), (4 * MiB, LANE_MIN_BYTES)],
)
def test_a_reference_outside_the_lane_is_refused(
    pair: tuple[GatewayLanes, InstanceLanes], pos: int, n: int
) -> None:
    _g, inst = pair
    with pytest.raises(LaneError, match="outside the request lane"):
        inst.request_view(LANE_REF.pack(pos, n))
    with pytest.raises(LaneError, match="lane reference is 16 bytes"):
        inst.request_view(b"short")


def test_an_answer_reference_outside_the_response_lane_is_refused(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    with pytest.raises(LaneError, match="outside the response lane"):
        g.take_response(LANE_REF.pack(2 * MiB - 100, 200))  # past the lane's end
    ref = inst.put_response([b"x" * LANE_MIN_BYTES])
    assert ref is not None
    g.take_response(ref)
    with pytest.raises(LaneError, match="outside the response lane"):
        g.take_response(ref)  # before what was already read


def test_lanes_smaller_than_announced_are_refused() -> None:
    fd = os.memfd_create("t")
    try:
        os.ftruncate(fd, MiB)
        with pytest.raises(LaneError, match="cannot hold"):
            InstanceLanes([fd, fd], 2 * MiB, MiB)
        with pytest.raises(LaneError, match="2 descriptors"):
            InstanceLanes([fd], MiB, MiB)
    finally:
        os.close(fd)


def test_more_descriptors_than_a_connection_takes_are_closed() -> None:
    fds = [os.memfd_create(f"t{i}") for i in range(4)]
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        send_with_fds(a, b"x", fds)
        with pytest.raises(LaneError, match="more descriptors"):
            recv_with_fds(b)
    for fd in fds:
        os.close(fd)


# -- tensors in place ----------------------------------------------------------------------------


def test_an_http_binary_tensor_is_a_view_of_the_lane(
    pair: tuple[GatewayLanes, InstanceLanes],
) -> None:
    g, inst = pair
    x = np.random.default_rng(0).random(LANE_MIN_BYTES // 4, dtype=np.float32)
    header = (
        b'{"inputs":[{"name":"x","shape":[%d],"datatype":"FP32",'
        b'"parameters":{"binary_data_size":%d}}]}' % (x.size, x.nbytes)
    )
    ref = g.put_request(1, wrap(TRANSPORT_HTTP, len(header), 1, [header, x.data]))
    assert ref is not None
    lane = inst.request_view(ref)
    _call, got = decode_request(lane, None, None)
    arr = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_array_equal(arr.reshape(-1), x)
    assert np.shares_memory(arr, np.frombuffer(lane, np.uint8)), "the tensor was copied"


def test_a_grpc_tensor_is_a_view_of_the_lane(pair: tuple[GatewayLanes, InstanceLanes]) -> None:
    from tritonclient.grpc import service_pb2 as pb

    g, inst = pair
    x = np.arange(LANE_MIN_BYTES // 4, dtype=np.float32)
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[x.size])
    req.raw_input_contents.append(x.tobytes())
    ref = g.put_request(1, wrap(TRANSPORT_GRPC, -1, 1, [req.SerializeToString()]))
    assert ref is not None
    lane = inst.request_view(ref)
    _call, got = decode_request(lane, None, None)
    arr = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_array_equal(arr.reshape(-1), x)
    assert np.shares_memory(arr, np.frombuffer(lane, np.uint8)), "the tensor was copied"


# -- the protobuf splitter -----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=20),
    st.lists(st.binary(max_size=300), max_size=4),
    st.lists(st.sampled_from(["FP32", "INT64", "BYTES"]), max_size=4),
)
def test_split_message_keeps_everything_but_the_raw_contents(
    name: str, raws: list[bytes], dtypes: list[str]
) -> None:
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name=name, model_version="3", id="r")
    for i, dt in enumerate(dtypes):
        req.inputs.add(name=f"in{i}", datatype=dt, shape=[1, i])
    req.outputs.add(name="out")
    req.parameters["k"].int64_param = 5
    for r in raws:
        req.raw_input_contents.append(r)
    head, got = split_message(memoryview(req.SerializeToString()), REQUEST_RAW_FIELD)
    assert [bytes(g) for g in got] == raws
    expect = pb.ModelInferRequest()
    expect.CopyFrom(req)
    expect.ClearField("raw_input_contents")
    assert pb.ModelInferRequest.FromString(head) == expect
    # and appending raw fields back gives the original message
    rebuilt = head + b"".join(raw_field(REQUEST_RAW_FIELD, len(r)) + r for r in raws)
    assert pb.ModelInferRequest.FromString(rebuilt) == req


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05ab", b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x0b", b"\x00\x01"],
)
def test_split_message_refuses_malformed_messages(data: bytes) -> None:
    with pytest.raises(OipError, match="malformed protobuf"):
        split_message(memoryview(data), REQUEST_RAW_FIELD)
