"""How an instance answers a request that fails: the (status, encoding, message) of each error.

Who calls it: the batching thread of ``instance.server.InstanceServer`` — ``input_error`` when a
request's payload cannot be decoded, ``encode_error`` when a handler's output cannot be encoded,
and ``function_error`` (inside the ``except`` block, through ``instance.gate.DeviceGate.failure``)
when ``handler.predict`` raised.

What must hold: a request the caller got wrong is a bad request (``ST_BAD_INPUT``, a 4xx at the
gateway), a fault of the function a function error (``ST_FUNCTION_ERROR``, a 5xx); messages name
the error but never carry a traceback (that goes to the instance's log file).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from gshare.runtime.instance import protocol as P

log = logging.getLogger("gshare.runtime.instance.server")
"""The instance server's logger (its parts log under the server's name)."""


def input_error(e: Exception) -> str:
    """The message of a request whose payload cannot be decoded."""
    from gshare.runtime.oip.header import OipError  # lazy: numpy, for OIP requests only

    if isinstance(e, OipError):
        return str(e)
    if isinstance(e, json.JSONDecodeError):
        return f"malformed JSON body: {e}"
    return f"the function cannot decode the input: {type(e).__name__}: {e}"


def encode_error(e: Exception) -> tuple[int, int, bytes]:
    """The (status, encoding, message) of an output that cannot be encoded: a bad request when
    the request asked for what the handler did not give (``OipError``), else a 5xx."""
    from gshare.runtime.oip.header import OipError  # lazy: numpy, for OIP requests only

    if isinstance(e, OipError):
        return P.ST_BAD_INPUT, P.ENC_RAW, str(e).encode()
    return P.ST_FUNCTION_ERROR, P.ENC_RAW, f"cannot encode the output: {e}".encode()


def function_error() -> tuple[int, int, bytes]:
    """The (status, encoding, message) of the exception being handled: input-like errors
    (ValueError, TypeError, KeyError, IndexError) are the caller's fault (4xx), others 5xx."""
    exc = sys.exc_info()[1]
    assert exc is not None
    # the traceback goes to the instance's log file (``i-ID.log`` in the server's run
    # directory), not to the caller: source locations are not the caller's business
    log.warning(
        "the function raised:\n%s",
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ValueError | TypeError | KeyError | IndexError):
        return P.ST_BAD_INPUT, P.ENC_RAW, f"the function rejected the input: {text}".encode()
    return P.ST_FUNCTION_ERROR, P.ENC_RAW, f"the function raised {text}".encode()


__all__ = ["encode_error", "function_error", "input_error"]
