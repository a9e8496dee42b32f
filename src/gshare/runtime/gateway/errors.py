"""Errors of the gateway and the control API: one ``HttpError`` answered as
``{"error": message}``, and the HTTP code of each instance status."""

from __future__ import annotations

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
