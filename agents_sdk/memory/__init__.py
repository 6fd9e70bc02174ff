"""Agent-side memory: short-term and working memory, condensation, prompt context.

Everything here is local, synchronous where possible and free of network IO
(the LLM summarizer and ``consolidate`` reach out only through what they are
given). See ``docs/memory.md``.
"""

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
from agents_sdk.memory.items import (
    STANDARD_FIELDS,
    ItemId,
    MemoryItem,
    Summary,
    ViewItem,
    render_item,
)
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
from agents_sdk.memory.short_term import ShortTermMemory
from agents_sdk.memory.summarizer import OpenAISummarizer, summary_messages
from agents_sdk.memory.working import WorkingItem, WorkingMemory

__all__ = [
    "STANDARD_FIELDS",
    "BoardEntryLike",
    "ChatMessage",
    "CondensationEvent",
    "CondensedHistory",
    "Condenser",
    "CondenserPipeline",
    "ConsolidationRequest",
    "ItemId",
    "LLMSummarizingCondenser",
    "MemoryItem",
    "OpenAISummarizer",
    "PromptBudget",
    "PromptContext",
    "RecalledMemoryLike",
    "Remember",
    "RollingWindowCondenser",
    "ShortTermMemory",
    "Summarizer",
    "Summary",
    "TokenCounter",
    "ViewItem",
    "WorkingItem",
    "WorkingMemory",
    "apply_events",
    "approx_tokens",
    "build_prompt",
    "consolidate",
    "consolidation_requests",
    "item_text",
    "prompt_cost",
    "render_item",
    "render_prompt",
    "summary_id",
    "summary_messages",
]
