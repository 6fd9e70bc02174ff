"""Memory actions as LLM tools: write, read, search, summarize and prune.

:func:`memory_tools` gives the OpenAI-compatible tool definitions (JSON Schema generated
from the pydantic argument models below, which refuse unknown fields);
:func:`call_action` takes one tool call as a model sent it, validates its arguments,
runs the facade's method (``agent.memory.write/read/search/summarize/prune``) and answers
an :class:`ActionResult`: a compact text for the model, the data as JSON, or a clear error.
Invalid arguments, an unknown tool and a refused right are results with ``ok=False`` (the
tool loop feeds them back to the model), never exceptions. The MCP server exposes the same
actions (``blackboard mcp``: same names, models and results). See docs/memory.md
"Memory actions as tools".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents_sdk.memory.layers import LAYERS, Layer, PruneStrategy
from blackboard.protocol.errors import BlackboardError, NotFoundError, PermissionDeniedError
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.schemas.prune import MAX_PRUNE_LIMIT
from blackboard.protocol.schemas.search import SearchMode

if TYPE_CHECKING:
    from agents_sdk.memory.facade import AgentMemory
    from agents_sdk.memory.layers import LayerHit

__all__ = [
    "ACTION_NAMES",
    "TEXT_CHARS",
    "ActionResult",
    "MemoryPruneArgs",
    "MemoryReadArgs",
    "MemorySearchArgs",
    "MemorySummarizeArgs",
    "MemoryWriteArgs",
    "action_description",
    "action_model",
    "action_schema",
    "call_action",
    "hit_data",
    "memory_tools",
    "parse_tool_call",
    "validation_text",
]

#: Longest hit text a result's ``content`` shows (the whole text stays in ``data``).
TEXT_CHARS: Final = 300

_LayerArg = Annotated[Layer, Field(description="'short_term' (this episode's steps), 'working' (this episode's "
                                               "notes by key), 'long_term' (your long-term memory) or 'shared' "
                                               "(the boards you joined).")]
_Board = Annotated[str | None, Field(description="The board of a long_term/shared memory (default: your own "
                                                 "long-term board).", min_length=1, max_length=128)]
_Tags = Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]],
                  Field(description="Labels, e.g. ['selectors'].", max_length=64)]
_Keys = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                  Field(description="Keys whose values are kept verbatim, e.g. ['goal'].", max_length=64)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryWriteArgs(_Args):
    """Arguments of ``memory_write``."""

    text: str = Field(description="What to remember, in words.", min_length=1, max_length=100_000)
    layer: _LayerArg = "short_term"
    key: str | None = Field(None, description="What it is about, e.g. 'selector:price'. A working note is "
                                              "stored under it; a long-term memory with the same key supersedes "
                                              "older ones.", min_length=1, max_length=256)
    tags: _Tags = []
    metadata: dict[str, Any] | None = Field(None, description='A JSON object stored with it, e.g. {"url": "..."}.')
    ttl: float | None = Field(None, description="Seconds a working note lives (default: the settings').",
                              gt=0, le=365 * 86400)
    confidence: float | None = Field(None, description="How sure you are of it, 0 to 1.", ge=0, le=1)
    importance: float = Field(0.5, description="How much it matters, 0 to 1.", ge=0, le=1)
    board: _Board = None
    kind: MemoryKind | None = Field(None, description="Long-term memories: 'episodic' (what happened), "
                                                      "'semantic' (a fact), 'procedural' (how to do something), "
                                                      "'knowledge' or 'summary'.")


class MemoryReadArgs(_Args):
    """Arguments of ``memory_read``."""

    id: str = Field(description="A hit's id (as memory_search shows it), or a working note's key.",
                    min_length=1, max_length=512)
    layer: Layer | None = Field(None, description="The layer to read (default: told by the id's form).")
    board: _Board = None


class MemorySearchArgs(_Args):
    """Arguments of ``memory_search``."""

    query: str = Field(description="What to look for, in words.", min_length=1, max_length=10_000)
    layers: list[Layer] | None = Field(None, description="Layers to search, e.g. ['working', 'long_term'] "
                                                         "(default: the router chooses).",
                                       min_length=1, max_length=len(LAYERS))
    mode: SearchMode = Field("hybrid", description="'hybrid' (words and meaning), 'semantic' or 'keyword'.")
    min_relevance: float | None = Field(None, description="Leave out hits scoring below this, 0 to 1.",
                                        ge=0, le=1)
    since: AwareDatetime | None = Field(None, description="Only items written at or after this time, ISO 8601 "
                                                          "with an offset, e.g. '2026-01-31T12:00:00Z'.")
    until: AwareDatetime | None = Field(None, description="Only items written before this time (ISO 8601).")
    filters: dict[str, Any] | None = Field(None, description=(
        'Long-term/shared filters, e.g. {"tags_any": ["selectors"], "kinds": ["semantic"], '
        '"min_confidence": 0.5, "where": {"metadata.site": "shop"}}.'))
    top_k: int | None = Field(None, description="Most hits to return (default 10).", ge=1, le=100)

    @model_validator(mode="after")
    def _range(self) -> MemorySearchArgs:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class MemorySummarizeArgs(_Args):
    """Arguments of ``memory_summarize``."""

    layer: _LayerArg = "short_term"
    query: str | None = Field(None, description="Summarize only what matches this.", min_length=1,
                              max_length=10_000)
    ids: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        [], description="Summarize only these items (ids as memory_search shows them).", max_length=1000)
    strategy: Literal["extractive", "llm"] | None = Field(None, description="'extractive' (picked sentences) or "
                                                                           "'llm' (default: the settings').")
    target_tokens: int | None = Field(None, description="About how long the summary may be, in tokens.",
                                      ge=16, le=32_000)
    keep_keys: _Keys = []
    board: _Board = None
    replace: bool = Field(False, description="Replace the summarized items by the summary (long_term/shared: "
                                             "your own memories, others' only with admin rights).")


class MemoryPruneArgs(_Args):
    """Arguments of ``memory_prune``."""

    layer: _LayerArg = "long_term"
    strategy: PruneStrategy = Field(
        "low_confidence", description="'low_confidence' (confidence below threshold), 'lru' (not used for "
                                      "threshold seconds), 'old_age' (older than threshold seconds), "
                                      "'importance' (importance below threshold) or 'max_per_board' (all but "
                                      "the newest threshold).")
    threshold: float | None = Field(None, description="The strategy's threshold (default: the settings').", ge=0)
    board: _Board = None
    scope: Literal["own", "all"] = Field("own", description="'own' (your memories) or 'all' (everyone's: needs "
                                                            "admin rights on the board).")
    dry_run: bool = Field(False, description="Only tell what would be pruned.")
    limit: int | None = Field(None, description="Most memories to prune.", ge=1, le=MAX_PRUNE_LIMIT)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What a memory action answered.

    Attributes:
        ok: The action ran.
        name: The tool's name (as called, even when unknown).
        content: Compact, LLM-readable text: the result, or ``"error: ..."``. The tool
            message a loop sends back.
        data: The result as JSON (None on failure).
        error: What went wrong (None when ``ok``): ``"<ErrorClass>: <message>"``.
    """

    ok: bool
    name: str
    content: str
    data: dict[str, Any] | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON (what the MCP server answers as structured content)."""
        return {"ok": self.ok, "name": self.name, "content": self.content, "data": self.data, "error": self.error}

    @classmethod
    def failure(cls, name: str, error: str) -> ActionResult:
        """A refused or failed action."""
        return cls(ok=False, name=name, content=f"error: {error}", data=None, error=error)


_Runner = Callable[["AgentMemory", Any], Awaitable[ActionResult]]


@dataclass(frozen=True, slots=True)
class _Action:
    name: str
    model: type[_Args]
    description: str
    run: _Runner


# ------------------------------------------------------------------ the actions
async def _write(memory: AgentMemory, a: MemoryWriteArgs) -> ActionResult:
    new_id = await memory.write(a.text, layer=a.layer, key=a.key, tags=a.tags, metadata=a.metadata, ttl=a.ttl,
                                confidence=a.confidence, importance=a.importance, board=a.board, kind=a.kind)
    where = f" key={a.key}" if a.key else ""
    return ActionResult(True, "memory_write", f"stored in {a.layer}: id={new_id}{where}",
                        {"id": new_id, "layer": a.layer, "key": a.key})


async def _read(memory: AgentMemory, a: MemoryReadArgs) -> ActionResult:
    hit = await memory.read(a.id, layer=a.layer, board=a.board)
    return ActionResult(True, "memory_read", _hit_line(hit, None, full=True), {"hit": hit_data(hit)})


async def _search(memory: AgentMemory, a: MemorySearchArgs) -> ActionResult:
    time_range = (a.since, a.until) if a.since is not None or a.until is not None else None
    hits = await memory.search(a.query, layers=a.layers, mode=a.mode, min_relevance=a.min_relevance,
                               time_range=time_range, filters=a.filters, top_k=a.top_k)
    if not hits:
        content = f"no memories found for {a.query!r}"
    else:
        content = f"{len(hits)} hit(s), best first:\n" + "\n".join(_hit_line(h, i) for i, h in enumerate(hits, 1))
    return ActionResult(True, "memory_search", content, {"hits": [hit_data(h) for h in hits]})


async def _summarize(memory: AgentMemory, a: MemorySummarizeArgs) -> ActionResult:
    result = await memory.summarize(layer=a.layer, query=a.query, ids=a.ids, strategy=a.strategy,
                                    target_tokens=a.target_tokens, keep_keys=a.keep_keys, board=a.board,
                                    replace=a.replace)
    data = _data(result)
    sources = data.get("source_ids") or []
    head = (f"summary of {len(sources)} item(s) of {a.layer} ({data.get('strategy', a.strategy)}, "
            f"{data.get('tokens', '?')} tokens)")
    if data.get("written_id"):
        head += f"; {len(data.get('replaced') or [])} replaced by id={data['written_id']}"
    return ActionResult(True, "memory_summarize", f"{head}:\n{data.get('text', '')}", data)


async def _prune(memory: AgentMemory, a: MemoryPruneArgs) -> ActionResult:
    result = await memory.prune(layer=a.layer, strategy=a.strategy, threshold=a.threshold, board=a.board,
                                scope=a.scope, dry_run=a.dry_run, limit=a.limit)
    data = _data(result)
    ids = [str(i) for i in data.get("ids") or ()]
    count = data.get("count", len(ids))
    verb = "would prune" if a.dry_run else "pruned"
    shown = ", ".join(ids[:20]) + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
    content = f"{verb} {count} from {a.layer} ({a.strategy}, scope {a.scope})" + (f": {shown}" if shown else "")
    return ActionResult(True, "memory_prune", content, data)


_ACTIONS: Final[dict[str, _Action]] = {a.name: a for a in (
    _Action("memory_write", MemoryWriteArgs, (
        "Store something in memory. short_term: a step of this episode; working: a note under a key "
        "(replaced by the next write of that key, gone after ttl); long_term: your long-term memory (any "
        "agent may recall it); shared: a board's long-term memory. Example: {\"text\": \"price is in "
        "span.price\", \"layer\": \"long_term\", \"key\": \"selector:price\", \"confidence\": 0.8}."), _write),
    _Action("memory_read", MemoryReadArgs, (
        "Read one memory by the id memory_search showed (or a working note by its key). "
        "Example: {\"id\": \"wm:goal\"}."), _read),
    _Action("memory_search", MemorySearchArgs, (
        "Search your memory across layers, best first; each hit shows its layer, score, id and where it "
        "comes from. Example: {\"query\": \"css selector for the price\", \"layers\": [\"long_term\", "
        "\"shared\"], \"min_relevance\": 0.3}."), _search),
    _Action("memory_summarize", MemorySummarizeArgs, (
        "Summarize a layer (or the items matching a query or the given ids), keeping the values of "
        "keep_keys verbatim; replace=true swaps the items for the summary. Example: {\"layer\": "
        "\"short_term\", \"target_tokens\": 200, \"keep_keys\": [\"goal\"]}."), _summarize),
    _Action("memory_prune", MemoryPruneArgs, (
        "Remove stale memories by a strategy (low_confidence, lru, old_age, importance, max_per_board). Only your own memories "
        "unless scope is 'all' (needs admin rights on the board). Use dry_run to see what would go. "
        "Example: {\"strategy\": \"low_confidence\", \"threshold\": 0.3, \"dry_run\": true}."), _prune),
)}

#: The memory actions' tool names, in :func:`memory_tools` order.
ACTION_NAMES: Final[tuple[str, ...]] = tuple(_ACTIONS)


def action_model(name: str) -> type[BaseModel]:
    """The argument model of the action ``name``.

    Raises:
        KeyError: no such action.
    """
    return _ACTIONS[name].model


def action_description(name: str) -> str:
    """The description of the action ``name`` (what the model reads).

    Raises:
        KeyError: no such action.
    """
    return _ACTIONS[name].description


def action_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of the action ``name``'s arguments (no titles; unknown fields refused).

    Raises:
        KeyError: no such action.
    """
    schema: dict[str, Any] = _untitled(_ACTIONS[name].model.model_json_schema())
    return schema


