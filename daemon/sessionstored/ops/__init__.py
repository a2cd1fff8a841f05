# Request -> Step (steps.py). Every op is declared once, in the module of its
# concern (sessions, checkpoints, rank, leases, admin, backup), with its handler, the
# arguments it reads and whether a read-only peer may use it; dispatch() (dispatch.py)
# looks it up, checks access, and turns a refusal into its error reply. What the
# handlers share is OpContext (context.py).
from .context import OpContext
from .dispatch import ARGUMENTS, DOCUMENTS, PREPARERS, REGISTRY, dispatch

__all__ = ["ARGUMENTS", "DOCUMENTS", "PREPARERS", "REGISTRY", "OpContext", "dispatch"]
