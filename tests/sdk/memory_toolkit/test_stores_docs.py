"""The snippets of docs/memory.md's sections "Stores and attachments" and "Prompt context and
tokenizers" run as they are written (against a real stack), and print what the docs say."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker

DOC = Path(__file__).resolve().parents[3] / "docs" / "memory.md"


def section(name: str) -> str:
    """The text of one ``## name`` section (up to the next heading outside a code block)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {name}\n") + 1
    fenced = False
    for match in re.finditer(r"^(```|## ).*$", text[start + 1:], re.M):
        if match.group(1) == "```":
            fenced = not fenced
        elif not fenced:
            return text[start:start + 1 + match.start()]
    return text[start:]


def blocks(name: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(name), re.S)


async def run(code: str, namespace: dict[str, Any]) -> str:
    """Run a snippet (its top-level awaits included) and check what it prints against its
    ``# ...`` comment lines that follow a print; returns the output."""
    source = "async def __snippet():\n" + textwrap.indent(code, "    ") + "\n    return locals()\n"
    exec(compile(source, str(DOC), "exec"), namespace)  # the docs' own code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace.update(await namespace["__snippet"]())
    lines = code.splitlines()
    expected = [line[2:] for i, line in enumerate(lines)
                if line.startswith("# ") and i and (lines[i - 1].startswith("print(") or lines[i - 1].startswith("# "))]
    if expected:
        assert out.getvalue().splitlines() == expected
    return out.getvalue()


def test_the_sections_have_their_snippets() -> None:
    assert len(blocks("Stores and attachments", "python")) == 3
    assert len(blocks("Stores and attachments", "toml")) == 1
    assert len(blocks("Prompt context and tokenizers", "python")) == 2


@pytest.mark.asyncio
async def test_the_snippets_run(pg_settings: Settings, start_worker: StartWorker, unique: str,
                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    (toml,) = blocks("Stores and attachments", "toml")
    (tmp_path / "memory.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    settings = pg_settings.model_copy(update={"agent_memory": pg_settings.agent_memory.model_copy(
        update={"long_term_board": unique})})
    async with Agent.connect(f"{unique}-scout", settings=settings) as agent:
        namespace: dict[str, Any] = {"agent": agent}
        for code in blocks("Stores and attachments", "python") + blocks("Prompt context and tokenizers", "python"):
            await run(code, namespace)
        ctx = namespace["ctx"]
        assert ctx.text.startswith("## Related memories\n- [") and ctx.messages[0]["content"] == ctx.text
        assert {h.text for h in ctx.hits} == {"page 3 parsed: 12 products, prices in span.price",
                                              "sku: stock keeping unit"}
        assert namespace["messages"][1] == ctx.messages[0]
