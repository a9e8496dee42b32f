"""Workload generators and trace loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gshare.profiles import ProfilePoint, ProfileTable
from gshare.resources import GpuShare
from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.gpu import SimGpu
from gshare.sim.instance import InstanceConfig, SimInstance
from gshare.sim.workload import (
    azure2019_minutes,
    azure2021,
    azure_llm,
    bursty,
    drive_closed_loop,
    drive_open_loop,
    piecewise_poisson,
    poisson,
    scale_to_rate,
    uniform,
)


def test_poisson_mean_rate_for_a_fixed_seed() -> None:
    # 200 req/s for 60 s: 12,000 expected, std sqrt(12000) ~ 110; 3 % (360) is > 3 sigma.
    t = poisson(200.0, 60_000.0, np.random.default_rng(1))
    assert len(t) == pytest.approx(12_000, rel=0.03)
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 0 and t[-1] < 60_000.0
    # exponential gaps: mean 5 ms and coefficient of variation ~1
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(5.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert np.array_equal(t, poisson(200.0, 60_000.0, np.random.default_rng(1)))


def test_poisson_with_start_offset_and_zero_rate() -> None:
    t = poisson(50.0, 1000.0, np.random.default_rng(2), start_ms=500.0)
    assert t.min() >= 500.0 and t.max() < 1500.0
    assert len(poisson(0.0, 1000.0, np.random.default_rng(2))) == 0


def test_uniform_spacing() -> None:
    # 50 req/s: one every 20 ms, first at 20, last at 1000 -> 50 arrivals in 1 s.
    t = uniform(50.0, 1000.0)
    assert len(t) == 50
    assert t[0] == pytest.approx(20.0) and t[-1] == pytest.approx(1000.0)
    assert np.allclose(np.diff(t), 20.0)


def test_piecewise_poisson_follows_each_segment_rate() -> None:
    # 10 s at 100 req/s then 10 s at 400 req/s: ~1000 then ~4000 arrivals (5 % is > 3 sigma).
    t = piecewise_poisson([(10_000.0, 100.0), (10_000.0, 400.0)], np.random.default_rng(4))
    first, second = np.sum(t < 10_000.0), np.sum(t >= 10_000.0)
    assert first == pytest.approx(1000, rel=0.1)
    assert second == pytest.approx(4000, rel=0.05)


def test_bursty_keeps_its_long_run_mean() -> None:
    t = bursty(100.0, 600_000.0, np.random.default_rng(5))
    assert len(t) / 600.0 == pytest.approx(100.0, rel=0.1)
    # bursty: per-second counts vary much more than Poisson's (variance/mean >> 1)
    counts = np.bincount((t // 1000).astype(int))
    assert counts.var() / counts.mean() > 5.0


def test_azure2021_trace_loads_the_shipped_sample() -> None:
    t = azure2021()
    assert len(t) == 199  # NOTICE: 199 real invocations
    assert t[0] == 0.0
    assert np.all(np.diff(t) >= 0)


def test_azure_llm_trace_loads_the_shipped_sample() -> None:
    t = azure_llm()
    # The shipped CSV has a header and 8,819 data rows (its last line has no newline, so
    # `wc -l` says 8,819 lines; NOTICE says 8,818).
    assert len(t) == 8_819
    assert t[0] == 0.0
    assert np.all(np.diff(t) >= 0)
    # the first two stamps are 18:17:03.97996 and 18:17:04.03196: 52 ms apart
    assert t[1] == pytest.approx(52.0, abs=1e-3)


def test_scale_to_rate_keeps_the_shape() -> None:
    t = azure2021()
    s = scale_to_rate(t, 50.0)
    # mean rate = n / span: 199 arrivals over 199 / 50 = 3.98 s
    assert s[-1] == pytest.approx(199 / 50.0 * 1000.0)
    assert len(s) / (s[-1] / 1000.0) == pytest.approx(50.0)
    # gaps are scaled by one factor
    ratio = s[-1] / t[-1]
    assert np.allclose(np.diff(s), np.diff(t) * ratio)
    assert np.array_equal(scale_to_rate(np.array([5.0]), 10.0), np.array([5.0]))


def test_azure2019_minutes_spreads_counts_within_each_minute(tmp_path: Path) -> None:
    p = tmp_path / "inv.csv"
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(i) for i in range(1, 4))
    p.write_text(header + "\no,a,f,http,3,0,2\no,a,g,http,1,1,1\n")
    t = azure2019_minutes(p, np.random.default_rng(0), row=0)
    assert len(t) == 5
    assert np.sum(t < 60_000) == 3 and np.sum(t >= 120_000) == 2
    with pytest.raises(ValueError, match="no row 5"):
        azure2019_minutes(p, np.random.default_rng(0), row=5)


def _instance(loop: EventLoop, gw: Gateway, cold_start_ms: float = 0.0) -> SimInstance:
    # model "m": 10 ms per request (batch 1) at any SM share
    table = ProfileTable(ProfilePoint("m", sm, 100.0, 1, 10.0) for sm in (10.0, 100.0))
    cfg = InstanceConfig("f", "m", GpuShare(100.0, 1.0, 1.0), cold_start_ms=cold_start_ms)
    inst = SimInstance(loop, SimGpu(loop), "i0", cfg, table, np.random.default_rng(0), gw.completed)
    gw.add_instance(inst)
    return inst


def test_drive_open_loop_submits_at_each_time() -> None:
    loop = EventLoop()
    gw = Gateway(loop)
    gw.register("f")
    inst = _instance(loop, gw, cold_start_ms=1e6)  # still starting: requests stay queued
    drive_open_loop(loop, gw, "f", [1.0, 2.5, 2.5, 9.0])
    loop.run(until_ms=100.0)
    assert [r.arrival_ms for r in inst.queue] == [1.0, 2.5, 2.5, 9.0]


def test_drive_closed_loop_keeps_users_outstanding() -> None:
    # 3 users, zero think time, one instance serving one request per 10 ms: 3 requests are
    # always outstanding and completions fall at 10, 20, ..., 1000 ms (100 by 1 s). Each one
    # strictly before until_ms = 1000 is resubmitted (99), so 3 + 99 = 102 are submitted in all
    # and the last 2 drain after 1 s.
    loop = EventLoop()
    gw = Gateway(loop)
    gw.register("f")
    inst = _instance(loop, gw)
    outstanding: list[int] = []
    for t in range(5, 1000, 50):
        loop.at(float(t), lambda: outstanding.append(inst.outstanding))
    drive_closed_loop(loop, gw, "f", users=3, until_ms=1000.0)
    loop.run(until_ms=1000.0)
    assert outstanding == [3] * len(outstanding)
    assert len(gw.log.completed) == 100
    loop.run()
    assert gw.log.submitted == len(gw.log.completed) == 102


def test_azure2019_functions_busiest_first_on_one_clock(tmp_path: Path) -> None:
    import gzip

    from gshare.sim.workload import azure2019_functions, scale_streams_to_rate

    p = tmp_path / "inv.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("HashFunction,HashApp,HashOwner,minute_1,minute_2,minute_3\n")
        f.write("aaaa1111,x,y,1,2,3\n")  # 5 in minutes 2..3
        f.write("bbbb2222,x,y,9,0,9\n")  # 9
        f.write("cccc3333,x,y,0,0,0\n")
    s = azure2019_functions(np.random.default_rng(0), start_minute=1, minutes=2, top=5, path=p)
    assert list(s) == ["f00-bbbb2222", "f01-aaaa1111"]  # the idle one is left out
    assert len(s["f00-bbbb2222"]) == 9 and len(s["f01-aaaa1111"]) == 5
    assert all((t >= 0).all() and (t < 120_000).all() for t in s.values())
    assert (s["f01-aaaa1111"][:2] < 60_000).all() and (s["f01-aaaa1111"][2:] >= 60_000).all()
    # 14 arrivals over 2 minutes scaled to 1 rps: 14 s, one factor for both
    scaled = scale_streams_to_rate(s, 1.0, 120_000.0)
    factor = 14_000.0 / 120_000.0
    for k in s:
        assert np.allclose(scaled[k], s[k] * factor)
