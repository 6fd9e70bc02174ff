"""A commit that finds the outcome (or its application) recorded reads it, when a replica
behind answers its direct get 404, against a real nats-server.

In an R3 cluster any replica answers a direct get of ``BB_VOTE``; one that has not applied
the outcome yet (a node restarted and catching up) answers 404 although the commit's own
write was just refused because the outcome is there. Here, on one server, the vote store's
direct gets of the outcome and applied subjects are answered with real 404s captured from
the server before either was stored (``VoteStore._request``, the one place it sends them).
"""

from __future__ import annotations

from collections import Counter

import pytest
from nats.aio.msg import Msg

from blackboard.client.connection import connect_nats
from blackboard.client.consensus import VoteStore
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.settings import Settings
from tests.sdk.test_consensus import _decided_but_uncommitted

pytestmark = pytest.mark.asyncio


async def test_a_second_commit_reads_the_recorded_outcome_when_a_replica_answers_404(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store, pid, decided = await _decided_but_uncommitted(settings, unique, "s", "k")
    nc = await connect_nats(settings.nats, name="second")
    try:
        second = VoteStore(nc, settings, name="second")  # another committer (the worker's identity)
        real = second._request
        gets = [Subjects.direct_get(VOTE_STREAM, Subjects.vote(unique, pid, kind)) for kind in ("outcome", "applied")]
        absent = {subject: await real(subject, b"", "test") for subject in gets}  # real 404s: nothing stored yet
        assert all((msg.headers or {}).get(Header.STATUS.value) == "404" for msg in absent.values())
        committed = await store.commit(decided)
        assert committed.revision is not None

        asked: Counter[str] = Counter()

        async def behind(subject: str, payload: bytes, what: str) -> Msg:
            if subject in absent:  # a replica that has applied neither record yet
                asked[subject] += 1
                return absent[subject]
            return await real(subject, payload, what)

        monkeypatch.setattr(second, "_request", behind)
        # record: refused (the outcome is there), reads it; apply: finds the application;
        # mark applied: refused, reads it. Without reading again: "exists but cannot be read".
        assert await second.commit(decided) == committed
        assert second.stale_reads == 2
        assert [asked[subject] for subject in gets] == [3, 3]  # the first, one after each pause; then a consumer
    finally:
        await nc.close()
        await store.nc.close()
