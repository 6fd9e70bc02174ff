"""Hostile wire messages for every subject a worker, the voting code, an inbox or a view consumes.

A strategy draws a *plan* (:class:`Plan`): a base record of one kind, the
mutations made to it (fields spoilt with hostile values, dropped, unknown fields
added, a field nested thousands deep or made huge), its encoding (msgpack, JSON,
or bytes that say one thing and are another), corruption of the bytes (cut,
flipped, garbage around them), odd headers (``Bb-Encoding``, ``KV-Operation``,
``Bb-Base-Revision``, ...) and sometimes an odd subject. A plan is turned into a
:class:`Wire` message by :meth:`Plan.wire` with the context of one run (board,
agent, a serial number), so that ids stay unique across examples while the
draws stay reproducible (the CI profile is derandomized).

Valid messages are drawn too (a plan with no mutation), so "stored" is exercised
as well as "dead-lettered". Each wire names the identity that would write it
(:attr:`Wire.signer`: the record's author as :meth:`Plan.wire` binds it, or a
worker identity for outcomes, applications and close requests), and
``accounting.publish_all`` signs it as that identity, over the bytes published: a
hostile record then reaches the decoders and, when they take it, PostgreSQL, as
an author's own garbage would (the worker checks signatures after decoding).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack
from hypothesis import strategies as st

from blackboard.protocol.errors import InvalidKeyError
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.worker.decode import MemoryRow, RawMessage, decode_memory
from tests._records_strategies import (
    BAD,
    BAD_TIMESTAMPS,
    ODD_NUMBERS,
    ODD_TEXTS,
    deep_wire,
    entry_payloads,
    hostile_values,
    json_values,
    memory_payloads,
    texts,
    timestamps,
)

__all__ = ["KINDS", "Ctx", "Deep", "Plan", "Wire", "args", "materialize", "plans", "plans_of"]

#: What a plan can be about: the consumed subjects.
KINDS = ("entry", "memory", "forget", "direct", "broadcast", "topic",
         "proposal", "ballot", "close", "outcome", "applied")
#: A word every stored text of a run carries, so keyword searches meet the hostile rows.
WORD = "fuzzword"
_PLACEHOLDER = "\u2063deep\u2063"  # an invisible separator: never drawn by a strategy
_DEPTHS = [40, 190, 210, 600, 1_000, 5_000, 20_000]
_HUGE = [10_000, 200_000, 1_000_000, 1_100_000]


@dataclass(frozen=True)
class Ctx:
    """What one run's messages are addressed to (fresh per example)."""

    board: str
    agent: str
    bucket: str = "blackboard"


@dataclass(frozen=True)
class Wire:
    """One message to publish raw, and what was done to it (for reports)."""

    kind: str
    label: str
    subject: str
    data: bytes
    headers: dict[str, str] | None
    #: The id of the memory/proposal (for accounting a memory replaced by a later one), if any.
    ident: str | None = None
    #: Who signs it (its author, or the worker identity), or None: published unsigned.
    signer: str | None = None

    def __repr__(self) -> str:
        head = self.data[:120]
        more = f"...(+{len(self.data) - 120} bytes)" if len(self.data) > 120 else ""
        return f"Wire({self.kind}: {self.label}; {self.subject!r} {self.headers!r} {head!r}{more})"


