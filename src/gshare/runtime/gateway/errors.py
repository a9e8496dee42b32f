"""Errors of the gateway and the control API: one ``HttpError`` answered as
``{"error": message}``, and the HTTP code of each instance status."""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse

from gshare.runtime.instance import protocol as P


class HttpError(Exception):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(
        self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        """Extra response headers (a shed request's ``Retry-After``)."""
        self.recorded = False
        """Set once the request was counted in the metrics."""


RETRY_AFTER_MS_HEADER = "x-gshare-retry-after-ms"
"""On a shed request (429): when the backlog ahead of it should have drained, ms (the standard
``Retry-After`` says the same in whole seconds, at least 1)."""


def overloaded(message: str, wait_ms: float) -> HttpError:
    """The 429 of a request shed at arrival (``policy.admission``: ``Gateway.submit`` for a
    latency SLO, ``streams`` for a TTFT SLO), with ``Retry-After`` after ``wait_ms``."""
    return HttpError(
        429,
        message,
        (
            ("retry-after", str(max(1, math.ceil(wait_ms / 1000.0)))),
            (RETRY_AFTER_MS_HEADER, f"{wait_ms:.0f}"),
        ),
    )


def error_response(
    status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers))


def status_of(status: int) -> int:
    """HTTP code of an instance status."""
    return {
        P.ST_OK: 200,
        P.ST_BAD_INPUT: 400,
        P.ST_FUNCTION_ERROR: 500,
        P.ST_MEMORY_LIMIT: 503,
        P.ST_TIMEOUT: 504,
        P.ST_INTERNAL: 500,
    }.get(status, 502)


__all__ = ["HttpError", "error_response", "status_of"]
