"""The inspector's page in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright; no browser is downloaded), against the inspector served on a free port and the
session's servers: the page loads, an entry an SDK agent writes appears without a reload (and a
change and a delete are marked), history shows the revisions with a diff, the as-of slider shows
the board at an older revision, a vote's tally moves as ballots arrive and shows the outcome, a
search shows its hits, and an identity without rights to a board does not see it.

The screenshots of the README (``docs/images/inspector-*.png``) are saved by these tests: into
``$BLACKBOARD_SCREENSHOTS_DIR`` when set (``BLACKBOARD_SCREENSHOTS_DIR=docs/images`` renews the
README's), else into a temporary directory, so a test run leaves the tree as it was.

Debian's chromium must be installed (``scripts/test`` installs it): without it these tests fail
with the reason, they do not skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright import async_api as playwright_api

from agents_sdk import Agent
from blackboard.apps.inspect.app import InspectorServer, running_inspector
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker, board_memories_handler, worker_settings

#: Debian's Chromium (``apt-get install chromium``; scripts/test installs it).
CHROMIUM = Path("/usr/bin/chromium")
#: The flags a closed network needs (../.library/env/machines/python.md, "Known to work").
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
IMAGES = Path(os.environ.get("BLACKBOARD_SCREENSHOTS_DIR")
              or Path(tempfile.gettempdir()) / "blackboard-inspector-screenshots")
#: How long the page may take to show what a test waits for (a live change takes well under 1 s).
WAIT_MS = 15_000

pytestmark = [pytest.mark.asyncio]


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Any]:
    if not CHROMIUM.exists() or shutil.which(str(CHROMIUM)) is None:
        pytest.fail(f"Debian's chromium is not at {CHROMIUM}: install it (apt-get install chromium; "
                    "scripts/test does) to run the inspector's browser tests")
    async with playwright_api.async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


@contextlib.asynccontextmanager
async def opened(browser: Any, server: InspectorServer, fragment: str = "") -> AsyncIterator[Any]:
    """A new page of the inspector (1280×800), ``#fragment`` in its address, closed after."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        await page.goto(server.url + (f"#{fragment}" if fragment else ""))
        yield page
        assert not errors, errors  # no uncaught exception in the page's script
    finally:
        await context.close()


async def lister(pg_settings: Settings, unique: str, start_worker: StartWorker) -> Settings:
    """A worker of this test's own: with a credential, the system service it runs lists the boards
    an identity may read (``agent.boards()``), which the inspector's board list is."""
    settings = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02)
    await start_worker(settings, embed=False)
    return settings


def row(page: Any, section: str, key: str) -> Any:
    return page.locator(f'#entries [data-key="{section}/{key}"]')


async def shot(page: Any, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(IMAGES / f"inspector-{name}.png"))