@dataclass(frozen=True)
class Plan:
    """A drawn hostile message; :meth:`wire` builds it for a context."""

    kind: str
    base: dict[str, Any]
    mutations: tuple[tuple[str, str, Any], ...] = ()
    encoding: str = "msgpack"
    header: tuple[str, str] | None = None
    corruption: tuple[str, int, bytes] | None = None
    odd_subject: int | None = None
    labels: tuple[str, ...] = field(default=())

    def wire(self, ctx: Ctx, serial: int) -> Wire:
        record, subject, ident = _address(self.kind, dict(self.base), ctx, serial)
        deep: bytes | None = None
        for op, name, value in self.mutations:
            if op == "drop":
                record.pop(name, None)
            elif op == "deep":
                depth, kind = value
                record[name] = _PLACEHOLDER
                deep = deep_wire(depth, "json" if self.encoding.startswith("json") else "msgpack", kind)
            elif op == "huge":
                record[name] = "x" * value
            else:  # set / unknown
                record[name] = value
        data = _encode(record, self.encoding, deep)
        if self.corruption is not None:
            data = _corrupt(data, *self.corruption)
        headers: dict[str, str] | None = None
        if self.encoding == "json":
            headers = {"Bb-Encoding": "json"}
        if self.header is not None:
            headers = {**(headers or {}), self.header[0]: self.header[1]}
        if self.odd_subject is not None:
            subject = _odd_subject(self.kind, ctx, serial, self.odd_subject)
        if ident is not None:  # a spoilt id may still be a valid one, shared with another message
            ident = stored_id(subject, data, headers)
        return Wire(self.kind, " ".join(self.labels) or "valid", subject, data, headers, ident,
                    _signer(self.kind, ctx, subject))


#: The identity that writes outcomes, their applications and close requests (the test authority's worker).
WORKER = "worker"


def _signer(kind: str, ctx: Ctx, subject: str) -> str:
    """Who writes a record of ``kind`` as :func:`_address` binds it."""
    if kind in ("entry", "memory", "forget"):
        return ctx.agent
    if kind in ("direct", "broadcast", "topic"):
        return f"{ctx.agent}-peer"
    if kind == "proposal":
        return "v1"
    if kind == "ballot":
        return subject.rsplit(".", 1)[-1]
    return WORKER


def stored_id(subject: str, data: bytes, headers: dict[str, str] | None) -> str | None:
    """The id a memory is stored under, as the worker decodes it (a later memory of that id
    replaces its row); None when it does not decode to a memory."""
    try:
        row = decode_memory(RawMessage(MEMORY_STREAM, 1, subject, headers or {}, data, datetime.now(UTC)),
                            max_bytes=1 << 20, index_chars=1000)
    except Exception:
        return None
    return row.id if isinstance(row, MemoryRow) else None


# -- encoding and corruption ------------------------------------------------------
def _default(obj: Any) -> Any:
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, bytes):
        return obj.decode("latin-1")
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    return repr(obj)


def _encode(record: Any, encoding: str, deep: bytes | None) -> bytes:
    """Encode as told; a value one encoding cannot carry goes in the other (the header then lies)."""
    json_first = encoding.startswith("json")
    data: bytes | None = None
    for enc in (["json", "msgpack"] if json_first else ["msgpack", "json"]):
        try:
            if enc == "json":
                # allow_nan: NaN/Infinity literals, as a non-Python writer may send them.
                data = json.dumps(record, default=_default, ensure_ascii=False).encode("utf-8", "surrogatepass")
                placeholder = json.dumps(_PLACEHOLDER, ensure_ascii=False).encode()
            else:
                data = msgpack.packb(record, use_bin_type=True, default=_default)
                placeholder = msgpack.packb(_PLACEHOLDER, use_bin_type=True)
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError, RecursionError):
            continue
        if deep is not None:
            data = data.replace(placeholder, deep if enc == encoding.split("-")[0] else deep_wire(50, enc))
        return data
    return repr(record).encode("utf-8", "surrogatepass")


def _corrupt(data: bytes, how: str, at: int, junk: bytes) -> bytes:
    n = len(data)
    pos = at % (n + 1)
    if how == "cut":
        return data[:pos]
    if how == "flip":
        if not n:
            return junk
        b = bytearray(data)
        for i, j in enumerate(junk or b"\xff"):
            b[(pos + i * 7) % n] ^= j or 0xFF
        return bytes(b)
    if how == "append":
        return data + (junk or b"\xc1")
    if how == "prepend":
        return (junk or b"\xc1") + data
    if how == "empty":
        return b""
    return junk  # "garbage": replaced


# -- the base records ---------------------------------------------------------------
def _now() -> str:
    return datetime.now(UTC).isoformat()


