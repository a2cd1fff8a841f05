# The OpenAI Agents SDK's session on sessionstore (pip install 'sessionstore[agents]').
# The adapter itself is adapters/agents.py.
from .adapters.agents import SessionStoreSession

__all__ = ["SessionStoreSession"]
