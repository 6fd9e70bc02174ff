"""The inspector: a read-only web page on the blackboard, served as one identity
(``blackboard inspect``, docs/inspector.md).

:class:`Inspector` reads through a connected :class:`agents_sdk.Agent`, so the page shows what
that identity may read; :func:`create_app` is its Starlette app (the JSON API of
:mod:`~blackboard.apps.inspect.api`, the live event streams of
:mod:`~blackboard.apps.inspect.events`, the page in ``static/``); :func:`running_inspector`
serves it with uvicorn.
"""

from blackboard.apps.inspect.access import BOARDS_TTL, BoardAccess
from blackboard.apps.inspect.api import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    entry_json,
    error_response,
    routes,
    value_json,
)
from blackboard.apps.inspect.app import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    Inspector,
    InspectorServer,
    create_app,
    is_loopback,
    running_inspector,
    static_dir,
)
from blackboard.apps.inspect.events import BoardFeed, Feeds, preview_of, proposal_json, sse

__all__ = [
    "BOARDS_TTL",
    "DEFAULT_HOST",
    "DEFAULT_LIMIT",
    "DEFAULT_PORT",
    "MAX_LIMIT",
    "BoardAccess",
    "BoardFeed",
    "Feeds",
    "Inspector",
    "InspectorServer",
    "create_app",
    "entry_json",
    "error_response",
    "is_loopback",
    "preview_of",
    "proposal_json",
    "routes",
    "running_inspector",
    "sse",
    "static_dir",
    "value_json",
]
