"""Time tokens between instances and their device's token server, over a Unix socket:
``protocol`` (the wire format and its rules), ``server`` (in the node agent), ``client`` (in
every instance process). The decisions are in ``policy.tokens``."""

from gshare.policy.tokens import LIVE_TOKEN_CONFIG
from gshare.runtime.tokens.client import MemoryChannel, TokenClient
from gshare.runtime.tokens.protocol import (
    PROTOCOL_VERSION,
    TokenRuntimeError,
    UnknownClientError,
)
from gshare.runtime.tokens.server import TokenRecord, TokenServer

__all__ = [
    "LIVE_TOKEN_CONFIG",
    "MemoryChannel",
    "PROTOCOL_VERSION",
    "TokenClient",
    "TokenRecord",
    "TokenRuntimeError",
    "TokenServer",
    "UnknownClientError",
]