def _address(kind: str, rec: dict[str, Any], ctx: Ctx, serial: int) -> tuple[dict[str, Any], str, str | None]:
    """The record bound to the run's board and ids, and its subject."""
    b, a = ctx.board, ctx.agent
    if kind == "entry":
        rec["author"] = a  # its signer (a mutation may spoil it)
        return rec, Subjects(ctx.bucket).entry(b, "fz", f"k{serial}"), None
    if kind == "memory":
        ident = f"{b}-m{serial}"
        rec.update(id=ident, board=b, agent=a)
        rec["text"] = f"{WORD} {rec.get('text', '')}"
        return rec, Subjects.memory(b, a), ident
    if kind == "forget":
        rec.update(board=b, agent=a, ids=[f"{b}-m{serial - 1}", f"{b}-gone{serial}"])
        return rec, Subjects.memory(b, a), None
    if kind in ("direct", "broadcast", "topic"):
        rec.update(id=f"{b}-x{serial}", sender=f"{a}-peer", kind=kind)
        if kind == "direct":
            rec["recipients"] = [a]
            subject = Subjects.direct(a)
        elif kind == "broadcast":
            rec["board"] = b
            subject = Subjects.broadcast(b)
        else:
            rec["topic"] = f"{b}.t"
            subject = Subjects.topic(f"{b}.t", pattern=False)
        return rec, subject, None
    pid = f"p{serial}"
    if kind == "proposal":
        rec.update(id=pid, board=b)
    elif kind == "ballot":
        rec["proposal_id"] = pid
    elif kind in ("outcome", "applied"):
        rec.update(proposal_id=pid, board=b)
    # A ballot's subject names its voter: the payload's when it is a valid token (a mutated one
    # goes on v1's subject, where it is a dead letter, as a payload naming another voter is).
    voter = rec.get("voter") if kind == "ballot" else None
    try:
        subject = Subjects.vote(b, pid, kind, voter)
    except InvalidKeyError:
        subject = Subjects.vote(b, pid, kind, "v1")
    return rec, subject, pid if kind == "proposal" else None


def _odd_subject(kind: str, ctx: Ctx, serial: int, which: int) -> str:
    b, a, kv = ctx.board, ctx.agent, f"$KV.{ctx.bucket}"
    options = {
        "entry": [f"{kv}.{b}", f"{kv}.{b}.fz", f"{kv}.{b}.fz.k{serial}.extra", f"{kv}.{b}.fz.=!!{serial}",
                  f"{kv}.{b}.fz.={'A' * 1100}", f"{kv}.{'b' * 200}.fz.k{serial}", f"{kv}.{b}.f!z.k{serial}",
                  f"{kv}.{b}.fz.=_-{serial}"],
        "memory": [f"bb.mem.{b}", f"bb.mem.{b}.{a}.extra", f"bb.mem.{b}.{'a' * 200}", f"bb.mem.{b}.a!b{serial}",
                   f"bb.mem.{b}!.{a}"],
        "direct": [f"bb.msg.agent.{a}.extra", f"bb.msg.nope.{b}", f"bb.msg.agent.{a}x{serial}", f"bb.msg.{b}"],
        "broadcast": [f"bb.msg.board.{b}.x", f"bb.msg.board.{b}x{serial}", f"bb.msg.board.{'b' * 200}"],
        "topic": [f"bb.msg.topic.{b}", f"bb.msg.topic.{b}.t.x{serial}", f"bb.msg.topic.{b}!.t"],
        "vote": [f"bb.vote.{b}.p{serial}", f"bb.vote.{b}.p{serial}.bogus", f"bb.vote.{b}.p{serial}.ballot",
                 f"bb.vote.{b}!.p{serial}.ballot", f"bb.vote.{b}.{'p' * 200}.proposal", f"bb.vote.{b}"],
    }
    group = "memory" if kind == "forget" else kind if kind in options else "vote"
    choices = options[group]
    return choices[which % len(choices)]