def memory_tools() -> list[dict[str, Any]]:
    """The OpenAI-compatible tool definitions of the memory actions
    (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""
    return [{"type": "function", "function": {"name": a.name, "description": a.description,
                                              "parameters": action_schema(a.name)}}
            for a in _ACTIONS.values()]


def parse_tool_call(tool_call: Any) -> tuple[str, Any]:
    """The tool's name and its raw arguments (a JSON string, a mapping or None) from a tool call:
    an OpenAI tool call (a dict or an SDK object with ``.function.name`` and
    ``.function.arguments``) or ``{"name": ..., "arguments": ...}``.

    Raises:
        ValueError: no tool name found.
    """
    fn: Any = tool_call.get("function") if isinstance(tool_call, Mapping) else getattr(tool_call, "function", None)
    source = fn if fn is not None else tool_call
    if isinstance(source, Mapping):
        name, arguments = source.get("name"), source.get("arguments")
    else:
        name, arguments = getattr(source, "name", None), getattr(source, "arguments", None)
    if not isinstance(name, str) or not name:
        raise ValueError("the tool call names no tool (expected .function.name or 'name')")
    return name, arguments


def _arguments(raw: Any) -> dict[str, Any]:
    """Raw tool call arguments as a JSON object (ValueError: not JSON, not an object)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"the arguments are not valid JSON ({exc})") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"the arguments must be a JSON object, not {type(raw).__name__}")
    return dict(raw)


