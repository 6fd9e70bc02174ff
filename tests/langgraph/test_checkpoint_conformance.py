"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) against
``BlackboardSaver`` on a real nats-server, under authorization.

Every capability the saver implements is declared (detected from its overridden
async methods) and must pass all of its tests; the test fails naming each
failing test otherwise. Each capability gets a fresh saver on a board of its
own. No capability is skipped: :data:`SKIPPED` is empty and says why if one ever is.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardSaver
from blackboard.settings import Settings

#: Capabilities not run, with the reason (none: the saver implements all eight).
SKIPPED: dict[str, str] = {}


@pytest.mark.asyncio
async def test_conformance_suite_passes_for_every_declared_capability(settings: Settings, unique: str) -> None:
    lines: list[str] = []
    async with Agent.connect(f"{unique}-saver", settings=settings) as agent:

        @checkpointer_test(name=f"BlackboardSaver-{unique}", skip_capabilities=set(SKIPPED))
        async def factory() -> AsyncGenerator[BlackboardSaver, None]:
            yield BlackboardSaver(agent, board=f"{unique}-{uuid.uuid4().hex[:8]}")

        def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
            if not passed:
                lines.append(f"{capability}.{test} FAILED:\n{error}")

        report = await validate(factory, progress=ProgressCallbacks(on_test_result=on_result))
        detected = DetectedCapabilities.from_instance(BlackboardSaver(agent, board=unique)).detected

    declared = sorted(c.value for c in detected)
    report.print_report()
    print(f"declared capabilities: {declared}; skipped: {SKIPPED or 'none'}")
    print({name: (r.tests_passed, r.tests_failed) for name, r in report.results.items()})
    assert declared == sorted(c.value for c in ALL_CAPABILITIES), "a capability is not implemented"
    assert not lines, "\n".join(lines)
    for capability in declared:
        result = report.results[capability]
        if capability in SKIPPED:
            continue
        assert result.detected and result.passed is True, (capability, result.failures)
        assert result.tests_passed > 0 and result.tests_failed == 0, (capability, result)
    assert report.conformance_level() == "FULL"
