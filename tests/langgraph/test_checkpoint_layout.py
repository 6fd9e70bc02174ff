"""The checkpointer's pure core: section and key names, the newest-first order of index
pages, and the merge of pending writes (agents_sdk/langgraph/_checkpoint_layout.py)."""

from __future__ import annotations

import random
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from agents_sdk.langgraph._checkpoint_layout import (
    PAGE_SIZE,
    NewestFirst,
    Page,
    StoredWrite,
    ThreadSections,
    blob_key,
    merge_writes,
    ns_token,
    page_key,
    parse_page_key,
    record_key,
    thread_id_of,
    thread_token,
    write_index,
)
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.subjects import encode_key, validate_name


def test_plain_thread_ids_name_their_sections_and_others_are_hashed() -> None:
    assert ThreadSections.of("chat-42").checkpoints == "c_chat-42"
    assert ThreadSections.of("chat-42").all == ("c_chat-42", "b_chat-42", "w_chat-42", "x_chat-42", "o_chat-42")
    hashed = ThreadSections.of("user@example.com/chat 1")
    assert re.fullmatch(r"ch[a-z2-7]{32}", hashed.checkpoints)
    assert ThreadSections.of("x" * 126).token == "_" + "x" * 126
    assert ThreadSections.of("x" * 127).token.startswith("h")
    assert ThreadSections.of("").token.startswith("h")


@given(st.text(max_size=300))
def test_every_thread_id_makes_valid_sections_and_tokens_never_meet(thread_id: str) -> None:
    sections = ThreadSections.of(thread_id)
    for section in sections.all:
        validate_name(section)
    # the plain form starts with "_", the hashed one with "h": no thread id takes another's token
    assert sections.token[0] in "_h"
    if sections.token[0] == "_":
        assert sections.token[1:] == thread_id


def test_thread_ids_may_be_ints_or_uuids_but_nothing_else() -> None:
    assert thread_id_of(7) == "7"
    u = uuid.uuid4()
    assert thread_id_of(u) == str(u)
    for bad in (None, True, 1.5, b"x", ["t"]):
        with pytest.raises(InvalidKeyError):
            thread_id_of(bad)


@given(st.text(max_size=2000), st.text(min_size=1, max_size=200), st.one_of(st.integers(0, 2**40), st.text(max_size=80)))
def test_keys_of_any_namespace_channel_and_version_are_encodable(ns: str, channel: str, version: int | str) -> None:
    checkpoint_id = str(uuid.uuid4())
    for key in (record_key(ns, checkpoint_id), blob_key(ns, channel, version), page_key(ns, 3)):
        encode_key(key)  # within the SDK's key limit whatever the namespace's length
    assert parse_page_key(page_key(ns, 3)) == (ns_token(ns), 3)


def test_versions_of_different_json_types_are_different_blobs() -> None:
    assert blob_key("", "messages", 1) != blob_key("", "messages", "1")
    assert blob_key("", "a", 1) != blob_key("child:1", "a", 1)
    assert ns_token("") == "r" and ns_token("child:1") != ns_token("child:2")
    assert parse_page_key("h-r") is None and parse_page_key("p-r-x") is None


def _pages(ids: list[str], size: int = PAGE_SIZE) -> list[Page]:
    pages: list[Page] = []
    floor: str | None = None
    for n, start in enumerate(range(0, len(ids), size)):
        page = Page("t", "", n, floor, [(i, None) for i in ids[start:start + size]])
        pages.append(page)
        floor = page.top()
    return pages


def _read_newest_first(pages: list[Page | None], before: str | None = None) -> tuple[list[str], list[int]]:
    """The order NewestFirst yields, and how many pages were read when each id came out."""
    order = NewestFirst(before)
    out: list[str] = []
    read_at: list[int] = []
    for n, page in enumerate(reversed(pages), 1):
        order.add(page)
        ready = order.ready()
        out += [i for i, _ in ready]
        read_at += [n] * len(ready)
    rest = order.rest()
    out += [i for i, _ in rest]
    read_at += [len(pages)] * len(rest)
    return out, read_at


