"""Triton's system shared-memory extension of the Open Inference Protocol, in the gateway: the
registry of the regions clients registered (each an ``mmap`` of a POSIX shared-memory object),
the checks of a region and of every tensor reference into one, and the rewriting of an infer
request that references shared memory into an ordinary one (and of its answer back).

Who calls what:

* ``oip_service.OipService`` owns one ``SharedMemoryRegistry`` (``OipService.shm``) for both
  transports; ``oip_http`` routes ``/v2/systemsharedmemory/...`` and ``grpc_server``'s
  ``SystemSharedMemory{Status,Register,Unregister}`` call ``register`` / ``unregister`` /
  ``status``; the server's lifespan calls ``close`` at shutdown (every mapping closed).
* The infer paths detect a reference cheaply and only then come here: HTTP with
  ``mentions_shm`` (a substring search of the JSON part of the body for ``shared_memory_``),
  gRPC with ``grpc_mentions_shm`` on the request it parses anyway. ``prepare_http`` /
  ``prepare_grpc`` resolve the references and build the ``ENC_OIP`` payload the instance gets:
  each shared-memory input becomes binary tensor data (HTTP: ``binary_data_size``; gRPC:
  ``raw_input_contents``) copied once, straight from the mapping, by the one join that builds
  the payload (``oip.header.wrap``); each output requested into a region is asked of the
  instance as binary data. ``finish_http`` / ``finish_grpc`` write those outputs from the
  instance's answer into their regions and rewrite the answer: the output carries
  ``shared_memory_region``, ``shared_memory_byte_size`` (the bytes written) and
  ``shared_memory_offset``, and no data. The instance never sees shared memory.

What must hold: everything here runs on the gateway's event loop (HTTP and gRPC share it), so
the registry needs no lock; a reference is resolved to the ``Region`` object when the request
arrives, and a region unregistered before the answer came is an error for that request, not
a write into a closed mapping. Every bad reference is one ``HttpError`` 400 naming the tensor
and the problem (gRPC: INVALID_ARGUMENT). CUDA shared memory is not supported.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import stat
import struct
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, TypedDict, TypeGuard

import orjson

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.instance import protocol as P
from gshare.runtime.oip.grpc_wire import REQUEST_RAW_FIELD, raw_field
from gshare.runtime.oip.header import (
    BINARY_DATA,
    BINARY_DATA_SIZE,
    DATATYPES,
    NP_DTYPES,
    TRANSPORT_GRPC,
    TRANSPORT_HTTP,
    fmt_shape,
    wrap,
)

if TYPE_CHECKING:
    from gshare.runtime.oip.grpc_messages import InferParameter

REGION: Final = "shared_memory_region"
BYTE_SIZE: Final = "shared_memory_byte_size"
OFFSET: Final = "shared_memory_offset"
SHM_PARAMS: Final = (REGION, BYTE_SIZE, OFFSET)
MARKER: Final = b"shared_memory_"
"""What every shared-memory parameter starts with: ``mentions_shm``'s substring."""

SHM_ROOT: Final = Path("/dev/shm")
"""Where Linux keeps POSIX shared-memory objects (``shm_open(key)`` is ``SHM_ROOT/key``)."""

CUDA_NOT_SUPPORTED: Final = (
    "CUDA shared memory is not supported by gshare: register system shared memory instead "
    "(/v2/systemsharedmemory/region/{name}/register; tritonclient's "
    "register_system_shared_memory)"
)


class RegionStatus(TypedDict):
    """One region as Triton's status answers it (HTTP list entry; gRPC ``RegionStatus``)."""

    name: str
    key: str
    offset: int
    byte_size: int


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


