"""The status page (``/ui``) in a real headless browser against a real server.

Debian's Chromium and its chromedriver, driven by Selenium (``make test`` installs both when
they are missing). Two functions share the one device; the page must ask for the token, refuse
a wrong one with a message (not a stack trace), then draw one rectangle per instance inside the
device's square and list each function with its latency against its SLO. With
``GSHARE_SCREENSHOT=PATH`` the test also saves a screenshot (the README's).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gshare.testing import ServeProcess, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (make test installs them as root)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1100,900",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


UI_FLOW = b"""
name: ui-flow
slo_ms: 500
stages:
  - {name: first, function: ui-small}
  - {name: then, function: ui-large, after: [first]}
"""


def _deploy_two(served: ServeProcess) -> None:
    c = served.client()
    for name, sm, quota, slo in (("ui-small", 40, 0.3, 50), ("ui-large", 60, 0.5, 200)):
        c.deploy(
            {
                "name": name,
                "handler": "gshare.runtime.demo_handlers:Spin",
                "device": "cpu",
                "resources": {"sm_pct": sm, "quota_request": quota, "quota_limit": 1.0},
                "slo_ms": slo,
                "min_instances": 1,
                "max_instances": 1,
            }
        )
    for name in ("ui-small", "ui-large"):
        wait_until(lambda n=name: c.get(n)["available_replicas"] == 1, 120, f"{name} ready")
        for _ in range(5):
            c.invoke(name, {"spin_ms": 2})


def _load(served: ServeProcess, seconds: float) -> None:
    """Closed-loop requests to both functions for ``seconds`` (4 clients each)."""
    import threading
    import time

    stop = time.monotonic() + seconds

    def client(name: str) -> None:
        with httpx.Client(base_url=served.url, timeout=60) as h:
            while time.monotonic() < stop:
                h.post(f"/function/{name}", json={"spin_ms": 8})

    threads = [
        threading.Thread(target=client, args=(n,))
        for n in ("ui-small", "ui-large")
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_status_page_login_and_live_view(served: ServeProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _deploy_two(served)
    wait = WebDriverWait(browser, 30)
    # no token: the login prompt, nothing else
    browser.get(served.url + "/ui")
    wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
    assert not browser.find_element(By.ID, "status").is_displayed()
    # a wrong token is refused with a message
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    wait.until(lambda d: "refused" in d.find_element(By.ID, "login-error").text)
    assert "Traceback" not in browser.page_source
    time.sleep(2.5)  # the page polls every second: the refusal must stay to be read
    assert "refused" in browser.find_element(By.ID, "login-error").text
    # the real token: the live view
    box = browser.find_element(By.ID, "token")
    box.clear()
    box.send_keys(served.token)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "rect.share")) == 2)
    # read the rectangles in one script: the page re-renders as it polls, and an element found
    # by one call can be gone by the next (a stale reference)
    drawn = browser.execute_script(
        "return [...document.querySelectorAll('rect.share')].map(r => [r.dataset.function,"
        " ...['x', 'y', 'width', 'height'].map(k => parseFloat(r.getAttribute(k)))])"
    )
    assert sorted(d[0] for d in drawn) == ["ui-large", "ui-small"]
    # both rectangles lie in the device's square and do not overlap (the placer's invariant,
    # as drawn): compare their boxes in the SVG's coordinates
    boxes = [tuple(d[1:]) for d in drawn]
    for x, y, w, h in boxes:
        assert x >= 0 and y >= 0 and x + w <= 220.01 and y + h <= 220.01
    (ax, ay, aw, ah), (bx, by, bw, bh) = boxes
    assert (
        ax + aw <= bx + 0.01 or bx + bw <= ax + 0.01 or ay + ah <= by + 0.01 or by + bh <= ay + 0.01
    )
    # the function rows: latency against the SLO, one instance each, live-updated
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "div.function")) == 2)
    text = browser.execute_script("return document.getElementById('functions').innerText")
    assert "ui-small" in text and "SLO 50 ms" in text and "SLO 200 ms" in text
    p50 = browser.execute_script(
        "return document.querySelector('div.function[data-function=\"ui-small\"] .p50').textContent"
    )
    assert p50 != "—" and float(p50) > 0
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.instance")) == 2
    # the page polls: a third function appears without a reload
    served.client().deploy(
        {
            "name": "ui-third",
            "handler": "gshare.runtime.demo_handlers:Echo",
            "device": "cpu",
            "resources": {"sm_pct": 20, "quota_request": 0.1},
        }
    )
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "div.function")) == 3)
    served.client().delete("ui-third")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "div.function")) == 2)
    # workflows are shown with their stages, SLO hits and latency
    c = served.client()
    c.deploy_workflow(UI_FLOW)
    for _ in range(3):
        c.invoke_workflow("ui-flow", {"spin_ms": 1})
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "div.workflow")) == 1)
    wait.until(lambda d: "3 requests" in d.find_element(By.ID, "workflows").text)
    text = browser.find_element(By.ID, "workflows").text
    assert "ui-flow" in text and "SLO 500 ms" in text and "first → then (ui-large)" in text
    c.delete_workflow("ui-flow")
    # a token in the address signs in, and leaves the address
    browser.execute_script("sessionStorage.clear()")
    wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
    browser.get(served.url + "/ui#token=" + served.token)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "rect.share")) == 2)
    assert "token" not in browser.current_url
    shot = os.environ.get("GSHARE_SCREENSHOT")
    if shot:  # the README's picture: both functions under load, achieved shares showing
        _load(served, seconds=6.0)
        browser.save_screenshot(shot)
    # the JSON behind it is token-protected like the rest of /system
    assert httpx.get(served.url + "/system/status").status_code == 401
    for name in ("ui-small", "ui-large"):
        served.client().delete(name)
