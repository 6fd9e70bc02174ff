"""The deployment's streams refuse rollups, message deletes and purges (issue 19), and
``ensure_streams(update=True)`` brings an existing deployment's streams there."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import nats
import nats.js.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js import api

from blackboard.client.streams import ensure_streams, refuses_removal, stream_specs
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import (
    KEYS_STREAM,
    MEMORY_STREAM,
    MESSAGE_STREAM,
    VOTE_STREAM,
    Subjects,
)
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio

STREAMS = (MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, KEYS_STREAM)


def _without_markers(settings: Settings) -> Settings:
    return settings.model_copy(update={"board": settings.board.model_copy(update={"expiry_marker_ttl": 0})})


def _with_markers(settings: Settings) -> Settings:
    return settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"insecure_open_bus": False}),
        "board": settings.board.model_copy(update={"expiry_marker_ttl": 1.0})})


@pytest_asyncio.fixture
async def server(nats_factory: Callable[[], EmbeddedNats]) -> EmbeddedNats:
    return nats_factory()


@pytest_asyncio.fixture
async def nc(server: EmbeddedNats) -> AsyncIterator[NATS]:
    conn = await operator_nats(server.url)
    try:
        yield conn
    finally:
        await conn.close()


async def _refusals(nc: NATS, stream: str, subject: str) -> list[str]:
    """What the stream refuses of a rollup, a message delete and a purge (each tried)."""
    js = nc.jetstream()
    refused = []
    first = (await js.publish(subject, b"1")).seq
    await js.publish(subject, b"2")
    try:
        await js.publish(subject, b"", headers={"Nats-Rollup": "all"})
    except nats.js.errors.APIError:
        refused.append("rollup")
    try:
        await js.delete_msg(stream, first)
    except nats.js.errors.APIError:
        refused.append("delete")
    try:
        await js.purge_stream(stream)
    except nats.js.errors.APIError:
        refused.append("purge")
    return refused


async def test_new_streams_refuse_rollups_deletes_and_purges(server: EmbeddedNats, nc: NATS) -> None:
    settings = _without_markers(make_settings(server.url))
    await ensure_streams(nc.jetstream(), settings)
    subjects = Subjects(settings.board.bucket)
    assert await _refusals(nc, subjects.kv_stream, subjects.entry("b", "s", "k")) == ["rollup", "delete", "purge"]
    for stream, subject in zip(STREAMS, (Subjects.memory("b", "a"), Subjects.broadcast("b"),
                                         Subjects.vote("b", "p", "proposal"), Subjects.key_revocations()),
                               strict=True):
        assert await _refusals(nc, stream, subject) == ["rollup", "delete", "purge"], stream
    objects = (await nc.jetstream().stream_info(Subjects.objects_stream(settings.board.objects_bucket))).config
    assert objects.allow_rollup_hdrs  # nats-py's object store rolls up an object's metadata


async def test_update_brings_an_existing_deployments_streams_to_refuse_them(
        server: EmbeddedNats, nc: NATS) -> None:
    settings = _without_markers(make_settings(server.url))
    js = nc.jetstream()
    # A deployment made before issue 19 (the private server's set-up streams dropped first):
    # nats-py's KV bucket and streams allowing all three.
    kv = Subjects(settings.board.bucket).kv_stream
    for stream in (kv, *STREAMS):
        await js.delete_stream(stream)
    await js.create_key_value(api.KeyValueConfig(bucket=settings.board.bucket, history=settings.board.history,
                                                 direct=True))
    for spec in stream_specs(settings):
        config = spec.config(1)
        config.allow_rollup_hdrs, config.deny_delete, config.deny_purge = True, False, False
        await js.add_stream(config)
    await ensure_streams(js, settings)  # without update: left as they are
    assert not refuses_removal((await js.stream_info(kv)).config)
    await ensure_streams(js, settings, update=True)
    for stream in (kv, *STREAMS):
        assert refuses_removal((await js.stream_info(stream)).config), stream
    assert await _refusals(nc, kv, Subjects(settings.board.bucket).entry("b", "s", "k")) == [
        "rollup", "delete", "purge"]


async def test_a_board_stream_with_expiry_markers_keeps_rollups_and_setup_warns(
        server: EmbeddedNats, nc: NATS, caplog: pytest.LogCaptureFixture) -> None:
    """nats-server turns rollups and purges back on for a stream with subject delete markers
    (board.expiry_marker_ttl > 0, no longer the default): ensure_streams says so, and what to
    set instead."""
    settings = _with_markers(make_settings(server.url))
    await nc.jetstream().delete_stream(Subjects(settings.board.bucket).kv_stream)  # the set-up one, sealed
    with caplog.at_level(logging.WARNING, logger="blackboard.client.streams"):
        await ensure_streams(nc.jetstream(), settings, update=True)
    kv = (await nc.jetstream().stream_info(Subjects(settings.board.bucket).kv_stream)).config
    assert kv.allow_rollup_hdrs and not kv.deny_purge and kv.deny_delete
    assert any("expiry_marker_ttl" in r.getMessage() for r in caplog.records)


async def test_expiry_markers_on_a_sealed_board_stream_are_a_configuration_error(
        server: EmbeddedNats, nc: NATS) -> None:
    """A board stream that refuses purges (the private server's, as setup made it) cannot be
    given delete markers: nats-server refuses the update; ensure_streams says what to set."""
    settings = _with_markers(make_settings(server.url))
    kv = Subjects(settings.board.bucket).kv_stream
    assert refuses_removal((await nc.jetstream().stream_info(kv)).config)
    with pytest.raises(ConfigurationError, match="expiry_marker_ttl to 0"):
        await ensure_streams(nc.jetstream(), settings, update=True)
    assert refuses_removal((await nc.jetstream().stream_info(kv)).config)  # left sealed
