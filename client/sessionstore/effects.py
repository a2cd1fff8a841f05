# A ledger of a session's tool effects, so that a resumed run does not repeat
# an effect its crashed predecessor already had, and never repeats one whose
# outcome it cannot know.
#
#     ledger = Ledger("user-42")                  # or AsyncLedger, for asyncio tools
#
#     @ledger.once(lambda order: f"refund/{order}")
#     def refund(order: str) -> dict: ...         # runs once per key, ever
#
#     with ledger.once("email/42") as effect:     # the same, around a block
#         if not effect.done:
#             effect.record(send_email())
#     effect.result                               # what the first run recorded
#
# Each effect is one `kv` document, EFFECTS + session + "/" + key. Before the
# tool runs, a txn creates it as "intended" (create-only: of two runs racing on
# one key, one runs the tool and the other is refused). Once the tool returns,
# a second txn, conditional on the intent being the one this run wrote, records
# "done" with its result. A run that finds its key:
#   - "done": gets the recorded result, and the tool is not called;
#   - "intended": the tool may or may not have taken effect (a crash, a kill,
#     an exception between the two txns). It is never run again on its own:
#     the run gets UnresolvedEffect, and unresolved() lists every such effect,
#     for whoever knows the remote side to settle it with resolve(key, result)
#     or retry(key).
# An exception from the tool leaves its effect "intended", the error recorded:
# a tool that fails has not said it did nothing. The result must be what CBOR
# holds (JSON's types, bytes). Effects expire with ttl_s when one is given.
#
# An adapter's ledger (saver.effects(thread), session.effects(), ...) keeps the
# effects among the session's own documents, in a Scope the adapter gives: they
# are removed with the session (and copied with a LangGraph thread), and each of
# the ledger's txns is the adapter's write to the session: under its owner's
# lease (a superseded owner's run is refused with StaleOwner before its tool is
# called) and renewing its lifetime (the effects expire with the session).
from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from . import requests as r
from .adapters import plans
from .adapters.keyparts import key_part
from .adapters.lifetime import every_item, now_ms, required
from .adapters.ownership import Commit, one_txn
from .adapters.plans import KIND, Plan
from .asyncio_client import AsyncClient
from .client import Client
from .errors import Conflict, UnresolvedEffect

T = TypeVar("T")
__all__ = ["AsyncLedger", "Effect", "Key", "Ledger", "Scope", "Unresolved", "UnresolvedEffect"]
INTENDED, DONE = "intended", "done"
Key = str | Callable[..., str]  # an effect's key, or how to make it from the tool's arguments


@dataclass
class Effect:
    """One run's view of an effect: done (with the result recorded, by this run or an
    earlier one) or to be done by this run."""

    key: str
    done: bool = False
    result: Any = None

    def record(self, result: Any) -> None:
        """The block's effect took place, with this result: recorded as done when the
        block ends (even by an exception)."""
        if self.done:
            raise RuntimeError(f"effect {self.key!r} is already recorded")
        self.done, self.result = True, result


@dataclass(frozen=True)
class Unresolved:
    key: str
    at_ms: int
    error: str | None


@dataclass(frozen=True)
class Scope:
    """Where a session's effects are kept, and how they are written: by a stand-alone
    ledger, one txn each; by an adapter's, as the adapter writes to the session."""

    prefix: str
    write: Commit = one_txn  # (ops, require): a conflict on require raised as it came
    # whether the session's lifetime has expired, leaving its effects as leftovers; None:
    # the effects expire one by one (ttl_s), or never
    expired: Callable[[], Plan[bool]] | None = None


