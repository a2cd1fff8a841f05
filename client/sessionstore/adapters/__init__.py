# The framework adapters: LangGraph's checkpointer and the OpenAI Agents SDK's
# session, each imported only by the public module of its name
# (sessionstore.langgraph, sessionstore.agents).
