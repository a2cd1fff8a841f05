# LangGraph's own conformance suite (the langgraph-checkpoint-conformance
# package, as installed) against SessionStoreSaver on a real daemon: every
# check of every capability, base and extended, must pass. The report is
# printed (pytest -s shows it; a failure shows it always). A saver with a ttl
# passes it too: expiry changes nothing within the ttl.
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from sessionstore.langgraph import SessionStoreSaver

from .conftest import DaemonProcess


@pytest.mark.parametrize(
    "ttl", [None, {"default_ttl": 60, "refresh_on_read": True}], ids=["no_ttl", "ttl"]
)
def test_every_conformance_check_passes(running: DaemonProcess, ttl: Any) -> None:
    @checkpointer_test(name="SessionStoreSaver")
    async def saver() -> AsyncIterator[SessionStoreSaver]:
        checkpointer = SessionStoreSaver(running.socket_path, ttl=ttl)
        yield checkpointer
        await checkpointer.aclose()

    report = asyncio.run(validate(saver))
    report.print_report()
    results = report.results
    assert set(results) == {capability.value for capability in ALL_CAPABILITIES}
    failures = {name: result.failures for name, result in results.items() if result.failures}
    assert not failures, failures
    assert all(result.detected and result.passed for result in results.values()), results
    total = sum(result.tests_passed for result in results.values())
    print(f"conformance: {total} checks passed, level {report.conformance_level()}")
    assert report.conformance_level() == "FULL"
