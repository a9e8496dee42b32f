"""Time tokens between instances and their device's token server, over a Unix socket."""

from gshare.runtime.tokens.uds import (
    LIVE_TOKEN_CONFIG,
    PROTOCOL_VERSION,
    TokenClient,
    TokenRecord,
    TokenRuntimeError,
    TokenServer,
    UnknownClientError,
)

__all__ = [
    "LIVE_TOKEN_CONFIG",
    "PROTOCOL_VERSION",
    "TokenClient",
    "TokenRecord",
    "TokenRuntimeError",
    "TokenServer",
    "UnknownClientError",
]
