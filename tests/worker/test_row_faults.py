"""A row PostgreSQL refuses is the batch's fault, not PostgreSQL's (issue 18, fuzz finding).

An index row over PostgreSQL's size limit (``index row requires 11464 bytes,
maximum size is 8191``, SQLSTATE 54000) is raised by psycopg as an
``OperationalError``; ingest took it for "PostgreSQL unavailable" and retried
the batch forever, so the stream stalled with no dead letter. Errors of the row
(SQLSTATE classes 22, 23, 54) now send the batch row by row and the row to the
dead letters; losing the connection is still retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgpack
import psycopg
import pytest
from nats.aio.client import Client as NATS
from psycopg_pool import PoolTimeout

from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.handlers import default_handlers
from blackboard.worker.ingest import is_retryable
from tests._worker_helpers import (
    HashProvider,
    dead_letters,
    publish_signed,
    put_entry,
    rows,
    running_worker,
    worker_settings,
)

#: How long a healthy worker needs, at most, to catch up here (a stalled one never does).
CATCH_UP = 20.0


@pytest.mark.parametrize(("exc", "retried"), [
    (psycopg.OperationalError("connection lost"), True),  # no SQLSTATE: the connection
    (psycopg.errors.AdminShutdown(), True),  # 57P01
    (psycopg.errors.TooManyConnections(), True),  # 53300
    (psycopg.errors.DeadlockDetected(), True),  # 40P01
    (psycopg.errors.SerializationFailure(), True),  # 40001
    (PoolTimeout("no connection"), True),
    (psycopg.errors.ProgramLimitExceeded(), False),  # 54000: an index row too large
    (psycopg.errors.StatementTooComplex(), False),  # 54001
    (psycopg.errors.StringDataRightTruncation(), False),  # 22001
    (psycopg.errors.UniqueViolation(), False),  # 23505
    (ValueError("serialization"), False),
])
def test_only_connection_trouble_and_conflicts_are_retried_as_they_are(exc: Exception, retried: bool) -> None:
    assert is_retryable(exc) is retried


@pytest.mark.asyncio
async def test_a_row_over_a_postgresql_limit_is_dead_lettered_and_ingest_goes_on(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """The writer meets a real SQLSTATE 54000 (program_limit_exceeded) for one row: that row
    is dead-lettered with PostgreSQL's reason and the rows around it are stored. Before,
    the batch was retried forever and the worker never caught up."""
    s = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    base = default_handlers(s)[0]

    async def write(conn: Any, rows: Sequence[Any]) -> None:
        if any(r.key == "too-big" for r in rows):
            # An array past PostgreSQL's size limit: a genuine ProgramLimitExceeded.
            await conn.execute("SELECT array_fill(0, ARRAY[200000000, 200000000])")
        await base.write(conn, rows)

    handler = dataclasses.replace(base, name="limits", filter_subject=subjects.entry_filter(unique), write=write)
    seqs = {key: await put_entry(js, subjects, unique, "s", key, key) for key in ("before", "too-big", "after")}
    async with running_worker(s, handlers=[handler], provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(CATCH_UP)
        stored = {int(r[0]) for r in rows(s, "SELECT seq FROM bb_entry_revisions WHERE board = %s", unique)}
        assert stored == {seqs["before"], seqs["after"]}
        reason = dead_letters(s, subjects.entry(unique, "s", "too-big"))[seqs["too-big"]]
        assert reason.startswith("refused by PostgreSQL")
        assert w.loops[0].stats.retries == 0
        assert all(not t.done() for t in w.tasks)


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["type", "id", "correlation_id", "reply_to"])
async def test_a_message_with_a_megabyte_indexed_field_is_dead_lettered(
        pg_settings: Settings, nc: NATS, unique: str, field: str) -> None:
    """The fuzz finding itself: a direct message whose ``type`` (or id, correlation id,
    reply subject) is a million characters. Refused by the schema now (each is bounded
    on the wire, docs/protocol.md "Limits"), and never a stall."""
    s = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0,
                        embed=False, serve_search=False, max_message_bytes=4 * 1024 * 1024)
    js = nc.jetstream()
    bob = f"{unique}-bob"
    subject = Subjects.direct(bob)
    base = {"v": 1, "id": f"{unique}-1", "sender": "eve", "kind": "direct", "recipients": [bob], "type": "t",
            "created_at": datetime.now(UTC).isoformat(), "body": "hi"}
    poison = (await js.publish(subject, msgpack.packb({**base, field: "x" * 1_000_000}))).seq
    good = await publish_signed(js, "eve", subject, msgpack.packb({**base, "id": f"{unique}-2"}))
    handlers = [h for h in default_handlers(s) if h.name == "messages"]
    async with running_worker(s, handlers=handlers, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(CATCH_UP)
        assert rows(s, "SELECT seq FROM bb_messages WHERE subject = %s", subject) == [(good,)]
        assert poison in dead_letters(s, subject)
        assert all(not t.done() for t in w.tasks)