_voters = st.lists(st.sampled_from(["v1", "v2", "v3"]), min_size=1, max_size=3, unique=True)


@st.composite
def _message_base(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {"v": 1, "type": draw(st.sampled_from(["note", "task", WORD])),
                           "body": draw(json_values), "created_at": draw(timestamps)}
    for name, strat in {"correlation_id": texts, "reply_to": st.none(), "metadata": st.dictionaries(texts, json_values,
                                                                                                      max_size=3)}.items():
        if draw(st.booleans()):
            rec[name] = draw(strat)
    return rec


def _counts(n: int) -> dict[str, Any]:
    return {"ballots": 1, "votes": [1] + [0] * (n - 1), "reject": 0, "abstain": 0,
            "support": [1.0] + [0.0] * (n - 1), "reject_support": 0.0}


@st.composite
def _base(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    if kind == "entry":
        rec = draw(entry_payloads())
        rec["tags"] = [WORD, *rec.get("tags", [])]
        return rec
    if kind == "memory":
        return draw(memory_payloads())
    if kind == "forget":
        return {"v": 1, "op": "forget", "created_at": draw(timestamps)}
    if kind in ("direct", "broadcast", "topic"):
        return draw(_message_base())
    if kind == "proposal":
        candidates = draw(st.lists(json_values, min_size=1, max_size=3, unique_by=repr))
        now = datetime.now(UTC)
        return {"v": 1, "section": "fz", "key": draw(st.text(min_size=1, max_size=20)), "question": draw(texts),
                "candidates": candidates, "policy": {"kind": draw(st.sampled_from(["majority", "unanimous"]))},
                "voters": draw(_voters), "proposer": "v1", "created_at": now.isoformat(),
                "deadline": draw(st.none() | st.just((now + timedelta(hours=1)).isoformat()))}
    if kind == "ballot":
        return {"v": 1, "id": draw(st.text(min_size=1, max_size=20)), "voter": draw(st.sampled_from(["v1", "v2"])),
                "choice": draw(st.sampled_from([0, 1, "reject", "abstain"])), "reason": draw(st.none() | texts),
                "created_at": _now()}
    if kind == "close":
        return {}
    # outcome / applied
    rec = {"v": 1, "section": "fz", "key": "k", "status": "accepted", "candidate": 0, "value": draw(json_values),
           "closed_by": "decision", "deciding_sequence": 2, "decided_at": _now(), "counts": _counts(2),
           "counted_ballots": [{"sequence": 2, "ballot_id": "b", "voter": "v1", "choice": 0, "weight": 1.0}],
           "superseded_ballots": [], "rejected_ballots": []}
    if kind == "applied":
        rec["revision"] = draw(st.integers(1, 2**40))
    return rec


def _fields(kind: str, base: dict[str, Any]) -> list[str]:
    extra = {"entry": ["value", "tags", "metadata", "author", "created_at", "content_type"],
             "memory": ["text", "tags", "metadata", "importance", "created_at", "kind", "source", "id", "board"],
             "forget": ["ids", "board", "agent", "op"],
             "proposal": ["candidates", "policy", "voters", "deadline", "created_at", "key", "id", "board"],
             "ballot": ["choice", "voter", "id", "proposal_id", "created_at"],
             "outcome": ["value", "counts", "decided_at", "candidate", "status", "board", "counted_ballots"],
             "applied": ["value", "revision", "decided_at", "status", "proposal_id"],
             "close": ["reason"]}.get(kind, ["body", "metadata", "recipients", "type", "id", "created_at", "sender"])
    return sorted({*base, *extra, "v"})


@st.composite
def plans(draw: st.DrawFn, kind: str, *, hostile: bool = True) -> Plan:
    """One message about ``kind``: valid about a third of the time, otherwise made hostile."""
    base = draw(_base(kind))
    labels: list[str] = []
    mutations: list[tuple[str, str, Any]] = []
    if hostile and draw(st.integers(0, 2)) > 0:
        fields = _fields(kind, base)
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["set", "set", "drop", "unknown", "deep", "huge", "time", "number"]))
            name = draw(st.sampled_from(fields))
            if op == "set":
                value = draw(BAD[name] | hostile_values if name in BAD else hostile_values)
            elif op == "unknown":
                name = draw(st.sampled_from(["zz", "later", "$where", "__proto__", "x" * 300]))
                value = draw(hostile_values)
            elif op == "deep":
                value = (draw(st.sampled_from(_DEPTHS)), draw(st.sampled_from(["list", "map"])))
            elif op == "huge":
                value = draw(st.sampled_from(_HUGE))
            elif op == "time":
                op, value = "set", draw(st.sampled_from(BAD_TIMESTAMPS))
            elif op == "number":
                op, value = "set", draw(st.sampled_from(ODD_NUMBERS))
            else:
                value = None
            mutations.append((op, name, value))
            labels.append(f"{op}:{name}" + (f"={value!r:.40}" if op != "drop" else ""))
    encoding = draw(st.sampled_from(["msgpack", "msgpack", "json", "json-unannounced"]))
    if encoding != "msgpack":
        labels.append(encoding)
    header = None
    corruption = None
    odd = None
    if hostile:
        if draw(st.integers(0, 3)) == 3:
            header = draw(st.sampled_from([
                ("Bb-Encoding", "json"), ("Bb-Encoding", "msgpack"), ("Bb-Encoding", "JSON"),
                ("Bb-Encoding", "xml"), ("Bb-Encoding", ""), ("KV-Operation", "DEL"), ("KV-Operation", "PURGE"),
                ("KV-Operation", "del"), ("KV-Operation", "BOGUS"), ("Bb-Base-Revision", "-5"),
                ("Bb-Base-Revision", "abc"), ("Bb-Base-Revision", "99999999999999999999999"),
                ("Nats-Marker-Reason", "MaxAge"), ("Nats-Marker-Reason", "Purge"), ("X-Odd", "\u00e9t\u00e9"),
                ("Bb-Error", "ValueError"), ("Content-Type", "application/x-evil"),
            ]))
            labels.append(f"header:{header[0]}={header[1]}")
        if draw(st.integers(0, 4)) == 4:
            corruption = (draw(st.sampled_from(["cut", "cut", "flip", "append", "prepend", "empty", "garbage"])),
                          draw(st.integers(0, 10_000)), draw(st.binary(max_size=24)))
            labels.append(f"corrupt:{corruption[0]}@{corruption[1]}")
        if draw(st.integers(0, 7)) == 7:
            odd = draw(st.integers(0, 20))
            labels.append(f"subject#{odd}")
    return Plan(kind, base, tuple(mutations), encoding, header, corruption, odd, tuple(labels))


