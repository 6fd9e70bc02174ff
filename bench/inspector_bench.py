"""Inspector benchmark: the page in a real headless Chromium, each figure next to the layer under
it, in one run.

On a nats-server and PostgreSQL it starts itself (authorization and TLS as ``blackboard dev``
runs them), with a worker (its system service lists the boards an identity may read), a writer
fills one board with ``--entries`` entries (default 10,000, in 20 sections); ``blackboard
inspect``'s server (:func:`blackboard.apps.inspect.app.running_inspector`, as a reader identity)
serves the page to Debian's ``/usr/bin/chromium`` driven by Playwright (no browser download).

* **Time to first render**: a fresh page opened on the board, until its first page of entries
  is on screen (``window.__inspector.firstRender``: ``performance.now()`` when the rows were
  drawn, so from the navigation's start: the HTML, the script, whoami, boards, the first page
  of 200 entries, the DOM). Cold: the first open, when the inspector does not hold the board's
  live view yet (the inspectors here start with ``warm=False``, while ``blackboard inspect``
  opens the readable boards in the background from its start): the first pages come from the
  board's key listing (headers only) with the page's entries read and verified, while the view
  loads in the background (its time is printed too: what a cold open waited for before); warm:
  later opens, over ``--rounds``. Next to it,
  the raw layer: the API call alone (``GET /api/boards/{board}/entries?limit=200`` by an HTTP
  client, cold on a second inspector that never opened the board, and warm).
* **Live-update latency**: an SDK ``put`` by the writer, from just before the call until the
  changed row is in the page's DOM (``window.__inspector.applied``, ``Date.now()``; the same
  clock as Python's ``time.time()``), for ``--updates`` writes spaced ``--gap`` apart. Next to
  it, the raw layer: the KV watch alone (an SDK ``board.watch`` of a second agent in this
  process, the same writes, timed from the same instant).

The issue's targets: a 10,000-entry board opens in under a second; a live change shows in
under 200 ms.

Run: ``python bench/inspector_bench.py`` (about a minute on 2 cores); a smoke run:
``python bench/inspector_bench.py --entries 2000 --rounds 2 --updates 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import platform
import sys
import time
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal, overload

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2

from agents_sdk import Agent
from bench._common import Table, add_bus_option, embedded_stack, median, percentile
from blackboard.apps.inspect.app import InspectorServer, running_inspector
from blackboard.settings import WorkerSettings
from blackboard.worker import Worker

CHROMIUM = Path("/usr/bin/chromium")
#: Chromium's flags on a closed network (../.library/env/machines/python.md, "Known to work").
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
BOARD = "bench-inspect"
SECTIONS = 20
PAGE_URL = "/api/boards/{board}/entries?limit=200"


async def fill(agent: Agent, n: int) -> None:
    """``n`` entries on :data:`BOARD`, in :data:`SECTIONS` sections, pipelined."""
    board = agent.board(BOARD)
    for start in range(0, n, 500):
        async with board.pipeline() as pipe:
            for i in range(start, min(n, start + 500)):
                await pipe.put(f"s{i % SECTIONS:02d}", f"item-{i:06d}",
                               {"n": i, "title": f"entry number {i}", "tags": ["bench", f"group-{i % 7}"],
                                "done": i % 3 == 0})


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def first_render(browser: Any, server: InspectorServer) -> tuple[float, float, int]:
    """One fresh page opened on the board: seconds from its navigation's start until the first
    page of entries was drawn, until the page's shell was ready (HTML, CSS and script loaded and
    run: ``domContentLoadedEventEnd``, before any API call answered), and how many rows the DOM
    holds then (the list is virtualised)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        await page.goto(f"{server.url}#board={BOARD}")
        await page.wait_for_function("window.__inspector && window.__inspector.firstRender !== null",
                                     timeout=60_000)
        ms = await page.evaluate("window.__inspector.firstRender")
        shell = await page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
        rows = await page.evaluate("document.querySelectorAll('#entries [data-key]').length")
        return float(ms) / 1000, float(shell) / 1000, int(rows)
    finally:
        await context.close()


@overload
async def api_page(server: InspectorServer) -> float: ...
@overload
async def api_page(server: InspectorServer, *, source: Literal[True]) -> tuple[float, str]: ...
async def api_page(server: InspectorServer, *, source: bool = False) -> float | tuple[float, str]:
    """Seconds for the first page of entries through the API alone (a new HTTP connection), and
    with ``source`` what answered it (``listing``: the board's view was not loaded yet)."""
    async with httpx2.AsyncClient(base_url=server.url.rstrip("/"), timeout=60) as client:
        t0 = time.perf_counter()
        response = await client.get(PAGE_URL.format(board=BOARD))
        response.raise_for_status()
        page = response.json()
        seconds = time.perf_counter() - t0
        return (seconds, str(page.get("source"))) if source else seconds


async def view_loaded(server: InspectorServer, t0: float) -> float:
    """Seconds from ``t0`` until the inspector holds the board's live view (loaded in the
    background after a cold first page; what a cold open waited for before)."""
    for _ in range(60_000):  # at most 10 minutes
        if server.inspector.feeds.opened(BOARD) is not None:
            break
        await asyncio.sleep(0.01)
    return time.perf_counter() - t0


