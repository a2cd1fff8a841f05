# LangGraph on sessionstore (pip install 'sessionstore[langgraph]'): the
# checkpointer SessionStoreSaver, the long-term memory store SessionStoreStore,
# and the errors they raise beside the clients'. The adapters themselves are
# adapters/langgraph.py and adapters/langgraph_store.py.
from .adapters.langgraph import SessionStoreSaver
from .adapters.langgraph_saver_core import CorruptCheckpoint, DeletedCheckpoint
from .adapters.langgraph_store import SessionStoreStore

__all__ = ["CorruptCheckpoint", "DeletedCheckpoint", "SessionStoreSaver", "SessionStoreStore"]
