# LangGraph's own conformance suite (the langgraph-checkpoint-conformance
# package, as installed) against SessionStoreSaver on a real daemon: every
# check of every capability, base and extended, must pass. The report is
# printed (pytest -s shows it; a failure shows it always).
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from sessionstore.langgraph import SessionStoreSaver

from .conftest import DaemonProcess


def test_every_conformance_check_passes(running: DaemonProcess) -> None:
    @checkpointer_test(name="SessionStoreSaver")
    async def saver() -> AsyncIterator[SessionStoreSaver]:
        checkpointer = SessionStoreSaver(running.socket_path)
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