async def call_action(memory: AgentMemory, tool_call: Any) -> ActionResult:
    """Validate and run one memory tool call against ``memory`` (an ``agent.memory``).

    ``tool_call``: an OpenAI tool call (dict or SDK object; ``function.arguments`` a JSON
    string) or ``{"name": ..., "arguments": {...}}``.

    Returns:
        The :class:`ActionResult`. An unknown tool, arguments that are not JSON or do not fit
        the tool's schema, a missing item and any blackboard error (a refused right:
        ``PermissionDeniedError``) are answered with ``ok=False`` and an error text naming
        the problem; nothing is written then.
    """
    try:
        name, raw = parse_tool_call(tool_call)
    except ValueError as exc:
        return ActionResult.failure("?", f"InvalidToolCall: {exc}")
    action = _ACTIONS.get(name)
    if action is None:
        return ActionResult.failure(name, f"UnknownTool: no memory tool {name!r} (tools: {', '.join(_ACTIONS)})")
    try:
        args = action.model.model_validate(_arguments(raw))
    except ValidationError as exc:
        return ActionResult.failure(name, f"InvalidArguments: {validation_text(exc)}")
    except ValueError as exc:
        return ActionResult.failure(name, f"InvalidArguments: {exc}")
    try:
        return await action.run(memory, args)
    except PermissionDeniedError as exc:
        return ActionResult.failure(name, f"PermissionDeniedError: {exc} (this action needs rights your "
                                          "identity lacks: act on your own memories, scope='own')")
    except NotFoundError as exc:
        return ActionResult.failure(name, f"NotFoundError: {exc}")
    except ValidationError as exc:
        return ActionResult.failure(name, f"InvalidArguments: {validation_text(exc)}")
    except (BlackboardError, ValueError) as exc:
        return ActionResult.failure(name, f"{type(exc).__name__}: {exc}")


