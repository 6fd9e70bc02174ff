"""Every public SDK entry point fed hostile arguments succeeds or raises one of our errors.

``board.put/create/update``, ``agent.remember``, ``agent.send``, ``board.propose``,
``board.vote`` and ``board.search``/``agent.recall`` are called with generated
arguments: wrong types, NaN and huge integers, NUL and lone surrogates, strings
of a megabyte, values nested thousands deep, odd timestamps. Whatever they do,
the only exceptions allowed out are :class:`BlackboardError` subclasses (the
documented ``TypeError`` of a keyword that is not a filter is not generated).
"""

from __future__ import annotations

import reprlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_sdk import BlackboardError
from tests.fuzz.conftest import FuzzStack
from tests.fuzz.profile import fuzz_settings
from tests.fuzz.strategies import args, materialize

pytestmark = pytest.mark.asyncio

#: A valid value of each argument, drawn in place of a hostile one about half of the time.
_names = st.sampled_from(["fz", "s-1", "A_b"])
_keys = st.sampled_from(["k", "a key/with spaces", "ключ"])


def _maybe(valid: st.SearchStrategy[Any], *extra: Any) -> st.SearchStrategy[Any]:
    return st.one_of(valid, args(*extra))


calls = st.lists(st.one_of(
    st.tuples(st.just("put"), st.fixed_dictionaries({
        "section": _maybe(_names), "key": _maybe(_keys), "value": args(),
    }, optional={"tags": _maybe(st.lists(_names, max_size=2)), "metadata": _maybe(st.just({"a": 1})),
                 "content_type": _maybe(st.just("text/plain")), "ttl": _maybe(st.just(60.0), 0, -1, 10**12),
                 "encoding": st.sampled_from(["msgpack", "json"]) | args()})),
    st.tuples(st.just("create"), st.fixed_dictionaries({"section": _maybe(_names), "key": _maybe(_keys),
                                                        "value": args()})),
    st.tuples(st.just("update"), st.fixed_dictionaries({"section": _maybe(_names), "key": _maybe(_keys),
                                                        "value": args(), "expected_revision": args(1, 0, -1)})),
    st.tuples(st.just("remember"), st.fixed_dictionaries({"text": _maybe(st.just("a memory"))}, optional={
        "kind": _maybe(st.just("semantic")), "tags": _maybe(st.lists(_names, max_size=2)),
        "metadata": _maybe(st.just({"a": 1})), "importance": _maybe(st.just(0.5)), "board": _maybe(_names),
        "source": args(), "id": _maybe(st.just("m1")), "key": _maybe(_keys), "occurred_at": args(),
        "confidence": _maybe(st.just(0.5), 0, 1)})),
    st.tuples(st.just("send"), st.fixed_dictionaries({"to": _maybe(st.just("peer"), ["peer", 1], []),
                                                      "type": _maybe(st.just("note")), "body": args()},
                                                     optional={"correlation_id": args(), "metadata": args(),
                                                               "encoding": st.sampled_from(["json"]) | args()})),
    st.tuples(st.just("propose"), st.fixed_dictionaries({"section": _maybe(_names), "key": _maybe(_keys),
                                                         "candidates": _maybe(st.just(["a", "b"]))},
                                                        optional={"voters": _maybe(st.just(["fuzzer"])),
                                                                  "deadline": args(60, 0.01, -5),
                                                                  "question": args(), "policy": args("majority"),
                                                                  "proposal_id": _maybe(_names)})),
    st.tuples(st.just("vote"), st.fixed_dictionaries({"proposal_id": _maybe(_names), "choice": args(0, "a")},
                                                     optional={"reason": args(), "index": args(True),
                                                               "ballot_id": args()})),
    st.tuples(st.just("search"), st.fixed_dictionaries({"query": args("fuzzword")}, optional={
        "top_k": args(1, 0, -1), "min_score": args(0.5), "mode": args("keyword", "hybrid", "semantic"),
        "tags_any": args(), "since": args(), "metadata": args()})),
    st.tuples(st.just("recall"), st.fixed_dictionaries({"query": args("fuzzword")}, optional={
        "top_k": args(1, 0, -1), "kind": args("episodic"), "until": args(), "mode": args("keyword")})),
), min_size=20, max_size=40)


@fuzz_settings(8)
@given(batch=calls)
async def test_sdk_entry_points_raise_only_typed_errors(fuzz: FuzzStack, batch: list[tuple[str, dict[str, Any]]]
                                                        ) -> None:
    agent = fuzz.agent
    board = agent.board("fs" + uuid.uuid4().hex[:10])
    methods: dict[str, Callable[..., Awaitable[Any]]] = {
        "put": board.put, "create": board.create, "update": board.update, "remember": agent.remember,
        "send": agent.send, "propose": board.propose, "vote": board.vote, "search": board.search,
        "recall": agent.recall,
    }
    raw: list[str] = []
    for name, kwargs in batch:
        try:
            await methods[name](**{k: materialize(v) for k, v in kwargs.items()})
        except BlackboardError:
            pass
        except Exception as exc:
            shown = {k: reprlib.repr(v)[:80] for k, v in kwargs.items()}  # depth-limited
            raw.append(f"{name}({shown}) raised {type(exc).__name__}: {exc!s:.160}")
    assert not raw, "entry points raised outside the error tree:\n" + "\n".join(raw[:15])
