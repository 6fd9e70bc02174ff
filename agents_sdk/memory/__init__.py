"""Agent-side memory: short-term and working memory, condensation, prompt context.

Everything here is local, synchronous where possible and free of network IO
(the LLM summarizer and ``consolidate`` reach out only through what they are
given). See ``docs/memory.md``.
"""

from agents_sdk.memory.actions import ACTION_NAMES, ActionResult, call_action, memory_tools
from agents_sdk.memory.attachments import Attachment, Attachments, RenderedContext, render_related
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
from agents_sdk.memory.stores import (
    STAGES,
    ConfigFileError,
    ConversationStore,
    FileStore,
    LogStore,
    MemoryConfig,
    MemoryStore,
    Stage,
    StoreSpec,
    create_store,
    load_config,
    register_store_type,
)
from agents_sdk.memory.summarize import extractive_summary
from agents_sdk.memory.summarizer import OpenAISummarizer, summary_messages
from agents_sdk.memory.tokens import (
    ModelTokenCounter,
    TiktokenCounter,
    chars_counter,
    token_counter,
)
from agents_sdk.memory.toolloop import ExtraTool, ToolLoopResult, run_tool_loop
from agents_sdk.memory.working import WorkingItem, WorkingMemory

__all__ = [
    "ACTION_NAMES",
    "LAYERS",
    "STAGES",
    "STANDARD_FIELDS",
    "ActionResult",
    "AgentMemory",
    "Attachment",
    "Attachments",
    "BoardEntryLike",
    "ChatMessage",
    "CondensationEvent",
    "CondensedHistory",
    "Condenser",
    "CondenserPipeline",
    "ConfigFileError",
    "ConsolidationRequest",
    "ConversationStore",
    "Episode",
    "EpisodeSummary",
    "ExtraTool",
    "FileStore",
    "ItemId",
    "LLMRouter",
    "LLMSummarizingCondenser",
    "LatencyStats",
    "Layer",
    "LayerHit",
    "LogStore",
    "MemoryConfig",
    "MemoryItem",
    "MemoryMetrics",
    "MemoryStore",
    "ModelTokenCounter",
    "OpenAISummarizer",
    "PromptBudget",
    "PromptContext",
    "PruneResult",
    "PruneStrategy",
    "RecalledMemoryLike",
    "Remember",
    "RenderedContext",
    "RollingWindowCondenser",
    "RouteRule",
    "Router",
    "RuleRouter",
    "ShortTermMemory",
    "Stage",
    "StoreSpec",
    "Summarizer",
    "Summary",
    "SummaryResult",
    "TiktokenCounter",
    "TokenCounter",
    "ToolLoopResult",
    "ViewItem",
    "WorkingItem",
    "WorkingMemory",
    "apply_events",
    "approx_tokens",
    "build_prompt",
    "call_action",
    "chars_counter",
    "consolidate",
    "consolidation_requests",
    "create_store",
    "extractive_summary",
    "item_text",
    "load_config",
    "memory_tools",
    "prompt_cost",
    "register_store_type",
    "render_item",
    "render_prompt",
    "render_related",
    "run_tool_loop",
    "summary_id",
    "summary_messages",
    "token_counter",
]
