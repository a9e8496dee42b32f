"""A handler whose ``predict`` hangs cannot hold its instance: past ``predict_timeout_s`` the
request fails with a 504 naming the limit, the instance is restarted, and the function serves
again (a real ``gshare serve``; the spec's bounds are one-line errors)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gshare.spec import SpecError, parse_function_spec
from gshare.testing import ServeProcess, wait_until

SPIN = {
    "name": "hangs",
    "handler": "gshare.runtime.demo_handlers:Spin",
    "device": "cpu",
    "batching": {"max_batch": 1, "max_wait_ms": 0},
    "min_instances": 1,
    "max_instances": 1,
    "predict_timeout_s": 1.0,
}


def test_a_hung_predict_fails_its_request_and_the_instance_is_restarted(
    start_gshare: Callable[..., ServeProcess],
) -> None:
    srv = start_gshare()
    c = srv.client()
    c.deploy(SPIN)
    wait_until(lambda: c.get("hangs")["availableReplicas"] >= 1, 120, "hangs to be ready")
    r = httpx.post(srv.url + "/function/hangs", json={"spin_ms": 600_000}, timeout=60)
    assert r.status_code == 504, r.text
    assert "ran past its predict_timeout_s of 1 s" in r.json()["error"]
    # the agent restarted the instance, which serves again
    wait_until(
        lambda: any(i["restarts"] >= 1 for i in c.get("hangs")["instances"]),
        60,
        "the hung instance to be restarted",
    )
    wait_until(lambda: c.get("hangs")["availableReplicas"] >= 1, 120, "hangs to be ready again")
    assert c.invoke("hangs", {"spin_ms": 1})["spun_ms"] == 1
    assert any("predict_timeout_s" in line for line in c.logs("hangs"))


@pytest.mark.parametrize("value", [0, -1, 1e9, "soon"])
def test_predict_timeout_bounds_are_one_line(value: object) -> None:
    with pytest.raises(SpecError, match="predict_timeout_s: must be a number in"):
        parse_function_spec({**SPIN, "predict_timeout_s": value})
