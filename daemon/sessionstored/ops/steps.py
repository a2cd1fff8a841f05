# Request -> Step: what a connection does with one request, in order. A Reply is
# ready at once; a Read is evaluated when the connection reaches it (connection.py:
# once every earlier write of the connection has finished, before any later
# request is started); a Write commits
# a mutation through the writer and turns its outcome into the reply; an
# Exclusive job runs in the writer with no batch in flight; a Stream (watch)
# takes over the connection's replies; a ReadInThread is read in a thread first
# and becomes one of those.
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sessionstore.wire.protocol import Request, refusal_response

from ..storage.mutations import Outcome
from ..writer.jobs import ExclusiveJob, MutationJob
from .watch import Sink

Response = dict[str, Any]


def failure_reply(request: Request | None, outcome: Outcome) -> Response:
    assert outcome.refused is not None, "a failed outcome always carries its refusal"
    return refusal_response(request, outcome.refused)


class Step:
    started = 0.0  # perf_counter() when the server started it (metrics)

    def __init__(self, request: Request | None) -> None:
        self.request = request

    async def resolve(self) -> Response:
        """A Reply's or a Read's response. The server answers the other steps on paths
        of their own: a Write or an Exclusive through the outbox once its job is done
        (reply()), a ReadInThread by the step it builds, a Stream through its sink."""
        raise AssertionError(f"a {type(self).__name__} is not answered by resolve()")


class Reply(Step):
    def __init__(self, request: Request | None, response: Response) -> None:
        super().__init__(request)
        self.response = response

    async def resolve(self) -> Response:
        return self.response


class Read(Step):
    def __init__(self, request: Request, produce: Callable[[], Awaitable[Response]]) -> None:
        super().__init__(request)
        self.produce = produce

    async def resolve(self) -> Response:
        return await self.produce()


class Write(Step):
    def __init__(
        self, request: Request, job: MutationJob, respond: Callable[[Outcome], Response]
    ) -> None:
        super().__init__(request)
        self.job = job
        self.respond = respond

    def reply(self) -> Response:
        """The reply, once the job is done."""
        outcome = self.job.outcome
        assert outcome is not None
        return self.respond(outcome) if outcome.ok else failure_reply(self.request, outcome)


class ReadInThread(Step):
    """A request whose reading grows with its size (a txn of many ops): the server runs
    build in a thread, so that the event loop goes on, then handles the step it makes."""

    def __init__(self, request: Request, build: Callable[[], Step]) -> None:
        super().__init__(request)
        self.build = build


class Exclusive(Step):
    def __init__(self, request: Request, job: ExclusiveJob) -> None:
        super().__init__(request)
        self.job = job

    def reply(self) -> Response:
        """The reply, once the job is done."""
        if self.job.failure is not None:
            return refusal_response(self.request, self.job.failure)
        if self.job.error is not None:
            raise self.job.error
        assert self.job.result is not None  # finished without failure or error: answered
        return self.job.result


class Stream(Step):
    def __init__(self, request: Request, run: Callable[[Sink], Awaitable[None]]) -> None:
        super().__init__(request)
        self.run = run
