# What a connection hands the writer: a mutation to commit in a batch, or an
# exclusive job (verify, compact) that runs with no batch in flight. Either is
# finished exactly once, by the writer or by fail(); on_done is called then (the
# connection's outbox sends the reply from there), and whoever waits for it with
# wait() is woken. Most jobs are never waited for (the outbox is called back), so
# the event to wait on is made only when someone waits.
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from ..storage.mutations import Mutation, Outcome, Txn


class Job:
    def __init__(self) -> None:
        self.finished = False
        self._waiting: trio.Event | None = None
        self.failure: Refusal | None = None  # set when the job never ran
        self.on_done: Callable[[Job], None] | None = None  # called once it is finished

    def _settle(self) -> None:
        self.finished = True
        if self._waiting is not None:
            self._waiting.set()
        if self.on_done is not None:
            self.on_done(self)

    async def wait(self) -> None:
        """Until the job is finished."""
        if self.finished:
            await trio.lowlevel.checkpoint()
            return
        if self._waiting is None:
            self._waiting = trio.Event()
        await self._waiting.wait()

    def size(self) -> int:
        """Bytes it adds to a batch."""
        return 0

    def fail(self, code: ErrorCode, message: str) -> None:
        """Finish a job that will not run (a failed store, a stopping daemon)."""
        self.failure = Refusal(code, message)
        self._settle()


class MutationJob(Job):
    def __init__(self, mutation: Mutation) -> None:
        super().__init__()
        self.mutation = mutation
        self._outcome: Outcome | None = None

    @property
    def outcome(self) -> Outcome | None:
        """What the writer decided, or the failure of a job that never ran."""
        if self._outcome is None and self.failure is not None:
            return Outcome(refused=self.failure)
        return self._outcome

    def size(self) -> int:
        if isinstance(self.mutation, Txn):
            return self.mutation.body_bytes
        body = getattr(self.mutation, "body", b"")
        return len(body) if isinstance(body, bytes) else 0

    def finish(self, outcome: Outcome) -> None:
        self._outcome = outcome
        self._settle()


class ExclusiveJob(Job):
    """A job whose run() answers with the whole reply (a response map)."""

    def __init__(self, run: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self.run = run
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def finish(
        self, result: dict[str, Any] | None = None, error: BaseException | None = None
    ) -> None:
        self.result, self.error = result, error
        self._settle()
