# LangGraph's checkpointer on sessionstore (pip install 'sessionstore[langgraph]'):
# SessionStoreSaver, and the errors it raises beside the clients'. The adapter
# itself is adapters/langgraph.py.
from .adapters.langgraph import CorruptCheckpoint, DeletedCheckpoint, SessionStoreSaver

__all__ = ["CorruptCheckpoint", "DeletedCheckpoint", "SessionStoreSaver"]