class Region:
    """A registered region: ``byte_size`` bytes at ``offset`` of the shared-memory object
    ``key``, mapped read-write. Built by ``SharedMemoryRegistry.register``; ``close`` unmaps
    it (later reads and writes are an ``HttpError`` 400 naming the region)."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mm: mmap.mmap, at: int):
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._mm: mmap.mmap | None = mm
        self._view: memoryview | None = memoryview(mm)[at : at + byte_size]

    @property
    def closed(self) -> bool:
        return self._view is None

    def status(self) -> RegionStatus:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def _live(self) -> memoryview:
        if self._view is None:
            raise HttpError(
                400,
                f"shared memory region {self.name!r} was unregistered while the request used it",
            )
        return self._view

    def read(self, offset: int, size: int) -> memoryview:
        """A view of ``size`` bytes at ``offset`` of the region (bounds checked by the caller:
        ``SharedMemoryRegistry.reference``). It is the request's input until the request is
        sent (and re-sent, after a crash): while it lives it pins the mapping, so a region
        unregistered meanwhile is unmapped when the last such view goes (``close``)."""
        return self._live()[offset : offset + size]

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._live()[offset : offset + len(data)] = data

    def close(self) -> None:
        """Unmap (idempotent). A view still held elsewhere keeps the pages until it goes."""
        view, mm = self._view, self._mm
        self._view = self._mm = None
        if view is not None:
            view.release()
        if mm is not None:
            with contextlib.suppress(BufferError):  # a view still lives: unmapped when it goes
                mm.close()


@dataclass(frozen=True, slots=True)
class Ref:
    """A tensor's reference into a region: ``byte_size`` bytes at ``offset`` of it."""

    region: Region
    offset: int
    byte_size: int

    def answer(self, written: int) -> dict[str, object]:
        """The output's parameters in the answer: where its ``written`` bytes are."""
        return {REGION: self.region.name, BYTE_SIZE: written, OFFSET: self.offset}


