"""Which JetStream API failures ``ensure_streams`` waits out (a cluster still forming), and the
streams' configurations (refusing rollups, deletes and purges)."""

from __future__ import annotations

import pytest
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from blackboard.client.streams import (
    cluster_not_ready,
    kv_stream_config,
    no_jetstream,
    refuses_removal,
    stream_specs,
)
from blackboard.settings import Settings


@pytest.mark.parametrize(("exc", "transient"), [
    (ServiceUnavailableError(code=503, err_code=10008, description="JetStream system temporarily unavailable"),
     True),
    (BadRequestError(code=400, err_code=10005, description="no suitable peers for placement, peer offline"),
     True),
    (APIError(code=500, err_code=10009, description="JetStream cluster can not handle request"), True),
    (TimeoutError(), True),
    (ServiceUnavailableError(), True),  # no responders: a server starting, or JetStream off
    (BadRequestError(code=400, err_code=10058, description="stream name already in use with a different "
                                                            "configuration"), False),
    (NotFoundError(code=404, err_code=10059, description="stream not found"), False),
    (ValueError("bad config"), False),
])
def test_cluster_not_ready(exc: BaseException, transient: bool) -> None:
    assert cluster_not_ready(exc) is transient


def test_no_responders_is_told_apart_from_a_forming_cluster() -> None:
    assert no_jetstream(ServiceUnavailableError())  # what nats-py raises for no responders
    assert not no_jetstream(ServiceUnavailableError(code=503, err_code=10008, description="temporarily unavailable"))
    assert not no_jetstream(TimeoutError())


def test_every_stream_but_the_object_stores_refuses_rollups_deletes_and_purges() -> None:
    settings = Settings()
    configs = [spec.config(1) for spec in stream_specs(settings)] + [kv_stream_config(settings)]
    assert {c.name for c in configs} == {"BB_MEMORY", "BB_MSG", "BB_VOTE", "BB_KEYS",
                                             f"KV_{settings.board.bucket}"}
    for config in configs:
        assert refuses_removal(config), config.name
        assert (config.allow_rollup_hdrs, config.deny_delete, config.deny_purge) == (False, True, True)
        assert config.duplicate_window == settings.nats.duplicate_window, config.name


def test_the_board_stream_is_a_kv_bucket() -> None:
    settings = Settings()
    config = kv_stream_config(settings)
    b = settings.board
    assert config.subjects == [f"$KV.{b.bucket}.>"]
    assert (config.max_msgs_per_subject, config.max_msg_size, config.num_replicas) == (b.history, b.max_value_size,
                                                                                        b.replicas)
    assert config.discard is DiscardPolicy.NEW and config.allow_direct and config.allow_msg_ttl
    assert config.subject_delete_marker_ttl == (b.expiry_marker_ttl or None)
    no_markers = settings.model_copy(update={"board": b.model_copy(update={"expiry_marker_ttl": 0})})
    assert kv_stream_config(no_markers).subject_delete_marker_ttl is None
    assert not refuses_removal(StreamConfig(deny_delete=True, deny_purge=True, allow_rollup_hdrs=True))
    assert not refuses_removal(StreamConfig(deny_delete=True, deny_purge=False))
