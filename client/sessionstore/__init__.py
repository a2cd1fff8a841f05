from .asyncio_client import AsyncioClient
from .client import Client
from .errors import (
    BadRequest,
    Conflict,
    InvalidSnapshot,
    IOFailure,
    NoSpace,
    NotFound,
    SessionStoreError,
    TooLarge,
)
from .wire.canonical import snapshot_digest

__version__ = "0.1.0"

__all__ = [
    "AsyncioClient",
    "BadRequest",
    "Client",
    "Conflict",
    "IOFailure",
    "InvalidSnapshot",
    "NoSpace",
    "NotFound",
    "SessionStoreError",
    "TooLarge",
    "snapshot_digest",
]
