# AWS Strands Agents on sessionstore (pip install 'sessionstore[strands]').
# The adapters themselves are adapters/strands.py.
from .adapters.strands import (
    SessionStoreSessionManager,
    SessionStoreSessionRepository,
    SessionStoreStorage,
)

__all__ = ["SessionStoreSessionManager", "SessionStoreSessionRepository", "SessionStoreStorage"]
