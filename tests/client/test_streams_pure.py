"""Which JetStream API failures ``ensure_streams`` waits out (a cluster still forming)."""

from __future__ import annotations

import pytest
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from blackboard.client.streams import cluster_not_ready, no_jetstream


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