class SharedMemoryRegistry:
    """The regions registered by name (module doc). ``root``: where shared-memory objects
    live (tests may point it elsewhere); ``enabled`` False (``gshare serve
    --no-shared-memory``): every registration is refused, so no request can name a region."""

    def __init__(self, root: Path = SHM_ROOT, *, enabled: bool = True) -> None:
        self.root = root
        self.enabled = enabled
        self._regions: dict[str, Region] = {}

    # -- the extension's API ------------------------------------------------------------------

    def register(self, name: str, key: object, offset: object, byte_size: object) -> Region:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key`` as region
        ``name``. ``HttpError`` 400 when the name is taken, a field is malformed, or the object
        is not one this server may map: it must exist under ``root`` (``key`` with or without
        its leading slash, no other slash), not be a symbolic link (opened with
        ``O_NOFOLLOW``), be a regular file owned by the server's own uid, and hold
        ``offset + byte_size`` bytes."""
        if not self.enabled:
            raise HttpError(
                400,
                "system shared memory is turned off on this server "
                "(gshare serve --no-shared-memory)",
            )
        if not name:
            raise HttpError(400, "a shared memory region needs a non-empty name")
        if name in self._regions:
            raise HttpError(
                400,
                f"shared memory region {name!r} is already registered (key "
                f"{self._regions[name].key!r}): unregister it first",
            )
        if not isinstance(key, str) or not key.lstrip("/"):
            raise HttpError(400, f"region {name!r}: 'key' must be a non-empty string")
        if not _is_int(offset) or offset < 0:
            raise HttpError(400, f"region {name!r}: 'offset' must be an integer >= 0")
        if not _is_int(byte_size) or byte_size <= 0:
            raise HttpError(400, f"region {name!r}: 'byte_size' must be an integer > 0")
        base = key.lstrip("/")
        if "/" in base or "\0" in base or base in (".", ".."):
            raise HttpError(
                400,
                f"region {name!r}: key {key!r} is not a POSIX shared memory name "
                "('/name', one component)",
            )
        if len(base.encode()) > 255:
            raise HttpError(400, f"region {name!r}: the key is longer than 255 bytes (NAME_MAX)")
        path = self.root / base
        where = f"region {name!r}: shared memory object {key!r} ({path})"
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise HttpError(400, f"{where} does not exist: create it first") from None
        except IsADirectoryError:
            raise HttpError(400, f"{where} is not a regular file (a directory)") from None
        except OSError as e:
            why = (
                "is a symbolic link" if os.path.islink(path) else f"cannot be opened: {e.strerror}"
            )
            raise HttpError(400, f"{where} {why}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise HttpError(400, f"{where} is not a regular file")
            uid = os.geteuid()
            if st.st_uid != uid:
                raise HttpError(
                    400, f"{where} is owned by uid {st.st_uid}, not by the server's uid {uid}"
                )
            if offset + byte_size > st.st_size:
                raise HttpError(
                    400,
                    f"{where} holds {st.st_size} bytes: offset {offset} + byte_size "
                    f"{byte_size} runs past its end",
                )
            at = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mm = mmap.mmap(fd, offset + byte_size - at, offset=at)
            except OSError as e:
                raise HttpError(400, f"{where} cannot be mapped: {e.strerror}") from None
        finally:
            os.close(fd)
        region = Region(name, key, offset, byte_size, mm, offset - at)
        self._regions[name] = region
        return region

    def unregister(self, name: str = "") -> list[str]:
        """Unmap region ``name`` (empty: every region); the names unregistered. An unknown
        name unregisters nothing (as Triton)."""
        names = list(self._regions) if not name else [name] if name in self._regions else []
        for n in names:
            self._regions.pop(n).close()
        return names

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region's status (``name`` empty), or that one region's (``HttpError`` 400
        when it is not registered)."""
        if name:
            return [self.region(name).status()]
        return [r.status() for r in self._regions.values()]

    def close(self) -> None:
        """Unmap every region (the server's shutdown)."""
        self.unregister()

    def __len__(self) -> int:
        return len(self._regions)

    # -- references ---------------------------------------------------------------------------

    def region(self, name: str, where: str = "") -> Region:
        """Region ``name``; ``HttpError`` 400 (prefixed with ``where``) when not registered."""
        r = self._regions.get(name)
        if r is None:
            known = ", ".join(map(repr, self._regions)) or "none"
            raise HttpError(
                400,
                f"{where}{': ' if where else ''}shared memory region {name!r} is not "
                f"registered (registered: {known})",
            )
        return r

    def reference(self, where: str, params: Mapping[str, object]) -> Ref | None:
        """The tensor's shared-memory reference in its ``params`` (None: it has none).
        ``HttpError`` 400 unless ``shared_memory_region`` names a registered region and
        ``shared_memory_byte_size`` (required) and ``shared_memory_offset`` (default 0) lie
        within it."""
        if not any(k in params for k in SHM_PARAMS):
            return None
        name, size, offset = params.get(REGION), params.get(BYTE_SIZE), params.get(OFFSET, 0)
        if not isinstance(name, str) or not name:
            raise HttpError(
                400,
                f"{where}: parameters.{REGION} must name a registered region (the "
                f"shared memory parameters go together: {REGION} and {BYTE_SIZE}, optionally "
                f"{OFFSET})",
            )
        if not _is_int(size) or size < 0:
            raise HttpError(
                400, f"{where}: parameters.{BYTE_SIZE} must be an integer >= 0 (it is required)"
            )
        if not _is_int(offset) or offset < 0:
            raise HttpError(400, f"{where}: parameters.{OFFSET} must be an integer >= 0")
        r = self.region(name, where)
        if offset + size > r.byte_size:
            raise HttpError(
                400,
                f"{where}: {OFFSET} {offset} + {BYTE_SIZE} {size} runs past the end of "
                f"shared memory region {name!r} ({r.byte_size} bytes)",
            )
        return Ref(r, offset, size)

    def input_reference(
        self, where: str, params: Mapping[str, object], shape: object, datatype: object
    ) -> Ref | None:
        """``reference`` of an input, whose byte size must also be what its shape and
        datatype need (BYTES: any; its elements are checked by the instance)."""
        ref = self.reference(where, params)
        if ref is None:
            return None
        if BINARY_DATA_SIZE in params:
            raise HttpError(
                400, f"{where}: give either shared memory or {BINARY_DATA_SIZE}, not both"
            )
        if not isinstance(shape, list | tuple) or not all(_is_int(d) and d >= 0 for d in shape):
            raise HttpError(
                400, f"{where}: 'shape' must be a list of non-negative integers, got {shape!r}"
            )
        if datatype not in DATATYPES:
            raise HttpError(
                400, f"{where}: unknown datatype {datatype!r} (known: {', '.join(DATATYPES)})"
            )
        assert isinstance(datatype, str)
        if datatype != "BYTES":
            need = math.prod(shape) * NP_DTYPES[datatype].itemsize
            if ref.byte_size != need:
                raise HttpError(
                    400,
                    f"{where}: {BYTE_SIZE} is {ref.byte_size} bytes but shape "
                    f"{fmt_shape(shape)} of {datatype} needs {need}",
                )
        return ref


# -- HTTP ---------------------------------------------------------------------------------------


