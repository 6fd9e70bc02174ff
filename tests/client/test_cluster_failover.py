"""Fast failover in the production shape: an R3 board while nodes die (issue 18, finding 6).

One node of three is killed (``kill -9``) again and again, the board stream's
leader more often than not, while agents write plain and compare-and-set
entries with the default ``nats.write_timeout``: no write fails, every
acknowledged write is on the board at its revision, and none is applied twice.
A killed leader stays down until the two nodes left have elected another
(so every leader kill is a real election), and each node comes back and
catches up before the next is killed: the cluster is always one failure and at
most one leader election away from taking writes.
"""

from __future__ import annotations

import asyncio
import json

import nats.errors
import pytest
from nats.js import JetStreamContext

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import NatsSettings, Settings
from tests._cluster import NatsCluster
from tests._write_load import WriteLoad
from tests.conftest import make_settings

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.cluster]



def _r3_settings(cluster: NatsCluster) -> Settings:
    settings = make_settings(cluster.urls)
    default = NatsSettings.model_fields["write_timeout"].default
    return settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"write_timeout": default}),
        "board": settings.board.model_copy(update={"replicas": 3})})


async def _leader(js: JetStreamContext, stream: str, *, other_than: str | None = None) -> str:
    """The stream's leader: with ``other_than``, once it is another node (elected while that
    node is down); without, once every replica is current (a restarted node caught up)."""
    async with asyncio.timeout(90):  # a cluster that does not recover fails the test, not CI
        while True:
            try:
                c = (await js.stream_info(stream)).cluster
            except (nats.errors.Error, TimeoutError):  # no leader to answer yet
                c = None
            if c is not None and c.leader:
                if other_than is not None and c.leader != other_than:
                    return c.leader
                if other_than is None and len(c.replicas or []) == 2 \
                        and all(r.current and not r.offline for r in c.replicas or []):
                    return c.leader
            await asyncio.sleep(0.2)


async def test_no_write_fails_while_one_node_of_three_is_killed_repeatedly(cluster: NatsCluster) -> None:
    cluster.start()
    settings = _r3_settings(cluster)
    subjects = Subjects(settings.board.bucket)
    # The operator creates the streams (R3) and watches the cluster; the agent writes with its own credential.
    operator = settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"creds_file": cluster.auth.creds("operator")})})
    nc = await connect_nats(operator.nats, name="killer")
    js = nc.jetstream(timeout=2)
    await ensure_streams(js, operator, ready_timeout=60)
    try:
        async with Agent.connect("failover", settings=settings) as agent:
            board = agent.board("r3")
            store = agent.store
            # A clustered stream deduplicates before it checks the expected
            # revision: a re-sent CAS write that landed is answered as a duplicate.
            first = await board.put("s", "once", 0)
            prep = store._prepare("r3", "s", "once", 1, author="x", content_type=None, tags=(), metadata=None,
                                  expected_revision=first, ttl=None, encoding="msgpack")
            applied = await store._publish(prep)
            reply = await nc.request(prep.subject, prep.payload, headers=prep.headers, timeout=5)
            assert json.loads(reply.data) == {"stream": subjects.kv_stream, "seq": applied, "duplicate": True}
            assert prep.headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] == str(first)

            stop = asyncio.Event()
            load = WriteLoad(board, stop, settle=20, pause=0.005)

            async def killer() -> None:
                leader = await _leader(js, subjects.kv_stream)
                for victim in ("leader", "follower", "leader", "leader"):
                    await asyncio.sleep(1.0)
                    names = [cluster.name(i) for i in range(cluster.size)]
                    name = leader if victim == "leader" else next(n for n in names if n != leader)
                    cluster.kill(cluster.index_of(name))
                    if victim == "leader":  # the two left elect a new leader
                        await _leader(js, subjects.kv_stream, other_than=name)
                    await asyncio.sleep(0.5)
                    await asyncio.to_thread(cluster.start, cluster.index_of(name))
                    leader = await _leader(js, subjects.kv_stream)
                stop.set()

            await load.run(killer(), puts=4, cas=2)
            await load.check(js, subjects)
            assert len(load.plain) > 100
    finally:
        await nc.close()
