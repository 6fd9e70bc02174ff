"""Read-your-writes through a restarted replica of an R3 board stream (the production shape).

The node of a follower of the board stream's leader is killed while another client,
on the leader, writes the same keys, then started again: a client connected to it
at once writes and reads back while it catches up (it answers direct gets before it
has applied every write: the case ``tests/containers/test_compose.py`` met). Every
read returns at least the revision the client just wrote, and never an older
revision of a key than one it read before. (A node paused with SIGSTOP and resumed
did not answer older in this set-up: it is the restart that does.)
"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js import JetStreamContext

from blackboard.client.board_store import BoardStore
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._cluster import NatsCluster
from tests.conftest import make_settings

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.cluster]

_KEYS = 8



def _on(settings: Settings, url: str) -> Settings:
    return settings.model_copy(update={"nats": settings.nats.model_copy(update={"url": url})})


async def _current_leader(js: JetStreamContext, stream: str) -> str:
    """The stream's leader once both replicas are current."""
    async with asyncio.timeout(60):
        while True:
            try:
                c = (await js.stream_info(stream)).cluster
            except (nats.errors.Error, TimeoutError):
                c = None
            if c is not None and c.leader and len(c.replicas or []) == 2 \
                    and all(r.current and not r.offline for r in c.replicas or []):
                return c.leader
            await asyncio.sleep(0.2)


async def test_a_client_of_a_restarted_replica_reads_its_own_writes_while_it_catches_up(
        cluster: NatsCluster, unique: str) -> None:
    cluster.start()
    settings = make_settings(cluster.urls)
    settings = settings.model_copy(update={"board": settings.board.model_copy(update={"replicas": 3})})
    operator = settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"creds_file": cluster.auth.creds("operator")})})
    nc = await connect_nats(operator.nats, name="operator")
    js = nc.jetstream(timeout=2)
    stream = Subjects(settings.board.bucket).kv_stream
    stale = 0
    try:
        await ensure_streams(js, operator, ready_timeout=60)
        leader = cluster.index_of(await _current_leader(js, stream))
        follower = (leader + 1) % cluster.size
        # The writer and the reader are the same identity: what the restarted node reads is signed
        # by a key it knows (another identity's certificate is read from BB_KEYS, which lags too).
        wnc = await connect_nats(_on(settings, cluster.url(leader)).nats, name="ryw-writer")
        try:
            writer = BoardStore(wnc, settings)
            author = writer.signing.signer.principal if writer.signing.signer is not None else "worker"
            for cycle in range(3):
                cluster.kill(follower)
                async with writer.pipeline(author=author) as pipe:
                    for i in range(4000):
                        await pipe.put(unique, "s", f"k{i % _KEYS}", {"cycle": cycle, "i": i})
                await asyncio.to_thread(cluster.start, follower)
                # A client of the restarted node, at once: it answers direct gets while it catches up.
                fnc = await connect_nats(_on(settings, cluster.url(follower)).nats, name="ryw-reader")
                try:
                    store = BoardStore(fnc, settings)
                    read: dict[str, int] = {}
                    for i in range(100):
                        key, other_key = f"k{i % _KEYS}", f"k{(i + 3) % _KEYS}"
                        written = await store.put(unique, "s", key, {"cycle": cycle, "mine": i}, author=author)
                        entry = await store.get(unique, "s", key)
                        assert entry.revision >= written, (cycle, i, entry.revision, written)
                        if entry.revision == written:
                            assert entry.value == {"cycle": cycle, "mine": i}
                        seen = (await store.get(unique, "s", other_key)).revision
                        assert seen >= read.get(other_key, 0), (cycle, i, other_key, seen)
                        read[other_key] = seen
                    stale += store.stale_reads
                finally:
                    await fnc.close()
                await _current_leader(js, stream)
            # How often a replica behind answered (and was read again): not asserted, it is timing.
            print(f"reads answered older and read again: {stale}")
        finally:
            await wnc.close()
    finally:
        await nc.close()