def test_newest_first_reads_one_page_for_the_newest_when_ids_arrive_in_order() -> None:
    ids = [f"{i:04d}" for i in range(100)]
    out, read_at = _read_newest_first(list(_pages(ids)))
    assert out == sorted(ids, reverse=True)
    # four pages (32, 32, 32, 4 ids): the newest four come from the newest page alone,
    # the next 32 from one more page
    assert read_at[:4] == [1] * 4 and read_at[4:4 + PAGE_SIZE] == [2] * PAGE_SIZE


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=200, unique=True), st.integers(1, 40),
       st.one_of(st.none(), st.integers(0, 10_000)))
def test_newest_first_orders_ids_appended_out_of_order(values: list[int], size: int, before: int | None) -> None:
    ids = [f"{v:05d}" for v in values]  # appended in this (random) order, as skewed clocks would
    before_id = None if before is None else f"{before:05d}"
    out, _ = _read_newest_first(list(_pages(ids, size)), before_id)
    assert out == sorted((i for i in ids if before_id is None or i < before_id), reverse=True)


def test_newest_first_survives_a_missing_page_and_duplicates() -> None:
    pages: list[Page | None] = list(_pages([f"{i:03d}" for i in range(70)]))
    pages[1] = None  # a page never written (a writer died after moving the head)
    assert pages[2] is not None
    pages[2].ids.append(("050", None))  # a checkpoint put twice
    out, _ = _read_newest_first(pages)
    expected = sorted({f"{i:03d}" for i in range(70)} - {f"{i:03d}" for i in range(32, 64)} | {"050"},
                      reverse=True)
    assert out == expected


def test_pages_round_trip_and_refuse_another_page() -> None:
    page = Page("t", "child:1", 2, "0001", [("0002", "run-1"), ("0003", None)])
    value = page.to_value()
    assert Page.from_value(value, thread_id="t", checkpoint_ns="child:1", number=2) == page
    assert page.top() == "0003" and page.holds("0002") and not page.full
    with pytest.raises(InvalidPayloadError, match="names another page"):
        Page.from_value(value, thread_id="other", checkpoint_ns="child:1", number=2)
    with pytest.raises(InvalidPayloadError, match="malformed"):
        Page.from_value({"thread": "t"}, thread_id="t", checkpoint_ns="child:1", number=2)


def _w(task: str, idx: int, channel: str = "c", value: str = "v", path: str = "") -> StoredWrite:
    return StoredWrite(task, idx, channel, path, {"t": "msgpack", "d": value.encode()})


def test_merge_writes_keeps_regular_writes_and_replaces_special_ones() -> None:
    first = merge_writes([], [_w("a", 0, value="1"), _w("a", write_index(ERROR, 1), ERROR, "boom")])
    again = merge_writes(first, [_w("a", 0, value="other"), _w("a", write_index(ERROR, 1), ERROR, "boom 2")])
    assert [(w.idx, w.value["d"]) for w in again] == [(-1, b"boom 2"), (0, b"1")]
    assert write_index(INTERRUPT, 5) == -3 and write_index("messages", 5) == 5


def test_merged_writes_are_in_writes_sort_key_order() -> None:
    writes = [_w(t, i, path=p) for t, i, p in [("b", 1, "~a"), ("a", 0, "~b"), ("b", 0, "~a"), ("c", 0, "")]]
    random.shuffle(writes)
    merged = merge_writes([], writes)
    assert [(w.task_path, w.task_id, w.idx) for w in merged] == [("", "c", 0), ("~a", "b", 0), ("~a", "b", 1),
                                                                  ("~b", "a", 0)]


def test_stored_writes_refuse_garbage() -> None:
    assert StoredWrite.from_value(_w("a", 0).to_value()) == _w("a", 0)
    for bad in (None, [], ["a", "0", "c", "", {}], ["a", 0, "c", "", "not a payload"], "text"):
        with pytest.raises(InvalidPayloadError):
            StoredWrite.from_value(bad)


def test_thread_token_is_stable() -> None:
    # the layout is on the wire: a token must not change between versions
    assert thread_token("a b") == "hzbuhucfklvxnebcdfd5gu2l2xduw3q2c"
    assert ns_token("child:1") == "nqnnnejbx52kg4rqqnfpwp6rpbp"
