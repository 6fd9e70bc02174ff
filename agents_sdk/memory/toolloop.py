"""A tool-calling loop for OpenAI-compatible chat models with the memory actions as tools.

:func:`run_tool_loop` sends the conversation with :func:`~agents_sdk.memory.actions.memory_tools`
(and any :class:`ExtraTool`), runs every tool call the model makes (memory actions through
:func:`~agents_sdk.memory.actions.call_action`, with the agent's own rights), appends the
assistant message and one ``role: "tool"`` message per call, and asks again, until the model
answers without tool calls or ``max_rounds`` requests were made. See docs/memory.md
"Memory actions as tools".
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from agents_sdk.memory.actions import (
    ACTION_NAMES,
    ActionResult,
    call_action,
    memory_tools,
    parse_tool_call,
)
from agents_sdk.memory.prompt import ChatMessage
from blackboard.client.llm import openai_client
from blackboard.protocol.errors import BlackboardError, ConfigurationError, LLMError
from blackboard.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from agents_sdk.memory.facade import AgentMemory

__all__ = ["ExtraTool", "ToolLoopResult", "run_tool_loop"]


@dataclass(frozen=True, slots=True)
class ExtraTool:
    """A tool of the caller's offered beside the memory actions.

    Attributes:
        name: The function name the model calls.
        description: What it does (the model reads it).
        parameters: The JSON Schema of its arguments (an object).
        run: Called with the parsed arguments; returns the text fed back to the model (or an
            :class:`ActionResult`). A ``BlackboardError`` or ``ValueError`` it raises is fed
            back as an error result; anything else propagates.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    run: Callable[[dict[str, Any]], Awaitable[str | ActionResult]]

    def definition(self) -> dict[str, Any]:
        """The OpenAI tool definition."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                  "parameters": dict(self.parameters)}}


@dataclass(frozen=True, slots=True)
class ToolLoopResult:
    """What a tool loop ended with.

    Attributes:
        messages: The whole conversation: the messages given, then each assistant message
            and the tool messages answering its calls.
        reply: The final assistant text (None when the loop stopped at ``max_rounds``).
        rounds: Chat completions requested.
        results: Every tool call's result, in order.
        finished: The model answered without tool calls (False: stopped at ``max_rounds``).
    """

    messages: list[ChatMessage]
    reply: str | None
    rounds: int
    results: list[ActionResult] = field(default_factory=list)
    finished: bool = True


async def run_tool_loop(llm: AsyncOpenAI | LLMSettings, messages: Sequence[ChatMessage], memory: AgentMemory,
                        *, model: str | None = None, max_rounds: int = 8, extra_tools: Sequence[ExtraTool] = (),
                        options: Mapping[str, Any] | None = None) -> ToolLoopResult:
    """Chat with ``llm`` offering the memory actions as tools until it answers without tool calls.

    Args:
        llm: An ``openai.AsyncOpenAI`` client, or ``settings.llm`` (a client is made for the
            loop and closed after it).
        messages: The conversation so far (not modified).
        memory: The agent's memory (``agent.memory``) the actions run against.
        model: The model name (default ``llm.model`` for settings; required with a client).
        max_rounds: Most chat completions requested.
        extra_tools: Other tools offered beside the memory actions.
        options: Extra arguments of each ``chat.completions.create`` (e.g. ``temperature``).

    Returns:
        The :class:`ToolLoopResult`.

    Raises:
        ConfigurationError: no model, an extra tool named like a memory action (or two alike),
            ``max_rounds`` below 1, or settings without an api_key for the default endpoint.
        LLMError: a chat completion failed (after the client's retries) or had no choice.
    """
    if max_rounds < 1:
        raise ConfigurationError("max_rounds must be at least 1")
    extras = {t.name: t for t in extra_tools}
    clash = sorted(set(extras) & set(ACTION_NAMES))
    if clash or len(extras) != len(extra_tools):
        raise ConfigurationError(f"extra tools must have distinct names other than the memory actions' "
                                 f"({', '.join(clash) or 'duplicate names'})")
    if isinstance(llm, LLMSettings):
        client, owned, model = openai_client(llm), True, model or llm.model
    else:
        client, owned = llm, False
        if not model:
            raise ConfigurationError("run_tool_loop needs model= with a client")
    try:
        return await _loop(client, model, list(messages), memory, max_rounds, extras, dict(options or {}))
    finally:
        if owned:
            await client.close()


async def _loop(client: AsyncOpenAI, model: str, history: list[ChatMessage], memory: AgentMemory,
                max_rounds: int, extras: dict[str, ExtraTool], options: dict[str, Any]) -> ToolLoopResult:
    import openai

    tools = memory_tools() + [t.definition() for t in extras.values()]
    results: list[ActionResult] = []
    for rounds in range(1, max_rounds + 1):
        try:
            response = await client.chat.completions.create(model=model, messages=cast(Any, history),
                                                            tools=cast(Any, tools), **options)
        except openai.OpenAIError as exc:
            raise LLMError(f"chat completion of {model!r} failed: {exc}") from exc
        if not response.choices:
            raise LLMError(f"model {model!r} answered no choice")
        message = response.choices[0].message
        calls = list(message.tool_calls or ())
        if not calls:
            history.append({"role": "assistant", "content": message.content or ""})
            return ToolLoopResult(history, message.content or "", rounds, results, True)
        history.append({"role": "assistant", "content": message.content,
                        "tool_calls": [_call_dict(c) for c in calls]})
        for call in calls:
            result = await _run(call, memory, extras)
            results.append(result)
            history.append({"role": "tool", "tool_call_id": str(getattr(call, "id", "")), "content": result.content})
    return ToolLoopResult(history, None, max_rounds, results, False)


async def _run(call: Any, memory: AgentMemory, extras: dict[str, ExtraTool]) -> ActionResult:
    """One tool call's result (memory action or extra tool)."""
    try:
        name, raw = parse_tool_call(call)
    except ValueError as exc:
        return ActionResult.failure("?", f"InvalidToolCall: {exc}")
    extra = extras.get(name)
    if extra is None:
        if name not in ACTION_NAMES:
            known = ", ".join((*ACTION_NAMES, *extras))
            return ActionResult.failure(name, f"UnknownTool: no tool {name!r} (tools: {known})")
        return await call_action(memory, call)
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
        if not isinstance(args, dict):
            raise ValueError("the arguments must be a JSON object")
        out = await extra.run(args)
    except (BlackboardError, ValueError) as exc:
        return ActionResult.failure(name, f"{type(exc).__name__}: {exc}")
    return out if isinstance(out, ActionResult) else ActionResult(True, name, out, {"result": out})


def _call_dict(call: Any) -> dict[str, Any]:
    """An SDK tool call as the message dict sent back with the history."""
    fn = getattr(call, "function", None)
    return {"id": getattr(call, "id", None), "type": "function",
            "function": {"name": getattr(fn, "name", None), "arguments": getattr(fn, "arguments", None) or "{}"}}