def png(width: int, height: int) -> bytes:
    """A small PNG (a colour gradient), for an image entry in the object store."""
    rows = b"".join(b"\x00" + b"".join(bytes((x * 255 // width, y * 255 // height, 160))
                                       for x in range(width)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


async def test_entries_appear_live_with_history_diff_and_as_of(pg_settings: Settings, unique: str, browser: Any,
                                                               start_worker: StartWorker) -> None:
    settings = await lister(pg_settings, unique, start_worker)
    async with Agent.connect(f"planner-{unique}", settings=settings) as alice:
        board = alice.board(unique)
        first = await board.put("facts", "capital", "Lyon", tags=["geo"])
        await board.put("facts", "population", {"paris": 2_102_650, "districts": 20,
                                                "sources": ["insee", "wikipedia"]}, metadata={"year": 2023})
        await board.put("notes", "plan", "1. collect facts\n2. vote on the capital\n3. write the report")
        await board.put("tasks", "t-001", {"title": "collect facts", "owner": "researcher", "done": True})
        await board.put("tasks", "t-002", {"title": "write the report", "owner": "writer", "done": False})
        await board.attach("assets", "chart", png(160, 90), content_type="image/png")
        second = await board.put("facts", "capital", "Paris", tags=["geo", "checked"])

        async with running_inspector(settings, f"viewer-{unique}", port=0) as server, \
                opened(browser, server, f"board={unique}") as page:
            await row(page, "facts", "capital").wait_for(timeout=WAIT_MS)
            assert await page.locator("#whoami").inner_text() == f"viewer-{unique}"
            assert unique in await page.locator("#boards").inner_text()
            await page.wait_for_function("document.querySelector('#live').classList.contains('on')",
                                         timeout=WAIT_MS)

            # Written by the SDK while the page is open: appears (and is marked new) without a reload.
            await board.put("facts", "mayor", "Anne Hidalgo", tags=["people"])
            mayor = row(page, "facts", "mayor")
            await mayor.wait_for(timeout=WAIT_MS)
            assert await mayor.get_attribute("data-mark") == "new"
            await board.put("tasks", "t-002", {"title": "write the report", "owner": "writer", "done": True})
            await page.wait_for_selector('#entries [data-key="tasks/t-002"][data-mark="changed"]', timeout=WAIT_MS)
            await board.delete("tasks", "t-001")
            await page.wait_for_selector('#entries [data-key="tasks/t-001"][data-mark="deleted"]', timeout=WAIT_MS)
            assert await page.evaluate("location.hash") == f"#board={unique}"  # never reloaded

            # History: both revisions, the diff between them, the current value.
            await row(page, "facts", "capital").click()
            history = page.locator('[data-testid="history-row"]')
            await history.nth(1).wait_for(timeout=WAIT_MS)
            assert await history.count() == 2
            assert [int(r) for r in await history.evaluate_all("rows => rows.map(r => r.dataset.revision)")] \
                == [second, first]
            diff = await page.locator('[data-testid="diff"]').inner_text()
            assert "- Lyon" in diff and "+ Paris" in diff
            assert await page.locator('[data-testid="detail"] [data-testid="value"]').inner_text() == "Paris"
            await shot(page, "board")

            # As of the revision before the capital's second: its old value, the task deleted
            # since, not the mayor written since.
            await page.evaluate("""(rev) => { const s = document.querySelector('#asof');
                                              s.value = String(rev); s.dispatchEvent(new Event('change')); }""",
                                second - 1)
            await page.wait_for_function("document.body.classList.contains('asof')", timeout=WAIT_MS)
            capital = row(page, "facts", "capital")
            await page.wait_for_selector(f'#entries [data-key="facts/capital"][data-revision="{first}"]',
                                         timeout=WAIT_MS)
            assert "Lyon" in await capital.inner_text()
            assert await row(page, "facts", "mayor").count() == 0
            assert await row(page, "tasks", "t-001").count() == 1
            shown = await page.locator("#asof-value").inner_text()  # the last revision of the board then
            assert shown.startswith("rev ") and first < int(shown[4:]) < second
            await capital.click()
            await page.wait_for_function(
                "document.querySelector('#detail [data-testid=value]')?.textContent === 'Lyon'", timeout=WAIT_MS)
            await shot(page, "asof")

            # Back to live; the image entry renders from the object store.
            await page.locator("#asof-live").click()
            await page.wait_for_function("!document.body.classList.contains('asof')", timeout=WAIT_MS)
            await row(page, "assets", "chart").click()
            image = page.locator('[data-testid="detail"] img')
            await image.wait_for(timeout=WAIT_MS)
            await page.wait_for_function("document.querySelector('#detail img').naturalWidth === 160",
                                         timeout=WAIT_MS)


async def test_a_vote_tally_moves_as_ballots_arrive_and_shows_the_outcome(pg_settings: Settings, unique: str,
                                                                          browser: Any,
                                                                          start_worker: StartWorker) -> None:
    settings = await lister(pg_settings, unique, start_worker)
    ids = [f"{name}-{unique}" for name in ("chair", "ana", "ben", "cy")]
    async with Agent.connect(ids[0], settings=settings) as chair, \
            Agent.connect(ids[1], settings=settings) as ana, \
            Agent.connect(ids[2], settings=settings) as ben, \
            Agent.connect(ids[3], settings=settings) as cy:
        await chair.board(unique).put("facts", "capital", "Lyon")
        proposal = await chair.board(unique).propose("facts", "capital", ["Paris", "Lyon", "Marseille"],
                                                     voters=ids[1:], question="What is the capital of France?")
        async with running_inspector(settings, f"viewer-{unique}", port=0) as server, \
                opened(browser, server, f"board={unique}&tab=votes") as page:
            card = page.locator(f'[data-testid="proposal"][data-id="{proposal.id}"]')
            await card.wait_for(timeout=WAIT_MS)
            await page.wait_for_function("document.querySelector('#live').classList.contains('on')",
                                         timeout=WAIT_MS)
            paris = card.locator('.bar[data-choice="Paris"] [data-testid="tally-count"]')
            assert await paris.inner_text() == "0"
            assert await card.locator('[data-testid="outcome-open"]').count() == 1

            await ana.board(unique).vote(proposal.id, "Paris", reason="the atlas says so")
            await page.wait_for_function(
                f"""() => {{ const c = document.querySelector('[data-id="{proposal.id}"] .bar[data-choice="Paris"] .num');
                             return c && c.textContent === '1'; }}""", timeout=WAIT_MS)
            assert "the atlas says so" in await card.locator('[data-testid="ballots"]').inner_text()
            await ben.board(unique).vote(proposal.id, "Lyon", reason="it was, once")
            await page.wait_for_function(
                f"""() => {{ const c = document.querySelector('[data-id="{proposal.id}"] .bar[data-choice="Lyon"] .num');
                             return c && c.textContent === '1'; }}""", timeout=WAIT_MS)
            await cy.board(unique).vote(proposal.id, "Paris")
            outcome = card.locator('[data-testid="outcome"]')
            await outcome.wait_for(timeout=WAIT_MS)
            assert "accepted: Paris" in await outcome.inner_text()
            await page.locator('[data-testid="committed-entry"]').wait_for(timeout=WAIT_MS)
            assert await paris.inner_text() == "2"
            await shot(page, "votes")


async def test_a_search_shows_its_hits_with_scores_and_a_memory(pg_settings: Settings, unique: str, browser: Any,
                                                                start_worker: StartWorker) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(),
                                handlers=[board_memories_handler(pg_settings, unique)])
    async with Agent.connect(f"researcher-{unique}", settings=pg_settings) as alice:
        await alice.board(unique).put("notes", "topic", "the harbour")  # a board with an entry is listed
        ids = [await alice.remember(text, kind="semantic", board=unique, tags=tags)
               for text, tags in (("the harbour crane lifts forty tonnes", ["port", "equipment"]),
                                  ("the harbour closes at midnight on sundays", ["port"]),
                                  ("bread is baked at dawn", ["bakery"]))]
        await alice.wait_searchable(ids, board=unique)
    await worker.wait_caught_up(60, embedded=True)
    async with running_inspector(pg_settings, f"viewer-{unique}", port=0) as server, \
            opened(browser, server, f"board={unique}&tab=search") as page:
        await page.locator('[data-testid="search-query"]').fill("harbour crane")
        await page.locator('[data-testid="search-mode"]').select_option("keyword")
        await page.locator('[data-testid="search-go"]').click()
        hits = page.locator('[data-testid="hit"]')
        await hits.first.wait_for(timeout=WAIT_MS)
        assert await hits.first.get_attribute("data-id") == ids[0]
        assert "harbour crane" in await hits.first.inner_text()
        found = set(await hits.evaluate_all("hs => hs.map(h => h.dataset.id)"))
        assert ids[2] not in found
        await hits.first.click()
        detail = page.locator('[data-testid="memory-detail"]')
        await detail.wait_for(timeout=WAIT_MS)
        assert "forty tonnes" in await detail.inner_text()
        await shot(page, "search")


async def test_an_identity_without_rights_does_not_see_the_board(pg_settings: Settings, unique: str, browser: Any,
                                                                 start_worker: StartWorker) -> None:
    settings = await lister(pg_settings, unique, start_worker)
    async with Agent.connect(f"owner-{unique}", settings=settings) as owner:
        await owner.board(unique).put("secrets", "plan", "not for outsiders")
        async with running_inspector(settings, f"outsider-{unique}", port=0) as server, \
                opened(browser, server, f"board={unique}") as page:
            await page.wait_for_function("document.querySelector('#whoami').textContent.startsWith('outsider-')",
                                         timeout=WAIT_MS)
            await page.wait_for_function(  # the board asked for is refused
                "document.querySelector('#error').textContent.includes('not readable')", timeout=WAIT_MS)
            assert unique not in await page.locator("#boards").inner_text()
            assert await page.locator("#entries [data-key]").count() == 0
            status = await page.evaluate(f"fetch('/api/boards/{unique}/entries').then(r => r.status)")
            assert status == 403
        # The owner's own inspector lists it (the board exists and is readable to a member).
        async with running_inspector(settings, f"member-{unique}", port=0) as server, \
                opened(browser, server, f"board={unique}") as page:
            await row(page, "secrets", "plan").wait_for(timeout=WAIT_MS)
            assert unique in await page.locator("#boards").inner_text()


async def test_the_messages_timeline_filters_by_agent_and_type_and_the_system_panel(
        pg_settings: Settings, unique: str, browser: Any, start_worker: StartWorker) -> None:
    settings = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02)
    worker = await start_worker(settings, embed=False)
    viewer, ana, ben = (f"{name}-{unique}" for name in ("lead", "ana", "ben"))
    async with Agent.connect(ana, settings=settings) as a, Agent.connect(ben, settings=settings) as b:
        await a.board(unique).put("tasks", "t-001", {"title": "collect facts"})
        await a.send(viewer, "task.done", {"task": "t-001", "summary": "12 facts collected"})
        await b.send(viewer, "question", {"text": "which sources count?"})
        await a.board(unique).broadcast("status", {"text": "starting the report"})
    await worker.wait_caught_up(60)
    async with running_inspector(settings, viewer, port=0) as server, \
            opened(browser, server, f"board={unique}&tab=messages") as page:
        messages = page.locator('[data-testid="message"]')
        await page.wait_for_function("document.querySelectorAll('[data-testid=message]').length === 3",
                                     timeout=WAIT_MS)
        text = await page.locator("#messages").inner_text()
        assert "12 facts collected" in text and "which sources count?" in text and "starting the report" in text
        await shot(page, "messages")

        await page.locator('[data-testid="msg-agent"]').fill(ana)
        await page.locator('[data-testid="msg-refresh"]').click()
        await page.wait_for_function("document.querySelectorAll('[data-testid=message]').length === 2",
                                     timeout=WAIT_MS)
        assert sorted(await messages.evaluate_all("ms => ms.map(m => m.dataset.type)")) == ["status", "task.done"]
        await page.locator('[data-testid="msg-type"]').fill("status")
        await page.locator('[data-testid="msg-refresh"]').click()
        await page.wait_for_function("document.querySelectorAll('[data-testid=message]').length === 1",
                                     timeout=WAIT_MS)
        assert "starting the report" in await messages.first.inner_text()

        await page.locator('#tabs button[data-tab="system"]').click()
        servers = page.locator('[data-testid="system-servers"]')
        await servers.wait_for(timeout=WAIT_MS)
        assert "connected" in await servers.inner_text()
        await page.locator('[data-testid="system-worker_lag"]').wait_for(timeout=WAIT_MS)
        await shot(page, "system")


async def test_a_long_board_is_paged_virtualised_and_filtered(pg_settings: Settings, unique: str, browser: Any,
                                                              start_worker: StartWorker) -> None:
    settings = await lister(pg_settings, unique, start_worker)
    async with Agent.connect(f"filler-{unique}", settings=settings) as filler:
        async with filler.board(unique).pipeline() as pipe:
            for i in range(450):
                await pipe.put("items" if i % 3 else "other", f"k{i:04d}", {"n": i})
        async with running_inspector(settings, f"viewer-{unique}", port=0) as server, \
                opened(browser, server, f"board={unique}") as page:
            count = page.locator('[data-testid="count"]')
            await page.wait_for_function("document.querySelector('#count').textContent === '200 of 450 entries'",
                                         timeout=WAIT_MS)
            in_dom = await page.locator("#entries [data-key]").count()
            assert 0 < in_dom < 100  # only the rows in view (and a margin) are drawn
            # Scrolling to the end fetches the next pages.
            for _ in range(20):
                await page.evaluate("document.querySelector('#entries').scrollTop = 1e9")
                if await count.inner_text() == "450 of 450 entries":
                    break
                await page.wait_for_timeout(200)
            assert await count.inner_text() == "450 of 450 entries"
            await page.evaluate("document.querySelector('#entries').scrollTop = 1e9")
            await row(page, "other", "k0447").wait_for(timeout=WAIT_MS)  # the last in (section, key) order
            assert await page.locator("#entries [data-key]").count() < 100

            await page.locator('#sections [data-section="other"]').click()
            await page.wait_for_function("document.querySelector('#count').textContent === '150 of 150 entries'",
                                         timeout=WAIT_MS)
            assert "section=other" in await page.evaluate("location.hash")
            await page.locator('[data-testid="prefix"]').fill("k001")
            await page.wait_for_function("document.querySelector('#count').textContent === '3 of 3 entries'",
                                         timeout=WAIT_MS)
            keys = await page.locator("#entries [data-key]").evaluate_all("rs => rs.map(r => r.dataset.key)")
            assert keys == ["other/k0012", "other/k0015", "other/k0018"]
