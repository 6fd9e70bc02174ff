"""Agent-side memory: short-term and working memory, condensation, prompt context.

Everything here is local, synchronous where possible and free of network IO
(the LLM summarizer and ``consolidate`` reach out only through what they are
given). See ``docs/memory.md``.
"""

from agents_sdk.memory.actions import ACTION_NAMES, ActionResult, call_action, memory_tools
from agents_sdk.memory.condense import (
    CondensationEvent,
    CondensedHistory,
    Condenser,
    CondenserPipeline,
    LLMSummarizingCondenser,
    RollingWindowCondenser,
    Summarizer,
    apply_events,
    summary_id,
)
from agents_sdk.memory.consolidate import (
    ConsolidationRequest,
    Remember,
    consolidate,
    consolidation_requests,
    item_text,
)
from agents_sdk.memory.episodes import Episode, EpisodeSummary
from agents_sdk.memory.facade import AgentMemory, PruneResult, SummaryResult
from agents_sdk.memory.items import (
    STANDARD_FIELDS,
    ItemId,
    MemoryItem,
    Summary,
    ViewItem,
    render_item,
)
from agents_sdk.memory.layers import LAYERS, Layer, LayerHit, PruneStrategy
from agents_sdk.memory.metrics import LatencyStats, MemoryMetrics
from agents_sdk.memory.prompt import (
    BoardEntryLike,
    ChatMessage,
    PromptBudget,
    PromptContext,
    RecalledMemoryLike,
    TokenCounter,
    approx_tokens,
    build_prompt,
    prompt_cost,
    render_prompt,
)
from agents_sdk.memory.router import LLMRouter, Router, RouteRule, RuleRouter
from agents_sdk.memory.short_term import ShortTermMemory
from agents_sdk.memory.summarize import extractive_summary
from agents_sdk.memory.summarizer import OpenAISummarizer, summary_messages
from agents_sdk.memory.toolloop import ExtraTool, ToolLoopResult, run_tool_loop
from agents_sdk.memory.working import WorkingItem, WorkingMemory

__all__ = [
    "ACTION_NAMES",
    "LAYERS",
    "STANDARD_FIELDS",
    "ActionResult",
    "AgentMemory",
    "BoardEntryLike",
    "ChatMessage",
    "CondensationEvent",
    "CondensedHistory",
    "Condenser",
    "CondenserPipeline",
    "ConsolidationRequest",
    "Episode",
    "EpisodeSummary",
    "ExtraTool",
    "ItemId",
    "LLMRouter",
    "LLMSummarizingCondenser",
    "LatencyStats",
    "Layer",
    "LayerHit",
    "MemoryItem",
    "MemoryMetrics",
    "OpenAISummarizer",
    "PromptBudget",
    "PromptContext",
    "PruneResult",
    "PruneStrategy",
    "RecalledMemoryLike",
    "Remember",
    "RollingWindowCondenser",
    "RouteRule",
    "Router",
    "RuleRouter",
    "ShortTermMemory",
    "Summarizer",
    "Summary",
    "SummaryResult",
    "TokenCounter",
    "ToolLoopResult",
    "ViewItem",
    "WorkingItem",
    "WorkingMemory",
    "apply_events",
    "approx_tokens",
    "build_prompt",
    "call_action",
    "consolidate",
    "consolidation_requests",
    "extractive_summary",
    "item_text",
    "memory_tools",
    "prompt_cost",
    "render_item",
    "render_prompt",
    "run_tool_loop",
    "summary_id",
    "summary_messages",
]