def mentions_shm(chunks: Sequence[bytes], header_len: int) -> bool:
    """Whether the JSON part of an HTTP infer body (its first ``header_len`` bytes; < 0: all
    of it) mentions a shared-memory parameter: a substring search, no parsing (the ordinary
    path pays this alone). Chunk boundaries are searched too."""
    n = len(MARKER)
    limit = header_len if header_len >= 0 else sum(len(c) for c in chunks)
    seen, tail = 0, b""
    for c in chunks:
        if seen >= limit:
            break
        part = c if len(c) <= limit - seen else c[: limit - seen]  # no copy of a whole chunk
        if MARKER in part or (tail and MARKER in tail + part[: n - 1]):
            return True
        seen += len(part)
        tail = part[-(n - 1) :]
    return False


def _slices(chunks: Sequence[bytes], start: int, size: int) -> list[memoryview]:
    """Views of ``size`` bytes at ``start`` of the concatenated ``chunks`` (no copy)."""
    out: list[memoryview] = []
    pos = 0
    end = start + size
    for c in chunks:
        lo, hi = max(start, pos), min(end, pos + len(c))
        if lo < hi:
            out.append(memoryview(c)[lo - pos : hi - pos])
        pos += len(c)
        if pos >= end:
            break
    return out


def _params_of(obj: dict[str, object], where: str) -> dict[str, object]:
    p = obj.get("parameters")
    if p is None:
        p = obj["parameters"] = {}
    if not isinstance(p, dict):
        raise HttpError(400, f"{where}: 'parameters' must be an object")
    return p


def prepare_http(
    reg: SharedMemoryRegistry, chunks: Sequence[bytes], header_len: int, version: int
) -> tuple[P.Payload, dict[str, Ref]]:
    """An HTTP infer body whose JSON part mentions shared memory (``mentions_shm``) → the
    ``ENC_OIP`` payload for the instance and the outputs to write into regions (by name).

    Each input with shared-memory parameters becomes binary tensor data read from its
    region; the other inputs keep their ``data`` or binary data (views of ``chunks``, in
    order); each output requested into a region is asked for as binary data. The payload is
    in parts (``wrap``): the inputs are views of their regions and of ``chunks``, copied once,
    where the request is sent (``Region.read``). ``HttpError`` 400 for a bad reference or a
    malformed header (the instance checks the rest of the tensors, as for any request)."""
    total = sum(len(c) for c in chunks)
    json_len = header_len if header_len >= 0 else total
    head = b"".join(_slices(chunks, 0, json_len))
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as e:
        raise HttpError(400, f"malformed JSON header: {e}") from None
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(inputs, list):
        raise HttpError(400, "'inputs' must be a non-empty list of tensors")
    binary_len = total - json_len if header_len >= 0 else 0
    parts: list[memoryview] = []
    try:
        pos = 0  # into the body's binary part
        for i, t in enumerate(inputs):
            if not isinstance(t, dict):
                raise HttpError(400, f"inputs[{i}]: must be an object with name, shape, datatype")
            where = f"input {t.get('name', i)!r}"
            params = _params_of(t, where)
            ref = reg.input_reference(where, params, t.get("shape"), t.get("datatype"))
            if ref is not None:
                if t.get("data") is not None:
                    raise HttpError(400, f"{where}: give either 'data' or shared memory, not both")
                for k in SHM_PARAMS:
                    params.pop(k, None)
                params[BINARY_DATA_SIZE] = ref.byte_size
                parts.append(ref.region.read(ref.offset, ref.byte_size))
                continue
            size = params.get(BINARY_DATA_SIZE)
            if size is None:
                continue
            if not _is_int(size) or size < 0:
                raise HttpError(400, f"{where}: {BINARY_DATA_SIZE} must be an integer >= 0")
            if header_len < 0:
                raise HttpError(
                    400,
                    f"{where}: parameters.{BINARY_DATA_SIZE} is given but the request has no "
                    "'Inference-Header-Content-Length' header: a body with binary tensor data "
                    "needs it (the length of the JSON part, in bytes)",
                )
            if pos + size > binary_len:
                raise HttpError(
                    400,
                    f"the body has {binary_len} bytes of binary tensor data after its JSON "
                    f"header, but the inputs' {BINARY_DATA_SIZE} add up to more",
                )
            parts.extend(_slices(chunks, json_len + pos, size))
            pos += size
        if pos != binary_len:
            raise HttpError(
                400,
                f"the body has {binary_len} bytes of binary tensor data after its JSON header, "
                f"but the inputs' {BINARY_DATA_SIZE} add up to {pos}",
            )
        outputs: dict[str, Ref] = {}
        outs = doc.get("outputs")
        for i, o in enumerate(outs if isinstance(outs, list) else ()):
            if not isinstance(o, dict):
                continue  # the instance names the problem
            where = f"output {o.get('name', i)!r}"
            params = _params_of(o, where)
            ref = reg.reference(where, params)
            if ref is None:
                continue
            name = o.get("name")
            if not isinstance(name, str) or not name:
                raise HttpError(400, f"outputs[{i}]: 'name' must be a non-empty string")
            for k in SHM_PARAMS:
                params.pop(k, None)
            params[BINARY_DATA] = True
            outputs[name] = ref
        js = orjson.dumps(doc)
        return wrap(TRANSPORT_HTTP, len(js) if parts else -1, version, [js, *parts]), outputs
    except BaseException:
        for v in parts:  # a refused request pins no mapping (Region.read)
            v.release()
        raise


