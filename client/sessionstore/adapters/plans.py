# The adapters' decisions are written once, as plans: generators that yield the
# calls they need next (sent pipelined, one round trip) and get their results
# back, or the error of the first that failed thrown in. `run` drives a plan on
# the blocking client, `arun` on the asyncio client, so the sync and async
# methods of an adapter share every decision; a Runner holds the clients an
# adapter with sync and async methods drives them on.
from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any, TypeVar

from ..asyncio_client import AsyncClient, ClientPerLoop
from ..client import Client
from ..errors import SessionStoreError
from ..requests import Call

T = TypeVar("T")
AnyClient = Client | AsyncClient
Plan = Generator[list[Call[Any]], list[Any], T]

KIND = "kv"  # the adapters keep every document in kv
SCAN_PAGE = 1000  # the daemon's largest range read
TXN_OPS = 10_000  # the daemon's largest txn


def put_op(
    key: str, value: dict[str, Any], *, if_absent: bool = False, ttl_s: float | None = None
) -> dict[str, Any]:
    """A txn's put of a kv document (with if_absent: keeps one already there; with ttl_s:
    expiring that many seconds after it is committed)."""
    op: dict[str, Any] = {"op": "put", "kind": KIND, "key": key, "value": value}
    if if_absent:
        op["if_absent"] = True
    if ttl_s is not None:
        op["ttl_s"] = ttl_s
    return op


def delete_op(key: str) -> dict[str, Any]:
    return {"op": "delete", "kind": KIND, "key": key}


def delete_prefix_op(prefix: str) -> dict[str, Any]:
    return {"op": "delete_prefix", "kind": KIND, "prefix": prefix}


def run(client: Client, plan: Plan[T]) -> T:
    try:
        calls = next(plan)
        while True:
            try:
                results = client.pipeline(calls)
            except SessionStoreError as error:
                calls = plan.throw(error)
                continue
            calls = plan.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(client: AsyncClient, plan: Plan[T]) -> T:
    try:
        calls = next(plan)
        while True:
            try:
                results = await client.pipeline(calls)
            except SessionStoreError as error:
                calls = plan.throw(error)
                continue
            calls = plan.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class Runner:
    """One blocking client (made at first use, shared by threads one plan at a time)
    and an asyncio client per event loop; or the client the caller handed in, for the
    methods of its kind, which the Runner never closes."""

    def __init__(
        self,
        socket_path: str | None,
        timeout: float | None,
        given: AnyClient | None = None,
        async_clients: ClientPerLoop | None = None,
    ) -> None:
        """async_clients: an adapter's own, to run async plans on."""
        if given is not None:
            socket_path, timeout = given.socket_path, given.timeout
        self.socket_path = socket_path
        self.timeout = timeout
        self._client = given if isinstance(given, Client) else None
        self._owns_client = self._client is None
        self._lock = threading.Lock()
        asyncio_client = given if isinstance(given, AsyncClient) else None
        self._async_clients = async_clients or ClientPerLoop(socket_path, timeout, asyncio_client)

    def run(self, plan: Plan[T]) -> T:
        with self._lock:
            if self._client is None:
                self._client = Client(self.socket_path, timeout=self.timeout)
            return run(self._client, plan)

    async def arun(self, plan: Plan[T]) -> T:
        return await arun(self._async_clients.current(), plan)

    def close(self) -> None:
        if self._client is not None and self._owns_client:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        await self._async_clients.aclose()


def socket_of(socket_path: str | None, client: AnyClient | None) -> str | None:
    """An adapter takes a socket path or a client, not both."""
    if client is not None and socket_path is not None:
        raise TypeError("pass socket_path or client, not both")
    return client.socket_path if client is not None else socket_path


class OnRunner:
    """An adapter with sync and async methods whose plans run on a Runner; closing it
    closes the clients it made (never one the caller handed in)."""

    socket_path: str | None
    timeout: float | None
    _runner: Runner

    def _start_runner(
        self, socket_path: str | None, timeout: float | None, client: AnyClient | None
    ) -> None:
        self.socket_path = socket_of(socket_path, client)
        self._runner = Runner(self.socket_path, timeout, client)
        self.timeout = self._runner.timeout

    def close(self) -> None:
        self._runner.close()

    async def aclose(self) -> None:
        await self._runner.aclose()
