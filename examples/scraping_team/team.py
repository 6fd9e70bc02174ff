"""Run the scraping team: three scouts extract the products of the example's shops, first
without memory (the baseline), then sharing what they learn through ``agent.memory``.

Each round every scout takes one product page of a different shop (round ``r``: scout
``i`` takes page ``r + 1`` of shop ``(i + r) % 3``), so each shop's layout is first met
by one scout and then by the two others. For every field of a page a scout:

1. recalls the team's selector patterns for that shop and field
   (``agent.memory.search(..., layers=["shared"], filters={"metadata": ...})``), best
   confidence first, and tries them;
2. if none works, tries the team's candidate selectors (``extract.CANDIDATES``) until one
   does, and shares it as a long-term pattern on the team's board:
   ``agent.memory.write(text, layer="long_term", board=team, key="selector:<shop>:<field>:<selector>",
   confidence=...)``; waits until it is searchable, so the next round finds it;
3. if a recalled pattern failed but another selector works, the two conflict: after the
   round the finder proposes a vote on ``selectors/<shop>.<field>`` (``board.propose``),
   each scout checks both candidates on two pages of its own choosing and votes
   (``board.vote``), the worker commits the winner to the board; the winner's pattern is
   confirmed (confidence 0.95), the loser's author demotes its pattern (0.1) and every
   scout prunes its own low-confidence patterns (``agent.memory.prune(strategy="low_confidence")``).

An *extraction step* is one selector tried on one page (the voters' checks count too).
The baseline extracts every page without memory: every field of every page is
discovered from the candidates again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_sdk import Agent, NotConnectedError, NotFoundError
from agents_sdk.memory import MemoryMetrics
from blackboard.protocol.errors import ProposalClosedError, VoteError
from blackboard.settings import Settings
from examples.scraping_team.extract import FIELDS, Discovery, Element, check, discover, parse_html
from examples.scraping_team.site import CATALOG, SHOPS, SiteServer, page_paths

__all__ = [
    "Conflict",
    "Pattern",
    "Scout",
    "ScrapeConfig",
    "ScrapeResult",
    "Transcript",
    "VoteReport",
    "run_baseline",
    "run_scraping_team",
    "scout_id",
    "vote_choice",
]

#: The board section where the team's votes on selectors are committed.
SELECTORS = "selectors"
#: The confidence of a pattern found on one page, of one confirmed by a vote, of one outvoted.
FOUND, CONFIRMED, OUTVOTED = 0.7, 0.95, 0.1
#: The scouts' names.
SCOUTS = ("scout-1", "scout-2", "scout-3")


def scout_id(team: str, name: str) -> str:
    """The agent id of one scout (``team-*`` ids are declared by the dev policy)."""
    return f"{team}-{name}"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def pattern_key(shop: str, field_name: str, selector: str) -> str:
    """The subject key of a pattern: one per selector, so two selectors of a field live side by side."""
    return f"selector:{shop}:{field_name}:{selector}"


def pattern_text(shop: str, field_name: str, selector: str, note: str = "") -> str:
    return (f"Selector pattern: the {field_name} of a product on {SHOPS[shop]} ({shop}) pages "
            f"is read with {selector}" + (f" ({note})" if note else ""))


# ------------------------------------------------------------------ transcript
@dataclass
class Transcript:
    """What the team did, one line per event."""

    echo: Callable[[str], None] | None = None
    lines: list[str] = field(default_factory=list)
    _t0: float = field(default_factory=time.monotonic)

    def log(self, who: str, text: str) -> None:
        line = f"{time.monotonic() - self._t0:7.3f}s  {who:<8} {text}"
        self.lines.append(line)
        if self.echo is not None:
            self.echo(line)


# --------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class Pattern:
    """A selector pattern recalled from the team's memory."""

    id: str
    shop: str
    field: str
    selector: str
    confidence: float
    author: str


@dataclass(frozen=True, slots=True)
class Conflict:
    """A recalled pattern failed on a page where another selector works."""

    shop: str
    field: str
    incumbent: Pattern
    challenger: str
    finder: str
    page: str