def finish_http(
    renc: int, data: bytes | memoryview, outputs: Mapping[str, Ref]
) -> tuple[int, bytes]:
    """The instance's HTTP answer (``ENC_JSON`` or ``ENC_OIP_BINARY``: u32 JSON length, JSON,
    binary data) with the outputs of ``outputs`` written into their regions and carrying
    the shared-memory parameters instead of data; the same encodings back. ``HttpError``
    400 when an output does not fit its reference."""
    if not outputs:
        return renc, bytes(data)
    if renc == P.ENC_OIP_BINARY:
        (json_len,) = struct.unpack_from("<I", data)
        doc = orjson.loads(memoryview(data)[4 : 4 + json_len])
        blob = memoryview(data)[4 + json_len :]
    else:
        doc, blob = orjson.loads(data), memoryview(b"")
    kept: list[memoryview] = []
    pos = 0
    for o in doc.get("outputs", []):
        params = o.get("parameters") or {}
        size = params.get(BINARY_DATA_SIZE)
        ref = outputs.get(o.get("name"))
        if size is None:
            if ref is not None:
                raise HttpError(500, f"output {o['name']!r} came back without binary data")
            continue
        raw = blob[pos : pos + size]
        pos += size
        if ref is None:
            kept.append(raw)
            continue
        _write(o["name"], ref, raw)
        params.pop(BINARY_DATA_SIZE)
        params.update(ref.answer(size))
        o["parameters"] = params
    js = orjson.dumps(doc)
    if not kept:
        return P.ENC_JSON, js
    return P.ENC_OIP_BINARY, b"".join([struct.pack("<I", len(js)), js, *kept])


def _write(name: str, ref: Ref, raw: bytes | memoryview) -> None:
    if len(raw) > ref.byte_size:
        raise HttpError(
            400,
            f"output {name!r} is {len(raw)} bytes but its shared memory reference holds only "
            f"{ref.byte_size} ({BYTE_SIZE} at {OFFSET} {ref.offset} of region "
            f"{ref.region.name!r})",
        )
    ref.region.write(ref.offset, raw)


# -- gRPC ---------------------------------------------------------------------------------------


class GrpcTensor(Protocol):
    """A ``ModelInferRequest``'s input or requested output, as the rewrite touches it."""

    name: str
    parameters: MutableMapping[str, InferParameter]


class GrpcInput(GrpcTensor, Protocol):
    datatype: str
    shape: Sequence[int]

    def HasField(self, field: str) -> bool: ...  # noqa: N802 (protobuf's name)


class GrpcRequest(Protocol):
    """``inference.ModelInferRequest``, parsed (``grpc_server`` parses it for its name)."""

    inputs: Sequence[GrpcInput]
    outputs: Sequence[GrpcTensor]
    raw_input_contents: Sequence[bytes]

    def ClearField(self, field: str) -> None: ...  # noqa: N802

    def SerializeToString(self) -> bytes: ...  # noqa: N802


def grpc_mentions_shm(req: GrpcRequest) -> bool:
    """Whether a parsed ``ModelInferRequest`` has a shared-memory parameter on a tensor."""
    return any(
        k.startswith("shared_memory_") for t in (*req.inputs, *req.outputs) for k in t.parameters
    )


