# Deprecated: the trio client's old place and name. Use sessionstore.TrioClient.
from __future__ import annotations

import warnings

from .trio_client import TrioClient

warnings.warn(
    "sessionstore.aclient.AsyncClient is deprecated; use sessionstore.TrioClient "
    "(sessionstore.AsyncClient is the asyncio client)",
    DeprecationWarning,
    stacklevel=2,
)

AsyncClient = TrioClient

__all__ = ["AsyncClient"]