@dataclass
class VoteReport:
    """How a conflict was settled."""

    proposal_id: str
    shop: str
    field: str
    candidates: list[str]
    #: Each scout's choice (a candidate index) and whether its ballot was counted.
    ballots: dict[str, tuple[int, bool]]
    status: str
    winner: str | None
    #: The value of ``selectors/<shop>.<field>`` on the board after the vote.
    committed: Any = None


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Names and time limits of a run."""

    #: The team's name: its board and its scouts' id prefix (default ``team-<random>``).
    team: str | None = None
    #: Seconds the whole run may take.
    timeout: float = 120.0
    #: Seconds to wait for NATS when connecting each scout.
    connect_timeout: float = 10.0
    #: Seconds a shared pattern may take to become searchable, and a vote to be committed.
    step_timeout: float = 30.0
    #: Patterns below this confidence are pruned after a vote.
    prune_threshold: float = 0.3


@dataclass
class ScrapeResult:
    """What the run did and what it saved."""

    team: str
    steps_with_memory: int
    steps_without_memory: int
    #: Extraction steps per scout (with memory), the voters' checks included.
    steps_by_scout: dict[str, int]
    #: Page path -> field -> value (with memory).
    extracted: dict[str, dict[str, str | None]]
    #: Patterns shared (writes), memory searches made.
    shared: int
    searches: int
    #: Fields of pages where a recalled pattern gave the value at once.
    reused: int
    votes: list[VoteReport]
    #: Ids pruned by each scout.
    pruned: dict[str, list[str]]
    #: The selectors the team's memory holds for each (shop, field) at the end, best first.
    final_patterns: dict[str, list[str]]
    #: Each scout's ``agent.memory.metrics()`` at the end.
    metrics: dict[str, MemoryMetrics]
    transcript: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def saved(self) -> int:
        """Extraction steps memory saved."""
        return self.steps_without_memory - self.steps_with_memory

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """A few lines for people."""
        pct = 100.0 * self.saved / self.steps_without_memory if self.steps_without_memory else 0.0
        lines = [f"team {self.team}: {len(self.extracted)} product pages of {len(SHOPS)} shops, 3 scouts",
                 f"  extraction steps without memory: {self.steps_without_memory}",
                 f"  extraction steps with memory:    {self.steps_with_memory} "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(self.steps_by_scout.items()))}; "
                 f"{self.searches} memory searches, {self.shared} patterns written, {self.reused} fields read "
                 f"with a recalled pattern at the first try)"]
        for vote in self.votes:
            ballots = ", ".join(f"{k} -> {vote.candidates[c]}" + ("" if counted else " (late)")
                                for k, (c, counted) in sorted(vote.ballots.items()))
            lines.append(f"  vote {vote.proposal_id} on {vote.shop} {vote.field}: {vote.status}, "
                         f"winner {vote.winner} ({ballots})")
        lines.append("  pruned: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(self.pruned.items())))
        lines.append("  memory metrics: " + "; ".join(
            f"{k} search p50 {m.latency.p50:.1f} ms p99 {m.latency.p99:.1f} ms, {m.used}/{m.recalled} recalled "
            f"patterns used" for k, m in sorted(self.metrics.items())))
        for name, selectors in sorted(self.final_patterns.items()):
            lines.append(f"  patterns {name}: {', '.join(selectors)}")
        lines.append(f"memory saved {self.saved} extraction steps ({pct:.0f}%): "
                     f"{self.steps_with_memory} with memory, {self.steps_without_memory} without")
        lines.append("result: " + ("OK" if self.ok else "FAILED: " + "; ".join(self.problems)))
        return "\n".join(lines)


# ------------------------------------------------------------------ pure parts
def assignment(round_index: int) -> list[tuple[str, str]]:
    """``(scout name, page path)`` of one round: scout ``i`` takes page ``round + 1`` of
    shop ``(i + round) % 3``."""
    shops = list(SHOPS)
    return [(name, page_paths(shops[(i + round_index) % len(shops)])[round_index])
            for i, name in enumerate(SCOUTS)]


def vote_sample(scout_index: int, shop: str) -> list[str]:
    """The two pages of ``shop`` a scout checks the candidates of a vote on (its own pick)."""
    pages = page_paths(shop)
    return [pages[scout_index % len(pages)], pages[(scout_index + 1) % len(pages)]]


def vote_choice(scores: Sequence[int]) -> int:
    """The candidate that worked on most sampled pages; a tie goes to the incumbent (0)."""
    best = max(scores)
    return scores.index(best)


def run_baseline(pages: Mapping[str, Sequence[Element]]) -> tuple[int, dict[str, dict[str, str | None]]]:
    """Every page extracted without memory: (steps, page -> field -> value)."""
    steps = 0
    out: dict[str, dict[str, str | None]] = {}
    for path, elements in pages.items():
        found = [discover(elements, f) for f in FIELDS]
        steps += sum(d.steps for d in found)
        out[path] = {d.field: d.value for d in found}
    return steps, out


def fetch(url: str, timeout: float = 10.0) -> str:
    """GET ``url`` (the example's own site on 127.0.0.1)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


# ---------------------------------------------------------------------- scout
class Scout:
    """One agent of the team: extracts pages, shares and reuses selector patterns, votes."""

    def __init__(self, agent: Agent, name: str, index: int, team: str, site: SiteServer,
                 transcript: Transcript, config: ScrapeConfig) -> None:
        self.agent, self.name, self.index, self.team = agent, name, index, team
        self.site, self.transcript, self.config = site, transcript, config
        self.board = agent.board(team)
        self.steps = 0
        self.searches = 0
        self.shared = 0
        self.reused = 0
        self.extracted: dict[str, dict[str, str | None]] = {}
        self.pruned: list[str] = []
        self._pages: dict[str, list[Element]] = {}

    def say(self, text: str) -> None:
        self.transcript.log(self.name, text)

    async def page(self, path: str) -> list[Element]:
        if path not in self._pages:
            self._pages[path] = parse_html(await asyncio.to_thread(fetch, self.site.url(path)))
        return self._pages[path]

    async def recall(self, shop: str, field_name: str, *, count: bool = True) -> list[Pattern]:
        """The team's live patterns for ``(shop, field)``, best confidence first."""
        self.searches += count
        hits = await self.agent.memory.search(
            f"selector pattern {field_name} {SHOPS[shop]} {shop}", layers=["shared"], mode="hybrid",
            filters={"metadata": {"type": "selector", "shop": shop, "field": field_name}}, top_k=20)
        patterns = [Pattern(id=h.id, shop=shop, field=field_name, selector=str(h.metadata["selector"]),
                            confidence=float(h.provenance.get("confidence") or 0.0),
                            author=str(h.provenance.get("agent", "")))
                    for h in hits if h.metadata.get("selector")]
        return sorted(patterns, key=lambda p: (-p.confidence, p.selector))

    async def share(self, shop: str, field_name: str, selector: str, confidence: float, note: str = "") -> str:
        """Write (or rewrite: same key) a pattern on the team's board; returns once searchable."""
        mid = await self.agent.memory.write(
            pattern_text(shop, field_name, selector, note), layer="long_term", board=self.team, kind="procedural",
            key=pattern_key(shop, field_name, selector), confidence=confidence, tags=["selector", shop, field_name],
            metadata={"type": "selector", "shop": shop, "field": field_name, "selector": selector})
        await self.agent.wait_searchable([mid], board=self.team, timeout=self.config.step_timeout)
        self.shared += 1
        return mid

    async def scrape(self, path: str) -> list[Conflict]:
        """Extract the fields of one page; returns the conflicts it found."""
        shop = path.split("/")[1]
        elements = await self.page(path)
        conflicts: list[Conflict] = []
        values: dict[str, str | None] = {}
        notes: list[str] = []
        for field_name in FIELDS:
            known = await self.recall(shop, field_name)
            found: Discovery = discover(elements, field_name, [p.selector for p in known])
            self.steps += found.steps
            values[field_name] = found.value
            if found.selector is None:
                notes.append(f"{field_name}: nothing found in {_steps(found.steps)}")
            elif found.recalled:  # the team knows it already (behind a failing one when steps > 1)
                self.reused += found.steps == 1
                self.agent.memory.mark_used([p.id for p in known if p.selector == found.selector])
                notes.append(f"{field_name} {found.selector} (recalled, {_steps(found.steps)})")
            else:
                failed = [p for p in known if p.selector in found.tried and p.selector != found.selector]
                await self.share(shop, field_name, found.selector, FOUND)
                notes.append(f"{field_name} {found.selector} ({_steps(found.steps)}, shared)")
                if failed:
                    conflicts.append(Conflict(shop, field_name, failed[0], found.selector, self.name, path))
                    self.say(f"{path}: the team's {field_name} pattern {failed[0].selector} fails here; "
                             f"{found.selector} works: conflict")
        self.extracted[path] = values
        self.say(f"{path}: " + "; ".join(notes))
        return conflicts

    async def cast_vote(self, proposal_id: str, shop: str, field_name: str,
                        candidates: Sequence[str]) -> tuple[int, bool]:
        """Check every candidate on this scout's sample of ``shop``'s pages and vote."""
        sample = vote_sample(self.index, shop)
        scores = []
        for selector in candidates:
            works = 0
            for path in sample:
                self.steps += 1
                works += check(await self.page(path), field_name, selector) is not None
            scores.append(works)
        choice = vote_choice(scores)
        reason = f"{candidates[choice]} works on {scores[choice]} of {len(sample)} pages ({', '.join(sample)})"
        try:
            await self.board.vote(proposal_id, choice, reason=reason, index=True)
        except (ProposalClosedError, VoteError) as exc:
            self.say(f"votes for {candidates[choice]}: not counted ({type(exc).__name__}: the vote was decided)")
            return choice, False
        self.say(f"votes for {candidates[choice]}: {reason}")
        return choice, True

    async def prune(self) -> list[str]:
        """Prune this scout's own low-confidence patterns on the team's board."""
        result = await self.agent.memory.prune(layer="long_term", strategy="low_confidence",
                                               threshold=self.config.prune_threshold, board=self.team,
                                               scope="own")
        ids = list(result.ids)
        self.pruned += ids
        self.say(f"pruned {len(ids)} of its patterns below confidence {self.config.prune_threshold:g}"
                 + (f": {', '.join(ids)}" if ids else ""))
        return ids


# ------------------------------------------------------------------------ run
async def _settle(conflict: Conflict, scouts: Sequence[Scout], transcript: Transcript,
                  config: ScrapeConfig) -> VoteReport:
    by_name = {s.name: s for s in scouts}
    finder = by_name[conflict.finder]
    candidates = [conflict.incumbent.selector, conflict.challenger]
    key = f"{conflict.shop}.{conflict.field}"
    handle = await finder.board.propose(
        SELECTORS, key, candidates=candidates, voters=[s.agent.id for s in scouts],
        question=f"Which selector reads the {conflict.field} of {SHOPS[conflict.shop]} products?")
    finder.say(f"proposal {handle.id}: {conflict.shop} {conflict.field}, {' or '.join(candidates)}, "
               f"majority of {len(scouts)}")
    ballots = await asyncio.gather(*(s.cast_vote(handle.id, conflict.shop, conflict.field, candidates) for s in scouts))
    outcome = await handle.outcome(timeout=config.step_timeout)
    status = str(outcome.status)
    winner = outcome.value if status == "accepted" else None
    report = VoteReport(handle.id, conflict.shop, conflict.field, candidates,
                        {s.name: b for s, b in zip(scouts, ballots, strict=True)}, status,
                        str(winner) if winner is not None else None)
    with contextlib.suppress(NotFoundError):
        report.committed = (await finder.board.get(SELECTORS, key)).value
    transcript.log("team", f"proposal {handle.id} {status}: {winner}")
    if winner is None:
        return report
    # The winner's pattern is confirmed by whoever wrote it; the loser's author demotes its own.
    loser = candidates[1 - candidates.index(str(winner))]
    winner_author = finder if winner == conflict.challenger else _author(conflict.incumbent, scouts)
    loser_author = _author(conflict.incumbent, scouts) if loser == conflict.incumbent.selector else finder
    await winner_author.share(conflict.shop, conflict.field, str(winner), CONFIRMED, f"confirmed by vote {handle.id}")
    await loser_author.share(conflict.shop, conflict.field, loser, OUTVOTED, f"outvoted in vote {handle.id}")
    winner_author.say(f"confirmed {winner} (confidence {CONFIRMED})")
    loser_author.say(f"demoted {loser} (confidence {OUTVOTED})")
    return report


def _author(pattern: Pattern, scouts: Sequence[Scout]) -> Scout:
    return next(s for s in scouts if s.agent.id == pattern.author)


async def run_scraping_team(settings: Settings, config: ScrapeConfig = ScrapeConfig(), *,
                            echo: Callable[[str], None] | None = print) -> ScrapeResult:
    """Serve the shops, extract them without memory, then with the team's shared memory.

    Args:
        settings: where NATS is; the scouts' ``agent_memory`` is derived from it (the team's
            board is their shared layer).
        config: names and time limits.
        echo: called with each transcript line as it happens (None: quiet).

    Raises:
        TimeoutError: the run took longer than ``config.timeout``.
        NotConnectedError: NATS is unreachable (within ``config.connect_timeout``).
    """
    team = config.team or f"team-{uuid.uuid4().hex[:6]}"
    transcript = Transcript(echo=echo)
    # The team's board is each scout's long-term scope and its shared layer. No search cache: a
    # teammate's new pattern must be found at once (a scout's own writes clear only its own cache).
    memory = settings.agent_memory.model_copy(update={
        "shared_boards": [team], "long_term_board": team, "cache_ttl": 0.0, "auto_summarize": False,
        "auto_prune_interval": 0.0})
    scout_settings = settings.model_copy(update={"agent_memory": memory})
    with SiteServer() as site:
        pages = {path: parse_html(await asyncio.to_thread(fetch, site.url(path))) for path in page_paths()}
        baseline_steps, baseline = run_baseline(pages)
        transcript.log("team", f"without memory: {len(pages)} pages in {baseline_steps} extraction steps")
        async with contextlib.AsyncExitStack() as stack:
            scouts: list[Scout] = []
            for index, name in enumerate(SCOUTS):
                try:
                    agent = await asyncio.wait_for(stack.enter_async_context(
                        Agent.connect(scout_id(team, name), settings=scout_settings)), config.connect_timeout)
                except TimeoutError:
                    raise NotConnectedError(f"no NATS server answered at {settings.nats.url} within "
                                            f"{config.connect_timeout:g}s") from None
                scouts.append(Scout(agent, name, index, team, site, transcript, config))
            transcript.log("team", f"team {team} on {settings.nats.url}, site {site.base_url}")
            votes: list[VoteReport] = []
            by_name = {s.name: s for s in scouts}
            async with asyncio.timeout(config.timeout):
                for round_index in range(len(page_paths(next(iter(SHOPS))))):
                    found = await asyncio.gather(*(by_name[name].scrape(path)
                                                   for name, path in assignment(round_index)))
                    for conflict in (c for conflicts in found for c in conflicts):
                        votes.append(await _settle(conflict, scouts, transcript, config))
                        for scout in scouts:
                            await scout.prune()
            final = {f"{shop} {f}": [p.selector for p in await scouts[0].recall(shop, f, count=False)]
                     for shop in SHOPS for f in FIELDS}
            return _result(team, baseline_steps, baseline, scouts, votes, final, transcript)
    raise AssertionError("unreachable")  # pragma: no cover  (mypy: the exit stack may swallow)


def _result(team: str, baseline_steps: int, baseline: Mapping[str, Mapping[str, str | None]],
            scouts: Sequence[Scout], votes: list[VoteReport], final: dict[str, list[str]],
            transcript: Transcript) -> ScrapeResult:
    extracted = {path: values for s in scouts for path, values in s.extracted.items()}
    problems = []
    for product in CATALOG:
        for name, values in (("with memory", extracted), ("without memory", baseline)):
            got = dict(values.get(product.path, {}))
            if got != product.fields():
                problems.append(f"{product.path} {name}: {got} is not {product.fields()}")
    for vote in votes:
        if vote.status != "accepted":
            problems.append(f"the vote on {vote.shop} {vote.field} ended {vote.status}")
        elif vote.committed != vote.winner:
            problems.append(f"the vote's winner {vote.winner} is not on the board ({vote.committed!r})")
    for name, selectors in final.items():
        if len(selectors) != 1:
            problems.append(f"{name}: {len(selectors)} patterns left, expected one")
    result = ScrapeResult(
        team=team, steps_with_memory=sum(s.steps for s in scouts), steps_without_memory=baseline_steps,
        steps_by_scout={s.name: s.steps for s in scouts}, extracted=extracted,
        shared=sum(s.shared for s in scouts), searches=sum(s.searches for s in scouts),
        reused=sum(s.reused for s in scouts), votes=votes, pruned={s.name: list(s.pruned) for s in scouts},
        final_patterns=final, metrics={s.name: s.agent.memory.metrics() for s in scouts},
        transcript=list(transcript.lines), problems=problems)
    if result.saved <= 0:
        problems.append(f"memory saved nothing ({result.saved} steps)")
    return result