def prepare_grpc(
    reg: SharedMemoryRegistry, req: GrpcRequest, version: int
) -> tuple[P.Payload, dict[str, Ref]]:
    """A parsed ``ModelInferRequest`` with shared-memory parameters (``grpc_mentions_shm``) →
    the ``ENC_OIP`` payload for the instance and the outputs to write into regions.

    Each shared-memory input gets its ``raw_input_contents`` entry read from its region (the
    others keep theirs, in order: with shared-memory inputs, the others must come as raw
    contents, as tritonclient sends them); the payload is the request without its raw
    contents, then one length-delimited ``raw_input_contents`` field per input (protobuf
    appends repeated fields), in parts as ``prepare_http``'s. ``HttpError`` 400 as
    ``prepare_http``."""
    # lazy: only gRPC servers load the protobuf classes
    from gshare.runtime.oip.grpc_messages import parameter_value as _value

    raws = list(req.raw_input_contents)
    refs: list[Ref | None] = []
    for t in req.inputs:
        where = f"input {t.name!r}"
        params = {k: _value(p) for k, p in t.parameters.items()}
        ref = reg.input_reference(where, params, list(t.shape), t.datatype)
        if ref is not None and t.HasField("contents"):
            raise HttpError(400, f"{where}: give either contents or shared memory, not both")
        refs.append(ref)
    plain = [t for t, r in zip(req.inputs, refs, strict=True) if r is None]
    if len(raws) != len(plain):
        if not raws:
            raise HttpError(
                400,
                f"input {plain[0].name!r}: with inputs in shared memory, send the others in "
                "raw_input_contents (typed contents cannot be mixed with shared memory)",
            )
        raise HttpError(
            400,
            f"raw_input_contents has {len(raws)} entries but the request has {len(plain)} "
            "inputs not in shared memory (give one per such input, in order)",
        )
    for t, r in zip(req.inputs, refs, strict=True):
        if r is not None:
            for k in SHM_PARAMS:
                if k in t.parameters:
                    del t.parameters[k]
    outputs: dict[str, Ref] = {}
    for o in req.outputs:
        where = f"output {o.name!r}"
        params = {k: _value(p) for k, p in o.parameters.items()}
        ref = reg.reference(where, params)
        if ref is None:
            continue
        for k in SHM_PARAMS:
            if k in o.parameters:
                del o.parameters[k]
        outputs[o.name] = ref
    req.ClearField("raw_input_contents")
    parts: list[bytes | memoryview] = [req.SerializeToString()]
    it = iter(raws)
    for r in refs:
        data: bytes | memoryview = next(it) if r is None else r.region.read(r.offset, r.byte_size)
        parts += [raw_field(REQUEST_RAW_FIELD, len(data)), data]
    return wrap(TRANSPORT_GRPC, -1, version, parts), outputs


def finish_grpc(data: bytes, outputs: Mapping[str, Ref]) -> bytes:
    """The instance's serialized ``ModelInferResponse`` with the outputs of ``outputs`` written
    into their regions: each keeps an empty ``raw_output_contents`` entry (the entries stay
    aligned with the outputs, as Triton's) and carries the shared-memory parameters.
    ``HttpError`` 400 when an output does not fit its reference."""
    if not outputs:
        return data
    from gshare.runtime.oip.grpc_messages import pb, set_parameter  # lazy: as prepare_grpc

    resp = pb.ModelInferResponse.FromString(data)
    raws = resp.raw_output_contents
    for i, o in enumerate(resp.outputs):
        ref = outputs.get(o.name)
        if ref is None:
            continue
        if i >= len(raws):
            raise HttpError(500, f"output {o.name!r} came back without raw contents")
        raw = raws[i]
        _write(o.name, ref, raw)
        raws[i] = b""
        for k, v in ref.answer(len(raw)).items():
            set_parameter(o.parameters[k], v)
    return bytes(resp.SerializeToString())


__all__ = [
    "BYTE_SIZE",
    "CUDA_NOT_SUPPORTED",
    "OFFSET",
    "REGION",
    "Ref",
    "Region",
    "RegionStatus",
    "SharedMemoryRegistry",
    "finish_grpc",
    "finish_http",
    "grpc_mentions_shm",
    "mentions_shm",
    "prepare_grpc",
    "prepare_http",
]