class _LedgerPlans:
    """The ledger's decisions, as plans (adapters/plans.py) either client runs."""

    def __init__(self, scope: Scope, ttl_s: float | None = None) -> None:
        self.scope = scope
        self.ttl_s = ttl_s

    def document(self, key: str) -> str:
        return self.scope.prefix + key_part(key)

    def _lapsed(self) -> Plan[bool]:
        expired = self.scope.expired
        return False if expired is None else (yield from expired())

    def _put(self, key: str, value: dict[str, Any]) -> dict[str, Any]:
        return plans.put_op(self.document(key), value, ttl_s=self.ttl_s)

    def _write(
        self, ops: list[dict[str, Any]], require: list[dict[str, Any]] | None = None
    ) -> Plan[None]:
        yield from self.scope.write(ops, require or [])

    def begin(self, key: str) -> Plan[tuple[dict[str, Any] | None, dict[str, Any]]]:
        """(the done record, when an earlier run recorded it, else None; the intent this
        run wrote, or would have). UnresolvedEffect when an earlier run left it
        intended."""
        intent = {"key": key, "state": INTENDED, "at_ms": now_ms()}
        document = self.document(key)
        try:
            yield from self._write([self._put(key, intent)], [required(document, None)])
        except Conflict:
            (record,) = yield [r.checkpoint_get(KIND, document)]
            if record is not None and (yield from self._lapsed()):
                # left by the session's expired lifetime: removed, as the sweep will (or
                # removed meanwhile)
                with contextlib.suppress(Conflict):
                    yield [r.txn([plans.delete_op(document)], [required(document, record)])]
                record = None
            if record is None:  # gone meanwhile (retried, expired): begin afresh
                return (yield from self.begin(key))
            if record["state"] == DONE:
                return record, intent
            raise UnresolvedEffect(key, record) from None
        return None, intent

    def settle(
        self, intent: dict[str, Any], effect: Effect, error: BaseException | None = None
    ) -> Plan[None]:
        """As the block left it: done with its result; or, after an exception, still
        intended, the error recorded; or, neither, as it was."""
        key = intent["key"]
        if effect.done:
            value = {**intent, "state": DONE, "result": effect.result, "done_at_ms": now_ms()}
        elif error is not None:
            value = {**intent, "error": repr(error)}
        else:
            return
        try:
            yield from self._write([self._put(key, value)], [required(self.document(key), intent)])
        except Conflict:  # someone resolved or retried it meanwhile: theirs stands
            raise UnresolvedEffect(key, intent) from None

    def unresolved(self) -> Plan[list[Unresolved]]:
        found = yield from every_item(self.scope.prefix)
        if found and (yield from self._lapsed()):
            return []
        return [
            Unresolved(item["value"]["key"], item["value"]["at_ms"], item["value"].get("error"))
            for item in found
            if item["value"]["state"] == INTENDED
        ]

    def resolve(self, key: str, result: Any) -> Plan[None]:
        value = {"key": key, "state": DONE, "at_ms": now_ms(), "result": result,
                 "done_at_ms": now_ms(), "resolved": True}  # fmt: skip
        yield from self._write([self._put(key, value)])

    def retry(self, key: str) -> Plan[None]:
        yield from self._write([plans.delete_op(self.document(key))])


