# The OpenAI Agents SDK's session on sessionstore (pip install 'sessionstore[agents]').
# The adapters themselves are adapters/agents.py and adapters/agents_advanced.py.
from .adapters.agents import SessionStoreSession
from .adapters.agents_advanced import AdvancedSessionStoreSession

__all__ = ["AdvancedSessionStoreSession", "SessionStoreSession"]
