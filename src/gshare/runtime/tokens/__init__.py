"""Time tokens between instances and their device's token server, over a Unix socket:
``protocol`` (the wire format and its rules), ``server`` (in the node agent), ``client`` (in
every instance process), and ``board`` (the device's shared-memory board for FIKIT's priority
classes). The decisions are in ``policy.tokens`` and ``policy.priority``."""

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