def validation_text(exc: ValidationError) -> str:
    """``exc``'s errors in one line, ``field: problem; ...`` (the input is not echoed back)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())


# ------------------------------------------------------------------ rendering
def hit_data(hit: LayerHit) -> dict[str, Any]:
    """A hit as JSON."""
    return {"layer": hit.layer, "id": hit.id, "text": hit.text, "score": round(float(hit.score), 4),
            "kind": hit.kind, "source": hit.source, "provenance": _json(hit.provenance),
            "created_at": hit.created_at.isoformat() if hit.created_at is not None else None,
            "metadata": _json(hit.metadata)}


def _hit_line(hit: LayerHit, rank: int | None, *, full: bool = False) -> str:
    text = " ".join(hit.text.split())
    if not full and len(text) > TEXT_CHARS:
        text = text[:TEXT_CHARS - 1] + "…"
    head = f"{rank}. " if rank is not None else ""
    when = f" {hit.created_at:%Y-%m-%d %H:%M}" if hit.created_at is not None else ""
    return f"{head}[{hit.layer} {hit.score:.2f}] id={hit.id} ({hit.kind}, {hit.source}{when}): {text}"


def _data(result: Any) -> dict[str, Any]:
    """A facade result (its ``as_dict()``, a dataclass, a pydantic model or a mapping) as a JSON object."""
    as_dict = getattr(result, "as_dict", None)
    value = _json(as_dict() if callable(as_dict) else result)
    return value if isinstance(value, dict) else {"result": value}


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Sequence | set | frozenset):
        return [_json(v) for v in value]
    return str(value)


def _untitled(schema: Any) -> Any:
    """``schema`` without pydantic's ``title`` keys (noise for a model), keeping a property named title."""
    if isinstance(schema, dict):
        return {k: (_untitled_props(v) if k == "properties" else _untitled(v)) for k, v in schema.items()
                if k != "title"}
    if isinstance(schema, list):
        return [_untitled(v) for v in schema]
    return schema


def _untitled_props(props: Any) -> Any:
    return {k: _untitled(v) for k, v in props.items()} if isinstance(props, dict) else props