async def live_updates(browser: Any, server: InspectorServer, writer: Agent, watcher: Agent,
                       count: int, gap: float) -> tuple[list[float], list[float]]:
    """``count`` puts by ``writer``: seconds from each put's start until its row is in the page's
    DOM, and until ``watcher``'s KV watch delivered it."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    dom: list[float] = []
    raw: list[float] = []
    try:
        page = await context.new_page()
        await page.goto(f"{server.url}#board={BOARD}&section=live")
        await page.wait_for_function("document.querySelector('#live').classList.contains('on')", timeout=60_000)
        board = writer.board(BOARD)
        async with watcher.board(BOARD).watch("live") as watch:
            for i in range(count):
                key = f"update-{i:04d}"
                started = time.time()
                await board.put("live", key, {"i": i, "at": started})
                while True:
                    change = await watch.next(timeout=30)
                    if change.entry.key == key:
                        raw.append(time.time() - started)
                        break
                handle = await page.wait_for_function(
                    f"window.__inspector.applied['live/{key}'] && window.__inspector.applied['live/{key}'].at",
                    timeout=30_000)
                dom.append(float(await handle.json_value()) / 1000 - started)
                await asyncio.sleep(gap)
    finally:
        await context.close()
    return dom, raw


async def run(args: argparse.Namespace) -> int:
    if not CHROMIUM.exists():
        print(f"inspector_bench: {CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    async with embedded_stack("bb-inspect-bench-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(name="inspectbench", embed=False, lag_interval=600)
                              ) as (settings, bus, _pg):
        print(f"inspector_bench: {bus.label}; {args.entries:,} entries, {args.rounds} rounds, "
              f"{args.updates} live updates")
        async with Worker(settings), Agent.connect("bench-writer", settings=settings) as writer, \
                Agent.connect("bench-watcher", settings=settings) as watcher:
            t0 = time.perf_counter()
            await fill(writer, args.entries)
            print(f"  filled the board in {time.perf_counter() - t0:.1f} s")
            async with chromium() as browser, \
                    running_inspector(settings, "bench-viewer", port=0, warm=False) as server, \
                    running_inspector(settings, "bench-viewer2", port=0, warm=False) as second:
                t0 = time.perf_counter()
                cold_page, _, rows = await first_render(browser, server)
                page_view = await view_loaded(server, t0)
                t0 = time.perf_counter()
                cold_api, source = await api_page(second, source=True)
                api_view = await view_loaded(second, t0)
                warm_page: list[float] = []
                warm_shell: list[float] = []
                warm_api: list[float] = []
                for _ in range(args.rounds):
                    seconds, shell, rows = await first_render(browser, server)
                    warm_page.append(seconds)
                    warm_shell.append(shell)
                    warm_api.append(await api_page(server))
                dom, raw = await live_updates(browser, server, writer, watcher, args.updates, args.gap)
    table = Table(f"inspector_bench, {bus.label}, {args.entries:,} entries (medians; ratio = page / raw layer)",
                  measured_label="page", baseline_label="raw layer")
    table.add("first render, cold (board not loaded yet)", cold_page, cold_api, "ms",
              note=f"raw: the first API page on an inspector that never opened the board (source: {source})")
    table.add("  the board's view loaded meanwhile", page_view, api_view, "ms",
              note="in the background, from the navigation's / the API call's start (then source: view)")
    table.add("first render, warm", median(warm_page), median(warm_api), "ms",
              note=f"raw: GET {PAGE_URL.format(board='…')}; {rows} rows in the DOM")
    table.add("  of which the page's shell", median(warm_shell), math.nan, "ms",
              note="HTML, CSS and script loaded and run, before any data (Chromium's own cost)")
    table.add("live update p50, SDK put -> DOM", percentile(dom, 50), percentile(raw, 50), "ms",
              note="raw: the KV watch alone (board.watch), same puts")
    table.add("live update p99", percentile(dom, 99), percentile(raw, 99), "ms")
    print(table.render())
    worst_open = max([cold_page, *warm_page])
    print(f"targets: a {args.entries:,}-entry board opens in under 1 s: "
          f"{'ok' if worst_open < 1 else 'MISS'} (cold, its first pages from the key listing while its view "
          f"loads: {cold_page * 1000:,.0f} ms; slowest warm open {max(warm_page) * 1000:,.0f} ms); "
          f"a live change shows in under 200 ms: {'ok' if percentile(dom, 99) < 0.2 else 'MISS'} "
          f"(p99 {percentile(dom, 99) * 1000:,.0f} ms)")
    print(f"python {platform.python_version()}, playwright {version('playwright')}, {platform.machine()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000, help="entries on the board (default 10,000)")
    parser.add_argument("--rounds", type=int, default=5, help="warm opens of the page (default 5)")
    parser.add_argument("--updates", type=int, default=50, help="live updates timed (default 50)")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between live updates (default 0.05)")
    add_bus_option(parser)
    args = parser.parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
