"""The pure parts of the commands for people: JSON for scripts, text for people, input, exit codes."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from blackboard.apps.people.common import (
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    exit_code,
    json_object,
    read_value,
)
from blackboard.apps.people.output import (
    dumps,
    entry_json,
    jsonable,
    preview,
    printable,
    table,
    value_text,
)
from blackboard.protocol.entries import Entry, Operation
from blackboard.protocol.errors import (
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    PermissionDeniedError,
    SearchError,
)
from blackboard.protocol.signing import Verdict


def test_json_carries_bytes_instants_and_floats_json_cannot() -> None:
    at = datetime(2026, 11, 26, 2, 0, tzinfo=timezone(timedelta(hours=1)))
    data = {"b": b"\x00\xff", "t": at, "nan": float("nan"), "inf": float("inf"), "tuple": (1, 2), "v": Verdict.VERIFIED}
    assert jsonable(data) == {"b": {"$base64": "AP8="}, "t": "2026-11-26T01:00:00+00:00", "nan": "nan",
                              "inf": "inf", "tuple": [1, 2], "v": "verified"}
    assert json.loads(dumps(data))["b"] == {"$base64": "AP8="}
    assert dumps("é") == '"é"'


def test_an_entry_as_json() -> None:
    entry = Entry("b", "s", "k", 7, value={"x": 1}, author="alice", tags=("t",), metadata={"m": 1},
                  stored_at=datetime(2026, 1, 1, tzinfo=UTC), operation=Operation.PUT, verdict=Verdict.VERIFIED)
    doc = entry_json(entry)
    assert doc["revision"] == 7 and doc["operation"] == "put" and doc["tags"] == ["t"]
    assert doc["stored_at"] == "2026-01-01T00:00:00+00:00" and doc["created_at"] is None
    assert doc["verdict"] == "verified" and json.loads(json.dumps(doc)) == doc


def test_text_for_people_carries_no_control_characters() -> None:
    assert printable("red \x1b[31m bell \x07 ok\n") == "red \\x1b[31m bell \\x07 ok\n"
    assert printable("a\nb\tc", one_line=True) == "a\\nb\\tc"
    assert printable("\x9b") == "\\x9b"  # a C1 control (CSI)
    assert "\x1b" not in value_text("\x1b[2J") and "\x1b" not in value_text({"k": "\x1b"})
    assert "\x1b" not in preview("\x1b]0;title\x07") and "\x1b" not in table(["A"], [["\x1b[1m"]])


def test_previews_are_one_short_line() -> None:
    assert preview("short") == "short"
    long = preview({"text": "x" * 500}, 40)
    assert len(long) == 40 and long.endswith("...") and "\n" not in long


def test_tables_align_columns_and_numbers() -> None:
    text = table(["NAME", "N", "NOTE"], [["a", 1, "first"], ["long name", 100, ""]], right=("N",))
    assert text.splitlines() == ["NAME         N  NOTE", "a            1  first", "long name  100"]


def test_values_are_json_or_plain_strings() -> None:
    assert read_value("42", what="V") == 42
    assert read_value('{"a": [1, null]}', what="V") == {"a": [1, None]}
    assert read_value("hello world", what="V") == "hello world"
    assert read_value("NaN", what="V") == "NaN"  # JSON has no NaN: the string
    assert read_value("42", what="V", plain=True) == "42"
    assert read_value("-", what="V", stdin=io.StringIO(' [1]\n')) == [1]
    assert read_value("-", what="V", plain=True, stdin=io.StringIO("line\n")) == "line\n"


def test_flags_that_take_a_json_object() -> None:
    assert json_object(None, what="--where") is None
    assert json_object('{"a": 1}', what="--where") == {"a": 1}
    with pytest.raises(InvalidPayloadError, match="--metadata is not valid JSON"):
        json_object("{", what="--metadata")
    with pytest.raises(InvalidPayloadError, match="must be a JSON object, not list"):
        json_object("[1]", what="--where")
    with pytest.raises(InvalidPayloadError):
        json_object('{"a": Infinity}', what="--where")


def test_exit_codes() -> None:
    assert exit_code(ConflictError("k", 1, 2)) == EXIT_CONFLICT == 4
    assert exit_code(NotFoundError("k")) == EXIT_NOT_FOUND == 3
    assert exit_code(PermissionDeniedError("no")) == EXIT_DENIED == 5
    assert exit_code(AuthenticationError("no credential")) == EXIT_AUTH == 6
    for usage in (ConfigurationError("x"), InvalidKeyError("k", "bad"), InvalidPayloadError("bad")):
        assert exit_code(usage) == EXIT_USAGE == 2
    for other in (SearchError("no worker"), NotConnectedError("down"), TimeoutError(), OSError()):
        assert exit_code(other) == EXIT_FAILED == 1
