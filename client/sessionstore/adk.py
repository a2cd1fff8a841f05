# Google ADK's session service on sessionstore (pip install 'sessionstore[adk]').
# The adapter itself is adapters/adk.py.
from .adapters.adk import SessionStoreSessionService

__all__ = ["SessionStoreSessionService"]
