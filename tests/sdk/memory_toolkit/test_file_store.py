"""The file store: local files chunked and indexed on a board, read-only, re-indexed when files
are added, changed or deleted (by refresh() and by its watcher); on a real worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agents_sdk import Agent
from agents_sdk.memory.layers import LayerHit
from agents_sdk.memory.stores import FileOptions, FileStore, create_store
from blackboard.protocol.errors import ConfigurationError, PermissionDeniedError
from blackboard.settings import Settings
from tests._lost_cancel import LostCancel, closes_for_good
from tests._worker_helpers import HashProvider, StartWorker

pytestmark = pytest.mark.asyncio


def _texts(hits: list[LayerHit]) -> list[str]:
    return [h.text for h in hits]


async def test_the_file_store_reindexes_new_changed_and_deleted_files(
        pg_settings: Settings, start_worker: StartWorker, unique: str, tmp_path: Path) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, model),
                       query_provider=HashProvider(32, model))
    docs = tmp_path / "docs"
    docs.mkdir()
    guide, notes = docs / "guide.md", docs / "notes.txt"
    guide.write_text(f"# Birds\n\nThe {unique} kestrel hovers over the meadow at dawn.\n\n"
                     + "\n\n".join(f"Paragraph {i} about falcons and their flight." for i in range(8)))
    notes.write_text(f"The {unique} heron waits by the river.")
    (docs / "skip.rst").write_text(f"The {unique} kestrel again, in a suffix not indexed.")
    (docs / "image.png").write_bytes(b"\x89PNG kestrel")
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        store = FileStore(agent, "birds", FileOptions(paths=[docs], suffixes=[".md", "txt"], board=unique,
                                                      interval=0, mode="keyword", chunk_size=200, overlap=20))
        await store.start()
        assert store.files == [str(guide.resolve()), str(notes.resolve())]
        assert store.size() > 2  # the guide is several chunks
        hits = await store.search("kestrel hovers", 3, 0.0)
        assert hits and f"{unique} kestrel hovers" in hits[0].text
        assert (hits[0].layer, hits[0].kind, hits[0].source) == ("store:birds", "file", "birds")
        assert hits[0].provenance["path"] == str(guide.resolve()) and hits[0].metadata["store"] == "birds"
        assert all(str(docs / "skip.rst") != h.provenance["path"] for h in await store.search("kestrel", 10, 0))
        assert _texts(await store.search("heron river", 3, 0.0)) == [f"The {unique} heron waits by the river."]

        unchanged = await store.refresh()
        assert (unchanged.changes, unchanged.unchanged, unchanged.chunks_written) == (0, 2, 0)
        guide.touch()  # a newer time, the same content: not re-chunked
        assert (await store.refresh()).changes == 0

        # changed: the kestrel becomes an osprey, and the guide much shorter
        guide.write_text(f"# Birds\n\nThe {unique} osprey dives into the lake.")
        changed = await store.refresh()
        assert changed.changed == [str(guide.resolve())] and changed.chunks_written == 1
        assert changed.chunks_forgotten > 0  # the chunks past its new end
        assert await store.search("kestrel hovers", 5, 0.0) == []
        assert _texts(await store.search("osprey dives", 3, 0.0)) == [f"# Birds\n\nThe {unique} osprey dives into the lake."]
        assert store.size() == 2

        # added and deleted
        (docs / "new.md").write_text(f"The {unique} wren sings in the hedge.")
        notes.unlink()
        moved = await store.refresh()
        assert moved.added == [str((docs / "new.md").resolve())] and moved.deleted == [str(notes.resolve())]
        assert await store.search("heron river", 5, 0.0) == []
        assert _texts(await store.search("wren sings hedge", 3, 0.0)) == [f"The {unique} wren sings in the hedge."]
        assert store.files == [str(guide.resolve()), str((docs / "new.md").resolve())]

        with pytest.raises(PermissionDeniedError, match="read-only"):
            await store.write("no")
        await store.close()


async def test_the_watcher_reindexes_without_being_asked(
        pg_settings: Settings, start_worker: StartWorker, unique: str, tmp_path: Path) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, model),
                       query_provider=HashProvider(32, model))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"The {unique} lark rises singing.")
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        # declared as a config file would: a relative path from the file's folder
        store = create_store(agent, "watched", "file", paths=["docs"], board=unique, interval=0.2, mode="keyword",
                             base_dir=tmp_path)
        assert isinstance(store, FileStore)
        await store.start()
        assert [h.text for h in await store.search("lark rises", 3, 0.0)] == [f"The {unique} lark rises singing."]
        (tmp_path / "docs" / "b.md").write_text(f"The {unique} swift screams over the roofs.")
        deadline = time.monotonic() + 20
        while str((tmp_path / "docs" / "b.md").resolve()) not in store.files:
            assert time.monotonic() < deadline, "the watcher did not index the new file"
            await asyncio.sleep(0.05)
        assert [h.text for h in await store.search("swift screams", 3, 0.0)] == [
            f"The {unique} swift screams over the roofs."]
        await store.close()
        assert store.files  # the index stays; only the watcher stopped


async def test_file_store_options_are_checked(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        with pytest.raises(ConfigurationError, match="paths"):
            create_store(agent, "docs", "file")
        with pytest.raises(ConfigurationError, match="overlap must be smaller"):
            create_store(agent, "docs", "file", paths=["x"], chunk_size=100, overlap=100)
        with pytest.raises(ConfigurationError, match="invalid store name"):
            create_store(agent, "bad name", "file", paths=["x"])
        empty = create_store(agent, "nothing", "file", paths=[f"/nonexistent/{unique}"], interval=0)
        await empty.start()  # a path that does not exist (yet) holds no files
        assert empty.size() == 0 and await empty.search("anything", 5, 0.0) == []


async def test_a_restarted_store_resends_only_what_changed_while_it_was_stopped(
        pg_settings: Settings, start_worker: StartWorker, unique: str, tmp_path: Path) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, model),
                       query_provider=HashProvider(32, model))
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, bird in (("a.md", "finch"), ("b.md", "robin"), ("c.md", "thrush")):
        (docs / name).write_text(f"The {unique} {bird} sings.")
    options = FileOptions(paths=[docs], board=unique, interval=0, mode="keyword")
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        first = FileStore(agent, "birds", options)
        await first.start()
        assert first.last_report is not None and len(first.last_report.added) == 3
        await first.close()

        (docs / "b.md").write_text(f"The {unique} blackbird sings at dusk.")  # changed while stopped
        (docs / "c.md").unlink()  # deleted while stopped
        (docs / "d.md").write_bytes(b"\xff\xfe not text")  # never indexed: skipped
        again = FileStore(agent, "birds", options)  # another run of the agent
        await again.start()
        report = again.last_report
        assert report is not None
        assert (report.added, report.changed, report.deleted, report.unchanged, report.chunks_written) == (
            [], [str((docs / "b.md").resolve())], [str((docs / "c.md").resolve())], 1, 1)
        assert report.skipped == [str((docs / "d.md").resolve())]
        assert [h.text for h in await again.search("finch", 3, 0.0)] == [f"The {unique} finch sings."]
        assert [h.text for h in await again.search("blackbird dusk", 3, 0.0)] == [
            f"The {unique} blackbird sings at dusk."]
        assert await again.search("thrush", 3, 0.0) == [] and await again.search("robin", 3, 0.0) == []
        assert sorted(await agent.board(unique).keys(again.manifest_section)) == [
            str((docs / "a.md").resolve()), str((docs / "b.md").resolve())]

        (docs / "a.md").write_bytes(b"\xff binary now")  # an indexed file that is no longer text
        gone = await again.refresh()
        assert gone.deleted == [str((docs / "a.md").resolve())] and await again.search("finch", 3, 0.0) == []


async def test_close_while_a_watcher_refresh_loses_its_cancel_returns(
        settings: Settings, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh's requests may swallow close()'s cancel (Python 3.11's ``asyncio.wait_for``
    returns a ready answer instead of raising it): the watcher must still end, and close() return."""
    docs = tmp_path / "docs"
    docs.mkdir()
    refresh = LostCancel()  # the server "answers" while close() cancels
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        store = FileStore(agent, "watched", FileOptions(paths=[docs], board=unique, interval=0.05, mode="keyword"))
        await store.start()
        monkeypatch.setattr(store, "refresh", refresh)  # the watcher's refreshes from now on
        await asyncio.wait_for(refresh.entered.wait(), 5)
        await closes_for_good(store.close(), refresh)  # and no refresh after it
