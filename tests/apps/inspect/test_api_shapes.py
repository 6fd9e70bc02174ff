"""The inspector's pure parts: how values, previews, errors and events are shaped."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from blackboard.apps.inspect import entry_json, error_response, preview_of, sse, value_json
from blackboard.protocol.entries import Entry, Operation
from blackboard.protocol.errors import (
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    PermissionDeniedError,
    SearchError,
)

_REF = {"$object": {"bucket": "objs", "name": "b/s/k/abc", "size": 10, "sha256": "abc", "content_type": "image/png"}}


def _entry(value: object, content_type: str = "application/json") -> Entry:
    return Entry("b", "s", "k", 7, value, content_type, "alice", ("t",), {"m": 1},
                 datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC), Operation.PUT)


def test_value_kinds_follow_the_content_type() -> None:
    assert value_json("b", "s", "k", 7, {"a": 1}, "application/json") == \
        {"value": {"a": 1}, "value_kind": "json", "object_url": None}
    assert value_json("b", "s", "k", 7, "hello", "text/plain")["value_kind"] == "text"
    assert value_json("b", "s", "k", 7, "hello", "application/json")["value_kind"] == "json"  # a JSON string
    image = value_json("b", "s", "a key/with?odd#chars", 7, _REF, "image/png")
    assert image["value_kind"] == "image"
    assert image["object_url"] == "/api/objects/b/s/a%20key%2Fwith%3Fodd%23chars?revision=7"
    other = dict(_REF, **{"$object": dict(_REF["$object"], content_type="application/pdf")})
    assert value_json("b", "s", "k", 7, other, "application/pdf")["value_kind"] == "object"
    raw = value_json("b", "s", "k", 7, b"\x00\x01", "application/octet-stream")
    assert (raw["value"], raw["value_kind"]) == (None, "binary")
    assert value_json("b", "s", "k", 7, b"\x89PNG", "image/png")["value_kind"] == "image"


def test_an_entry_row_has_a_size_and_a_short_preview() -> None:
    row = entry_json(_entry({"text": "word " * 100}))
    assert row["size"] == len(json.dumps({"text": "word " * 100}, separators=(",", ":")))
    assert len(row["preview"]) == 120 and row["preview"].endswith("…")
    assert (row["author"], row["tags"], row["metadata"], row["revision"]) == ("alice", ["t"], {"m": 1}, 7)
    assert entry_json(_entry(_REF, "image/png"))["size"] == 10
    assert preview_of(_entry(b"\x00" * 5, "application/octet-stream")) == "<5 bytes application/octet-stream>"
    assert preview_of(_entry("two\nlines", "text/plain")) == "two lines"


@pytest.mark.parametrize(("error", "status"), [
    (PermissionDeniedError("no"), 403), (NotFoundError("k"), 404), (InvalidPayloadError("bad"), 400),
    (SearchError("no worker"), 503), (NotConnectedError("down"), 503), (TimeoutError(), 503),
    (RuntimeError("bug"), 500)])
def test_errors_answer_json_with_their_class(error: BaseException, status: int) -> None:
    response = error_response(error)
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert body["type"] == type(error).__name__ and body["error"]


def test_an_event_is_one_event_line_and_one_data_line() -> None:
    data = sse("entry", {"key": "a\nb", "at": datetime(2026, 1, 1, tzinfo=UTC)})
    assert data.endswith(b"\n\n")
    name, payload, *_ = data.decode().split("\n")
    assert name == "event: entry"
    assert json.loads(payload.removeprefix("data: ")) == {"key": "a\nb", "at": "2026-01-01T00:00:00+00:00"}


def test_a_page_is_cut_by_section_prefix_and_cursor() -> None:
    from blackboard.apps.inspect.events import page_of

    keys = sorted([("s3", f"k{i:02d}") for i in range(10)] + [("s30", "k00"), ("s2", "k05"), ("t", "a")])
    entries = {k: _entry(k[1]) for k in keys}

    def get(section: str, key: str) -> Entry | None:
        return entries.get((section, key))

    page, after, total = page_of(keys, get, section="s3", prefix=None, after=None, limit=4)
    assert total == 10 and after == ("s3", "k03") and len(page) == 4  # not s30's key
    rest, end, _ = page_of(keys, get, section="s3", prefix=None, after=after, limit=100)
    assert len(rest) == 6 and end is None
    prefixed, _, total = page_of(keys, get, section=None, prefix="k0", after=None, limit=100)
    # s3's k00..k09, s30's k00 and s2's k05
    assert total == 12 and {e.value for e in prefixed} == {f"k{i:02d}" for i in range(10)}
    nothing, end, total = page_of(keys, get, section="u", prefix=None, after=None, limit=5)
    assert (nothing, end, total) == ([], None, 0)
