"""The scraping team (examples/scraping_team) runs to completion against the suite's real
servers and a worker (search, embeddings, vote commits, prune), in process and as a
command, and prints what memory saved; its pure parts (the selector language, field
checks, discovery, the baseline, the schedule and the ballots) have unit tests here.

The scouts' ids are ``team-<unique>-scout-<n>``: the test authority issues them their
credentials on first use, as the dev authority does for the ``team-*`` glob of the dev
policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agents_sdk import Agent
from blackboard.devstack import EmbeddedNats
from blackboard.settings import Settings
from examples.scraping_team import (
    CANDIDATES,
    CATALOG,
    FIELDS,
    ScrapeConfig,
    SiteServer,
    run_scraping_team,
)
from examples.scraping_team.extract import check, discover, parse_html, parse_selector, select
from examples.scraping_team.site import page_paths, render
from examples.scraping_team.team import assignment, fetch, run_baseline, vote_choice, vote_sample
from tests._auth import TestAuth
from tests._worker_helpers import HashProvider, StartWorker

ROOT = Path(__file__).resolve().parents[2]
META_PRICE = "meta[itemprop=price]@content"


# ------------------------------------------------------------------ pure parts
def test_selectors_read_text_classes_ids_attributes_and_attribute_values() -> None:
    page = parse_html('<div class="a b"><h1 id="x">Hello <b>big</b>\n world</h1>\n<p class="b">two</p>\n'
                      '<meta itemprop="price" content="12.50"><td data-field="sku">AB-123</td></div>')
    assert select(page, "h1") == "Hello big world"  # descendants' text, spaces normalised
    assert select(page, "h1#x") == select(page, "#x") == "Hello big world"
    assert select(page, ".b") == "Hello big world two AB-123"  # the first match in document order: the div
    assert select(page, "p.b") == "two"
    assert select(page, "div.a.b") is not None and select(page, "div.a.c") is None
    assert select(page, "meta[itemprop=price]@content") == "12.50"
    assert select(page, "td[data-field=sku]") == "AB-123"
    assert select(page, "span") is None
    with pytest.raises(ValueError):
        parse_selector("div > p")
    with pytest.raises(ValueError):
        parse_selector("@content")


def test_field_checks_accept_and_normalise_only_plausible_values() -> None:
    page = parse_html('<span class="p1">$24.00</span><span class="p2">19.50 USD</span><span class="p3">call us</span>'
                      '<span class="s1">AL-1001</span><span class="s2">al 1001</span><h1>$9.99</h1><h2>Desk Lamp</h2>')
    assert check(page, "price", "span.p1") == "24.00"
    assert check(page, "price", "span.p2") == "19.50"
    assert check(page, "price", "span.p3") is None
    assert check(page, "sku", "span.s1") == "AL-1001"
    assert check(page, "sku", "span.s2") is None
    assert check(page, "name", "h1") is None  # a price is not a name
    assert check(page, "name", "h2") == "Desk Lamp"


def test_discovery_tries_recalled_patterns_first_then_the_candidates_in_order() -> None:
    page = parse_html(render("/shop-a/p1.html") or "")
    found = discover(page, "price")
    assert found.selector == "span.amount" and found.value == "24.00" and not found.recalled
    assert found.tried == CANDIDATES["price"][:4] and found.steps == 4
    reused = discover(page, "price", ["span.amount"])
    assert reused.steps == 1 and reused.recalled and reused.value == "24.00"
    # a recalled pattern that fails costs its step, and is not tried again among the candidates
    wrong = discover(page, "price", ["div.cost"])
    assert wrong.tried == ("div.cost", "span.price", "div.price", "span.amount") and not wrong.recalled
    assert discover(parse_html("<p>nothing</p>"), "sku").selector is None


def test_every_page_of_the_site_is_extracted_correctly_without_memory() -> None:
    pages = {path: parse_html(render(path) or "") for path in page_paths()}
    steps, values = run_baseline(pages)
    assert values == {p.path: p.fields() for p in CATALOG}
    assert steps == 112  # 4 x 11 (shop-a) + 4 x 8 (shop-b) + 2 x 7 + 2 x 11 (shop-c: sale pages cost more)
    # a sale page of shop-c has no span.price: the selector learnt on a regular page fails there
    sale = pages["/shop-c/p2.html"]
    assert check(sale, "price", "span.price") is None and check(sale, "price", META_PRICE) == "24.00"


def test_each_round_gives_each_scout_a_page_of_another_shop_and_every_page_is_taken_once() -> None:
    rounds = [assignment(r) for r in range(4)]
    assert sorted(path for r in rounds for _, path in r) == sorted(page_paths())
    for r in rounds:
        assert len({path.split("/")[1] for _, path in r}) == 3
    for name in ("scout-1", "scout-2", "scout-3"):
        shops = [path.split("/")[1] for r in rounds for n, path in r if n == name]
        assert len(set(shops[:3])) == 3


def test_every_voter_samples_a_sale_page_and_ties_go_to_the_incumbent() -> None:
    sale = {p.path for p in CATALOG if p.was}
    for index in range(3):
        sample = vote_sample(index, "shop-c")
        assert len(sample) == 2 and set(sample) & sale
    assert vote_choice([1, 2]) == 1
    assert vote_choice([2, 2]) == 0
    assert vote_choice([0, 0]) == 0


def test_the_site_serves_its_pages_over_http() -> None:
    with SiteServer() as site:
        assert "Alder Outfitters" in fetch(site.url("/"))
        assert all(p.path in fetch(site.url(f"/{p.shop}/")) for p in CATALOG)
        assert fetch(site.url("/shop-b/p3.html")) == render("/shop-b/p3.html")
        with pytest.raises(OSError):  # urllib's HTTPError: 404
            fetch(site.url("/nothing.html"))


# ------------------------------------------------------------------ end to end
async def _worker(start_worker: StartWorker, pg_settings: Settings, unique: str) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(64, model),
                       query_provider=HashProvider(64, model))


@pytest.mark.asyncio
async def test_the_team_shares_selectors_votes_prunes_and_saves_steps(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await _worker(start_worker, pg_settings, unique)
    lines: list[str] = []
    team = f"team-{unique}"
    result = await run_scraping_team(pg_settings, ScrapeConfig(team=team, timeout=240), echo=lines.append)
    assert result.problems == [] and result.ok
    # the saving, as printed
    assert result.steps_without_memory == 112
    assert result.steps_with_memory == 69  # 26 to learn 3 layouts, 3 per page after, 4 to settle the conflict, 12 to vote
    assert result.saved == 43 > 0
    assert "memory saved 43 extraction steps (38%): 69 with memory, 112 without" in result.summary()
    assert result.extracted == {p.path: p.fields() for p in CATALOG}
    assert result.reused == 26  # 9 pages x 3 fields, but shop-c's price on p2
    # the conflict on shop-c's price, settled by vote
    [vote] = result.votes
    assert (vote.shop, vote.field, vote.candidates) == ("shop-c", "price", ["span.price", META_PRICE])
    assert vote.status == "accepted" and vote.winner == META_PRICE and vote.committed == META_PRICE
    assert {choice for choice, _ in vote.ballots.values()} == {1}  # every sample held a sale page
    assert sum(counted for _, counted in vote.ballots.values()) >= 2
    # the outvoted pattern was its author's (scout-3, who met shop-c first) to prune, and is gone
    assert [len(result.pruned[s]) for s in ("scout-1", "scout-2", "scout-3")] == [0, 0, 1]
    assert result.final_patterns["shop-c price"] == [META_PRICE]
    assert all(len(v) == 1 for v in result.final_patterns.values()) and len(result.final_patterns) == 9
    # read back through the public API: the pruned pattern is archived (not deleted), the
    # demoted version of its key, its first version superseded by it
    [pruned] = result.pruned["scout-3"]
    async with Agent.connect(f"{team}-auditor", settings=pg_settings) as auditor:
        detail = await auditor.memory(pruned, board=team)
    memory = detail.memory
    assert memory.key == "selector:shop-c:price:span.price" and memory.agent == f"{team}-scout-3"
    assert memory.confidence == pytest.approx(0.1) and memory.archived_at is not None
    assert memory.archive_reason == "low_confidence"
    assert [v.confidence for v in detail.versions] == [pytest.approx(0.7), pytest.approx(0.1)]
    text = "\n".join(lines)
    assert "the team's price pattern span.price fails here" in text
    assert "demoted span.price (confidence 0.1)" in text


def _env(auth: TestAuth) -> dict[str, str]:
    """A shell with no BLACKBOARD_* setting of the test run but the test authority and CA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | {"BLACKBOARD_SECURITY__AUTHORITY_DIR": str(auth.authority.directory),
                  "BLACKBOARD_NATS__TLS_CA_FILE": str(auth.tls.ca),
                  "BLACKBOARD_DEV__DATA_DIR": str(auth.authority.directory / "no-dev")}


