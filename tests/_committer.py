"""The vote committer for tests that vote without a whole worker.

Agents do not commit vote outcomes themselves (the worker identity does),
except on an insecure open bus. Voting tests therefore run a
:class:`~blackboard.worker.committer.VoteCommitter` against the test NATS
server (``running_committer``, or the ``committer`` fixture of a test module),
or use :func:`open_bus` settings to prove that agents commit themselves there.

A test's committer follows only the test's own board (``board=unique``): it
does not replay, nor commit, what other tests left on the shared server.

Until the test server runs with authorization, :func:`connect_agent` connects
agents on the open bus whatever their settings say, but keeps the voting role
the settings give them: outside an open bus an agent does not commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.settings import Settings
from blackboard.worker.committer import VoteCommitter

__all__ = ["committer_settings", "connect_agent", "open_bus", "running_committer"]


def open_bus(settings: Settings) -> Settings:
    """The same settings flagged as an insecure open bus (agents commit outcomes themselves);
    for a server WITHOUT authorization (the ``open_settings`` fixture gives one)."""
    return settings.model_copy(update={"nats": settings.nats.model_copy(update={"insecure_open_bus": True})})


async def connect_agent(agent_id: str, settings: Settings) -> Agent:
    """An agent that commits vote outcomes itself only on an open bus
    (``settings.nats.insecure_open_bus``), as one under credentials would not."""
    agent = await Agent.connect(agent_id, settings=settings)
    agent.voting.self_commit = settings.nats.insecure_open_bus
    return agent


def committer_settings(settings: Settings, **worker_fields: Any) -> Settings:
    """Settings with some ``worker`` fields changed (a fast deadline check by default)."""
    fields = {"deadline_interval": 0.1, **worker_fields}
    return settings.model_copy(update={"worker": settings.worker.model_copy(update=fields)})


@contextlib.asynccontextmanager
async def running_committer(settings: Settings, *, board: str | None = None,
                            name: str = "committer") -> AsyncIterator[VoteCommitter]:
    """A started committer (its own NATS connection) for the block; stopped after it.

    It makes sure the streams exist first, as the worker does before starting it.
    """
    nc = await connect_nats(settings.nats, name=name)
    committer = VoteCommitter(nc, settings, name=name, board=board)
    try:
        await ensure_streams(nc.jetstream(timeout=settings.nats.request_timeout), settings)
        await committer.start()
        yield committer
    finally:
        await committer.stop()
        await nc.close()
