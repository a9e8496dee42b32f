"""Model store: one copy per node, mapped read-only, zero-copy into models; real processes
measure that a second instance does not add a copy (PSS)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from safetensors import safe_open

from gshare.runtime.node.model_store import ModelStore

MB = 1 << 20


@pytest.fixture
def root() -> Iterator[str]:
    # On /dev/shm like the real store (tmpfs: PSS accounting of shared pages as in production).
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    path = f"{base}/gshare-test-{os.getuid()}-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(7, 5, generator=g)
    return {
        "f32": w,
        "tied": w,  # an alias of f32 (tied weights): stored once
        "f16": torch.randn(3, 3, generator=g).half(),
        "bf16": torch.randn(4, generator=g).bfloat16(),
        "f64": torch.randn(2, generator=g).double(),
        "i64": torch.arange(5),
        "u8": torch.arange(3, dtype=torch.uint8),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(3),  # 0-dim (BatchNorm's num_batches_tracked)
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous
    }


def test_put_get_roundtrip(root: str) -> None:
    store = ModelStore(root)
    state = _state()
    handle = store.put("m1", state)
    assert Path(handle).exists() and store.has("m1") and store.keys() == ["m1"]
    got = store.get("m1")
    assert got.keys() == state.keys()
    for k, v in state.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
        if v.numel():
            assert store.is_mapped(got[k], "m1")
    assert got["tied"].data_ptr() == got["f32"].data_ptr()
    # Tensors start aligned to their element size (fast loads; required by some kernels).
    assert all(t.data_ptr() % t.element_size() == 0 for t in got.values() if t.numel())
    # Each tensor is stored once: the file is the data plus a small header.
    data = sum(v.numel() * v.element_size() for k, v in state.items() if k != "tied")
    assert data <= store.nbytes("m1") <= data + 4096


def test_the_file_is_a_valid_safetensors_file(root: str) -> None:
    store = ModelStore(root)
    state = {k: v for k, v in _state().items() if k != "tied"}
    store.put("m1", state)
    with safe_open(str(store.path("m1")), framework="pt") as f:
        assert set(f.keys()) == set(state)
        for k in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            assert torch.equal(f.get_tensor(k), state[k])


def test_put_writes_once_and_get_maps_once_per_process(root: str) -> None:
    store = ModelStore(root)
    store.put("m", {"a": torch.ones(4)})
    st = store.path("m").stat()
    assert store.put("m", {"a": torch.zeros(4)}) == str(store.path("m"))  # key exists: no write
    assert store.path("m").stat().st_ino == st.st_ino
    assert torch.equal(store.get("m")["a"], torch.ones(4))
    a, b = store.get("m"), store.get("m")
    assert a is not b and a["a"].data_ptr() == b["a"].data_ptr()
    calls = []
    out = store.get_or_put("n", lambda: calls.append(1) or {"b": torch.arange(3)})
    out2 = store.get_or_put("n", lambda: calls.append(1) or {"b": torch.arange(3)})
    assert calls == [1] and torch.equal(out["b"], out2["b"])


def test_drop_keys_and_missing(root: str) -> None:
    store = ModelStore(root)
    store.put("a", {"x": torch.ones(2)})
    store.put("weird key/with:chars", {"x": torch.ones(2)})
    assert store.keys() == ["a", "weird key/with:chars"]
    assert store.path("weird key/with:chars").parent == Path(root)
    mapped = store.get("a")
    assert store.drop("a") and not store.has("a") and not store.drop("a")
    assert torch.equal(mapped["x"], torch.ones(2))  # existing mappings stay valid
    with pytest.raises(KeyError, match="no weights under key 'a'"):
        store.get("a")
    with pytest.raises(KeyError):
        store.nbytes("a")
    with pytest.raises(ValueError):
        store.path("")


def test_a_changed_store_file_fails_its_checksum_and_is_rebuilt(root: str) -> None:
    """``put`` records the data's SHA-256; ``verify`` recomputes it. A file changed after it
    was written (by someone who could: tenants cannot, tests/runtime/test_tenants.py) fails it,
    and ``put_weights`` then writes the weights again instead of handing the file out."""
    from gshare.runtime.node.tasks import put_weights

    spec = {"name": "m", "model": "mlp"}
    key = put_weights(root, spec)
    assert key is not None
    store = ModelStore(root)
    assert store.verify(key)
    good = {k: v.clone() for k, v in store.get(key).items()}
    path = store.path(key)
    path.chmod(0o644)
    with open(path, "r+b") as f:  # poison the last weights with NaN
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff" * 8)
    assert not store.verify(key)
    assert put_weights(root, spec) == key
    assert store.verify(key)
    fresh = ModelStore(root).get(key)
    assert all(torch.equal(fresh[k], good[k]) for k in good)
    with pytest.raises(KeyError):
        store.verify("absent")


def test_default_root_is_per_user_shared_memory() -> None:
    from gshare.runtime.node.model_store import DEFAULT_ROOT

    assert DEFAULT_ROOT == "/dev/shm/gshare-<uid>"
    if os.path.isdir("/dev/shm"):
        path = Path(f"/dev/shm/gshare-{os.getuid()}")
        existed = path.exists()
        assert ModelStore().root == path
        if not existed:  # leave no trace of the test
            path.rmdir()


def _child(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_weights_are_mapped_read_only(root: str) -> None:
    store = ModelStore(root)
    store.put("m", {"w": torch.ones(1024)})
    p = _child(f"""
        from gshare.runtime.node.model_store import ModelStore
        w = ModelStore({root!r}).get("m")["w"]
        print(float(w.sum()), flush=True)
        w.add_(1.0)  # an in-place write to a shared weight
        print("wrote", flush=True)
    """)
    out, _ = p.communicate(timeout=120)
    assert out.splitlines()[0] == "1024.0"
    assert "wrote" not in out and p.returncode == -signal.SIGSEGV
    assert torch.equal(store.get("m")["w"], torch.ones(1024))  # nobody else was affected


def _mapping_pss(pid: int, path: str) -> int:
    return sum(m.pss for m in psutil.Process(pid).memory_maps(grouped=True) if m.path == path)


def test_second_process_shares_the_pages_instead_of_adding_a_copy(root: str) -> None:
    size = 128 * MB
    store = ModelStore(root)
    store.put("big", {"w": torch.ones(size // 4)})
    path = str(store.path("big"))
    code = f"""
        import sys
        from gshare.runtime.node.model_store import ModelStore
        w = ModelStore({root!r}).get("big")["w"]
        print(float(w.sum()), flush=True)  # touches every page
        sys.stdin.read()
    """
    procs: list[subprocess.Popen[str]] = []
    try:
        a = _child(code)
        procs.append(a)
        assert a.stdout is not None and float(a.stdout.readline()) == size // 4
        alone_map = _mapping_pss(a.pid, path)
        alone_total = psutil.Process(a.pid).memory_full_info().pss
        b = _child(code)
        procs.append(b)
        assert b.stdout is not None and float(b.stdout.readline()) == size // 4
        map_a, map_b = _mapping_pss(a.pid, path), _mapping_pss(b.pid, path)
        total_a = psutil.Process(a.pid).memory_full_info().pss
        total_b = psutil.Process(b.pid).memory_full_info().pss
    finally:
        for p in procs:
            p.communicate(timeout=60)
    # Alone, A is charged the whole copy; together each is charged about half of it.
    assert alone_map >= 0.95 * size
    assert map_a <= 0.55 * size and map_b <= 0.55 * size
    assert 0.9 * size <= map_a + map_b <= 1.1 * size
    # The joint footprint grew by B's interpreter, not by a second copy: B's arrival cost
    # less than A alone (whose PSS held the whole copy) minus 40 % of the weights.
    grew = total_a + total_b - alone_total
    assert grew <= alone_total - 0.4 * size, (grew / MB, alone_total / MB)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA device")
def test_cuda_ipc_export_and_open_in_another_process(root: str) -> None:
    store = ModelStore(root)
    w = torch.randn(256, 256)
    state = {"w": w, "w_t": w, "b": torch.arange(7)}  # w_t: an alias (tied weights)
    store.put("m", state)
    store.export_cuda("m", "cuda:0")
    mine = store.get("m", device="cuda:0")  # the exporter gets its own tensors
    assert mine["w"].is_cuda and torch.equal(mine["w"].cpu(), state["w"])
    assert store.has_cuda("m", "cuda:0")
    p = _child(f"""
        import torch
        from gshare.runtime.node.model_store import ModelStore
        w = ModelStore({root!r}).get("m", device="cuda:0")
        assert w["w"].is_cuda and w["w"].data_ptr() == w["w_t"].data_ptr()
        print(float(w["w"].double().sum()), int(w["b"].sum()), flush=True)
    """)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    s, b = out.split()
    assert float(s) == pytest.approx(float(state["w"].double().sum()), rel=1e-6)
    assert int(b) == 21
    store.drop("m")
