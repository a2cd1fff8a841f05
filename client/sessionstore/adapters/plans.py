# The adapters' decisions are written once, as plans: generators that yield the
# calls they need next (sent pipelined, one round trip) and get their results
# back, or the error of the first that failed thrown in. `run` drives a plan on
# the blocking client, `arun` on the asyncio client, so the sync and async
# methods of an adapter share every decision.
from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

from ..asyncio_client import AsyncioClient
from ..client import Client
from ..errors import SessionStoreError
from ..requests import Call

T = TypeVar("T")
Plan = Generator[list[Call], list[Any], T]

KIND = "kv"  # the adapters keep every document in kv
SCAN_PAGE = 1000  # the daemon's largest range read
TXN_OPS = 10_000  # the daemon's largest txn


def run(client: Client, plan: Plan[T]) -> T:
    try:
        calls = next(plan)
        while True:
            try:
                results = client.run_all(calls)
            except SessionStoreError as error:
                calls = plan.throw(error)
                continue
            calls = plan.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(client: AsyncioClient, plan: Plan[T]) -> T:
    try:
        calls = next(plan)
        while True:
            try:
                results = await client.run_all(calls)
            except SessionStoreError as error:
                calls = plan.throw(error)
                continue
            calls = plan.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
