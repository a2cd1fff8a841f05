# The public names. Three clients with the same op methods: Client (blocking),
# AsyncClient (asyncio) and TrioClient (trio); every error the clients raise; and
# snapshot_digest, the digest the daemon gives a snapshot.
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from . import build as build  # first: which build of this package's compiled modules is imported

# isort: split
from .asyncio_client import AsyncClient
from .client import Client
from .errors import (
    BadRequest,
    Compacted,
    Conflict,
    ConnectionLost,
    Fenced,
    InputError,
    InternalError,
    InvalidSnapshot,
    IOFailure,
    NoDaemon,
    NoSpace,
    NotFound,
    Overloaded,
    PreconditionFailed,
    ReadOnly,
    RetryLater,
    SessionStoreError,
    ShuttingDown,
    StaleOwner,
    Timeout,
    TooLarge,
    Unauthorized,
    UnknownOp,
    UnresolvedEffect,
    UnsafeSocketDirectory,
)
from .version import __version__
from .wire.canonical import snapshot_digest

if TYPE_CHECKING:
    from .trio_client import TrioClient

_DEPRECATED = {"AsyncioClient": ("AsyncClient", AsyncClient)}


def __getattr__(name: str) -> Any:
    if name == "TrioClient":  # imported at first use: trio loads only for trio's users
        from .trio_client import TrioClient

        return TrioClient
    if name in _DEPRECATED:
        new_name, value = _DEPRECATED[name]
        warnings.warn(
            f"sessionstore.{name} is deprecated; use sessionstore.{new_name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    raise AttributeError(f"module 'sessionstore' has no attribute {name!r}")


__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Compacted",
    "Conflict",
    "ConnectionLost",
    "Fenced",
    "IOFailure",
    "InputError",
    "InternalError",
    "InvalidSnapshot",
    "NoDaemon",
    "NoSpace",
    "NotFound",
    "Overloaded",
    "PreconditionFailed",
    "ReadOnly",
    "RetryLater",
    "SessionStoreError",
    "ShuttingDown",
    "StaleOwner",
    "Timeout",
    "TooLarge",
    "TrioClient",
    "Unauthorized",
    "UnknownOp",
    "UnresolvedEffect",
    "UnsafeSocketDirectory",
    "__version__",
    "snapshot_digest",
]
