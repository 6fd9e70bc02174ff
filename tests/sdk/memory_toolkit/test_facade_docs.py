"""The snippets of docs/memory.md's sections on the facade, the router, episodes and metrics
run as they are written (against a real stack), so that they keep matching the code."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker

pytestmark = pytest.mark.asyncio

DOC = Path(__file__).resolve().parents[3] / "docs" / "memory.md"
SECTIONS = ("The facade and its layers", "The router", "Episodes", "Settings and metrics")


def snippets(section: str) -> list[str]:
    """The python blocks of one ``## section`` of docs/memory.md."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else None]
    return re.findall(r"```python\n(.*?)```", body, re.S)


async def run(code: str, namespace: dict[str, Any]) -> None:
    source = "async def __snippet():\n" + textwrap.indent(code, "    ") + "\n    return locals()\n"
    exec(compile(source, str(DOC), "exec"), namespace)  # the docs' own code
    namespace.update(await namespace["__snippet"]())


async def test_the_snippets_run(pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    assert all(snippets(s) for s in SECTIONS)
    settings = pg_settings.model_copy(update={"agent_memory": pg_settings.agent_memory.model_copy(
        update={"long_term_board": unique})})

    class _Agent:  # Agent.connect("scout-1") as the docs write it, with the test's settings
        @staticmethod
        def connect(agent_id: str, **kwargs: Any) -> Any:
            return Agent.connect(f"{unique}-{agent_id}", settings=settings, **kwargs)

    first, *others = snippets("The facade and its layers")
    namespace: dict[str, Any] = {"Agent": _Agent}
    await run(first.replace("from agents_sdk import Agent\n", ""), namespace)
    assert [h.layer for h in namespace["hits"]] == ["short_term", "working"]
    assert namespace["note"].id == "wm:price_selector"
    async with Agent.connect(f"{unique}-scout-2", settings=settings) as agent:
        namespace = {"agent": agent}
        for code in snippets("The router"):  # plugs routers in: on an agent of its own
            await run(code, namespace)
        assert await agent.memory.router.route("selectors", available=["short_term", "shared"]) == ["shared"]
    async with Agent.connect(f"{unique}-scout-3", settings=settings) as agent:
        namespace = {"agent": agent}
        for code in others + snippets("Episodes") + snippets("Settings and metrics"):
            await run(code, namespace)
        assert namespace["summary"].text.splitlines()[0] == "price_selector: span.price"
        assert namespace["made"].text.startswith("sku-12: SKU-12 costs 12.50 on /p/12")
        assert namespace["m"].used_rate > 0
