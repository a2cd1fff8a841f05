# The keys of SessionStoreSaver's documents (langgraph.py draws the layout), each
# user-chosen part encoded by keyparts.key_part.
from __future__ import annotations

from .keyparts import key_part


class SaverKeys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def thread_checkpoints(self, thread: str) -> str:
        return f"{self.prefix}c/{key_part(thread)}/"

    def namespace_checkpoints(self, thread: str, ns: str) -> str:
        return f"{self.thread_checkpoints(thread)}{key_part(ns)}/"

    def checkpoint(self, thread: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.namespace_checkpoints(thread, ns)}{key_part(checkpoint_id)}"

    def thread_writes(self, thread: str) -> str:
        return f"{self.prefix}w/{key_part(thread)}/"

    def checkpoint_writes(self, thread: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.thread_writes(thread)}{key_part(ns)}/{key_part(checkpoint_id)}/"

    def write(self, thread: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
        return f"{self.checkpoint_writes(thread, ns, checkpoint_id)}{key_part(task_id)}/{idx}"

    def run_checkpoints(self, run_id: str) -> str:
        return f"{self.prefix}r/{key_part(run_id)}/"

    def run_marker(self, run_id: str, thread: str, ns: str, checkpoint_id: str) -> str:
        where = f"{key_part(thread)}/{key_part(ns)}/{key_part(checkpoint_id)}"
        return f"{self.run_checkpoints(run_id)}{where}"

    def thread_runs(self, thread: str) -> str:
        return f"{self.prefix}t/{key_part(thread)}/"

    def thread_run(self, thread: str, run_id: str) -> str:
        return f"{self.thread_runs(thread)}{key_part(run_id)}"

    def effects(self, thread: str) -> str:
        """The thread's tool effects (sessionstore.effects), by key."""
        return f"{self.prefix}e/{key_part(thread)}/"

    def lifetime(self, thread: str) -> str:
        """{"horizon": ms}: with a ttl, the thread lives while this does (lifetime.py)."""
        return f"{self.prefix}l/{key_part(thread)}"

    # tombstones: what was deleted, so that a checkpoint built on it is refused while
    # one whose parent was never stored is taken, as every LangGraph saver takes it
    def owner(self, thread: str) -> str:
        """The thread's owner document (ownership.py), with a saver made with owner=."""
        return self.owner_of_part(key_part(thread))

    def owner_of_part(self, thread_part: str) -> str:
        """owner(), of the thread as its keys hold it (key_part)."""
        return f"{self.prefix}o/{thread_part}"

    def thread_deleted(self, thread: str) -> str:
        """{"upto": id}: delete_thread removed every checkpoint up to that id."""
        return f"{self.prefix}d/{key_part(thread)}"

    def namespace_pruned(self, thread: str, ns: str) -> str:
        """{"upto": id}: prune removed every checkpoint of the namespace up to that id."""
        return f"{self.prefix}d/{key_part(thread)}/{key_part(ns)}"

    def checkpoint_deleted(self, thread: str, ns: str, checkpoint_id: str) -> str:
        """delete_for_runs removed this one."""
        return f"{self.prefix}x/{key_part(thread)}/{key_part(ns)}/{key_part(checkpoint_id)}"