def plans_of(kinds: tuple[str, ...], *, min_size: int, max_size: int) -> st.SearchStrategy[list[Plan]]:
    """A batch of hostile plans over ``kinds``."""
    return st.lists(st.sampled_from(kinds).flatmap(plans), min_size=min_size, max_size=max_size)


@dataclass(frozen=True)
class Deep:
    """Stands for a list nested ``depth`` deep in drawn arguments (hypothesis cannot print the
    value itself); :func:`materialize` builds it just before the call."""

    depth: int

    def build(self) -> Any:
        value: Any = []
        for _ in range(self.depth):
            value = [value]
        return value


def materialize(value: Any) -> Any:
    """``value`` with a :class:`Deep` marker replaced by the nested value it stands for."""
    return value.build() if isinstance(value, Deep) else value


def args(*extra: Any) -> st.SearchStrategy[Any]:
    """Odd arguments for the SDK's public entry points (hostile values, plus huge and deep ones:
    pass each through :func:`materialize`)."""
    return st.one_of(hostile_values, st.sampled_from([*ODD_TEXTS, *extra]),
                     st.sampled_from(_DEPTHS[3:]).map(Deep), st.sampled_from(_HUGE).map(lambda n: "x" * n))


Builder = Callable[[Ctx, int], Wire]