def _key_of(key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return key(*args, **kwargs) if callable(key) else key


class _LedgerOf(plans.OnRunner):
    """What both ledgers are made of: a session's plans and the client that runs them."""

    def __init__(
        self,
        session: str,
        socket_path: str | None = None,
        *,
        prefix: str = "effects/",
        ttl_s: float | None = None,
        timeout: float | None = 60.0,
        client: Client | AsyncClient | None = None,
    ) -> None:
        """client: a Client for a Ledger, an AsyncClient for an AsyncLedger."""
        self._plans = _LedgerPlans(Scope(f"{prefix}{key_part(session)}/"), ttl_s)
        self._start_runner(socket_path, timeout, client)
        self._owns_runner = True

    @classmethod
    def of_adapter(cls, scope: Scope, runner: plans.Runner) -> Self:
        """An adapter's ledger of one session (what its effects() gives): on the
        adapter's clients, which closing the adapter closes, not the ledger."""
        ledger = cls.__new__(cls)
        ledger._plans = _LedgerPlans(scope)
        ledger._runner, ledger._owns_runner = runner, False
        ledger.socket_path, ledger.timeout = runner.socket_path, runner.timeout
        return ledger

    def close(self) -> None:
        if self._owns_runner:
            super().close()

    async def aclose(self) -> None:
        if self._owns_runner:
            await super().aclose()

    def once(self, key: Key) -> _Once:
        assert isinstance(self, Ledger | AsyncLedger)
        return _Once(self, key)


class Ledger(_LedgerOf):
    """A session's effects, on the blocking client."""

    @contextmanager
    def effect(self, key: str) -> Iterator[Effect]:
        record, intent = self._runner.run(self._plans.begin(key))
        if record is not None:
            yield Effect(key, done=True, result=record.get("result"))
            return
        effect = Effect(key)
        try:
            yield effect
        except BaseException as error:
            self._runner.run(self._plans.settle(intent, effect, error))
            raise
        self._runner.run(self._plans.settle(intent, effect))

    def unresolved(self) -> list[Unresolved]:
        return self._runner.run(self._plans.unresolved())

    def resolve(self, key: str, result: Any = None) -> None:
        """Settle an unresolved effect as done, with this result."""
        self._runner.run(self._plans.resolve(key, result))

    def retry(self, key: str) -> None:
        """Forget an effect, so that the next run with its key runs the tool again."""
        self._runner.run(self._plans.retry(key))


class AsyncLedger(_LedgerOf):
    """A session's effects, on the asyncio client (ADK's and the Agents SDK's tools)."""

    @asynccontextmanager
    async def effect(self, key: str) -> AsyncIterator[Effect]:
        record, intent = await self._runner.arun(self._plans.begin(key))
        if record is not None:
            yield Effect(key, done=True, result=record.get("result"))
            return
        effect = Effect(key)
        try:
            yield effect
        except BaseException as error:
            await self._runner.arun(self._plans.settle(intent, effect, error))
            raise
        await self._runner.arun(self._plans.settle(intent, effect))

    async def unresolved(self) -> list[Unresolved]:
        return await self._runner.arun(self._plans.unresolved())

    async def resolve(self, key: str, result: Any = None) -> None:
        await self._runner.arun(self._plans.resolve(key, result))

    async def retry(self, key: str) -> None:
        await self._runner.arun(self._plans.retry(key))


class _Once:
    """ledger.once(key): a decorator for a tool (sync or async), or a context manager
    around a block (`with` on a Ledger, `async with` on an AsyncLedger)."""

    def __init__(self, ledger: Ledger | AsyncLedger, key: Key) -> None:
        self.ledger = ledger
        self.key = key
        self._context: Any = None

    def __call__(self, tool: Callable[..., T]) -> Callable[..., T]:
        ledger = self.ledger
        if inspect.iscoroutinefunction(tool):
            assert isinstance(ledger, AsyncLedger), "an async tool takes an AsyncLedger"

            @functools.wraps(tool)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with ledger.effect(_key_of(self.key, args, kwargs)) as effect:
                    if not effect.done:
                        effect.record(await tool(*args, **kwargs))
                return effect.result

            return run_async  # type: ignore[return-value]
        assert isinstance(ledger, Ledger), "a blocking tool takes a Ledger"

        @functools.wraps(tool)
        def run(*args: Any, **kwargs: Any) -> Any:
            with ledger.effect(_key_of(self.key, args, kwargs)) as effect:
                if not effect.done:
                    effect.record(tool(*args, **kwargs))
            return effect.result

        return run

    def __enter__(self) -> Effect:
        assert isinstance(self.ledger, Ledger) and isinstance(self.key, str)
        self._context = self.ledger.effect(self.key)
        effect: Effect = self._context.__enter__()
        return effect

    def __exit__(self, *exc: Any) -> bool | None:
        result: bool | None = self._context.__exit__(*exc)
        return result

    async def __aenter__(self) -> Effect:
        assert isinstance(self.ledger, AsyncLedger) and isinstance(self.key, str)
        self._context = self.ledger.effect(self.key)
        effect: Effect = await self._context.__aenter__()
        return effect

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._context.__aexit__(*exc)
        return result
