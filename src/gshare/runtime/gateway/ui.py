"""The status page: ``GET /ui`` (a static page, no build step) and the JSON it polls,
``GET /system/status`` (bearer token, like the rest of ``/system``).

Who calls it: ``app.build_fastapi`` mounts both with ``mount_status_page``. The page asks for
the token (kept in the browser tab's ``sessionStorage``; ``/ui#token=TOKEN`` gives it in the
address, which the page then clears) and shows a login prompt when there is none or the server
refuses it (the refusal stays on screen: the page does not poll without a token); it then
redraws every second: per device the placed shares as rectangles in the quota × SM square
(FaST-GShare Fig. 6), per function its instances with the requested and achieved share,
p50/p99 against the SLO and the request rate, per workflow its stages, SLO hits and p50/p99.
The document is ``runtime.control.status.status_view``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from gshare.runtime.gateway.errors import HttpError


@cache
def status_page_html() -> str:
    """The page (``static/status.html``, shipped as package data)."""
    return (resources.files("gshare.runtime.gateway") / "static" / "status.html").read_text()


def mount_status_page(
    app: FastAPI,
    view: Callable[[], dict[str, object]] | None,
    require_token: Callable[[Request], None],
) -> None:
    """Add ``/ui`` and ``/system/status`` to ``app`` (``view`` None: status is 503)."""

    @app.get("/ui", response_class=HTMLResponse)
    async def ui() -> HTMLResponse:
        return HTMLResponse(status_page_html(), headers={"Cache-Control": "no-cache"})

    @app.get("/system/status")
    async def status(request: Request) -> dict[str, object]:
        require_token(request)
        if view is None:
            raise HttpError(503, "this server has no status view")
        return view()


__all__ = ["mount_status_page", "status_page_html"]