def _cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "examples.scraping_team", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.asyncio
async def test_the_command_prints_the_saving_and_exits_zero(
        nats_server: EmbeddedNats, pg_settings: Settings, start_worker: StartWorker, test_auth: TestAuth,
        unique: str) -> None:
    await _worker(start_worker, pg_settings, unique)
    proc = await asyncio.to_thread(_cli, "--nats-url", nats_server.url, "--team", f"team-{unique}", "--json",
                                   "--timeout", "200", env=_env(test_auth))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "memory saved 43 extraction steps" in proc.stdout and "result: OK" in proc.stdout
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["saved"] == 43
    assert [(v["status"], v["winner"]) for v in summary["votes"]] == [("accepted", META_PRICE)]


@pytest.mark.slow
def test_the_command_runs_against_blackboard_dev_with_no_manual_step() -> None:
    # The README's promise: with `blackboard dev` running, `python -m examples.scraping_team`
    # from the project directory just works: the dev authority issues the team-* scouts their
    # credentials, the dev worker embeds the patterns, serves search and prune, commits the vote.
    project = Path(tempfile.mkdtemp(prefix="bb-scrape-dev-"))
    os.chmod(project, 0o755)  # the embedded PostgreSQL may run as another user
    data_dir = project / ".blackboard"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    dev = subprocess.Popen(
        [sys.executable, "-m", "blackboard", "dev", "--data-dir", str(data_dir), "--nats-port", "0", "--pg-port",
         "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=clean | {"BLACKBOARD_EMBEDDING__PROVIDER": "local"})
    lines: list[str] = []
    try:
        assert dev.stdout is not None
        for line in dev.stdout:
            lines.append(line.rstrip())
            if "worker        running" in line or "error" in line.lower():
                break
        text = "\n".join(lines)
        url = re.search(r"export BLACKBOARD_NATS__URL=(\S+)", text)
        assert "worker        running" in text and url, text
        proc = _cli("--nats-url", url.group(1), "--json", "--quiet",
                    env=clean | {"BLACKBOARD_DEV__DATA_DIR": str(data_dir)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["ok"] and summary["saved"] == 43 and summary["team"].startswith("team-")
        for n in (1, 2, 3):
            assert (data_dir / "auth" / "creds" / f"{summary['team']}-scout-{n}.creds").is_file()
    finally:
        dev.send_signal(signal.SIGINT)
        out, _ = dev.communicate(timeout=60)
        shutil.rmtree(project, ignore_errors=True)
    assert dev.returncode == 0, "\n".join(lines) + "\n" + out


def test_the_command_fails_cleanly_without_a_server(test_auth: TestAuth) -> None:
    proc = _cli("--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1", env=_env(test_auth), timeout=60)
    assert proc.returncode == 1
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_fields_are_the_catalogs() -> None:
    assert set(FIELDS) == set(CATALOG[0].fields())
