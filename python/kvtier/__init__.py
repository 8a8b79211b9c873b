"""kvtier: keep the whole KV cache, not just what fits in HBM.

The binding of kvtier's C++ libraries: the worker runtime (``Runtime``, ``TieredSequence``: append
a layer's K/V, attend with cumulative scores, re-tier, report) and the client of ``kvtierd``
(``Client``). ``kvtier.hf`` adds a Hugging Face transformers cache that places KV by attention.
"""

# In a build tree the native module sits in build/python/kvtier/ and these sources in
# python/kvtier/: one package over both directories when both are on sys.path.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from kvtier._native import (  # noqa: E402
    BlockStore,
    Client,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    Runtime,
    TieredSequence,
    UnavailableError,
)

from kvtier._socket import DEFAULT_SOCKET, SOCKET_ENV, daemon_from_env  # noqa: E402

__version__ = "0.1.0"

# Tier numbers, as in TieredSequence.tiers() and the report's tokens_by_tier.
T0, T1, T2, T3 = 0, 1, 2, 3

__all__ = [
    "BlockStore",
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "daemon_from_env",
    "Client",
    "Error",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "Runtime",
    "TieredSequence",
    "UnavailableError",
    "T0",
    "T1",
    "T2",
    "T3",
]
