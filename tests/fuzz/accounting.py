"""Publishing hostile messages raw, and accounting for each of them in PostgreSQL.

The invariant of the fuzz suite: every message JetStream acknowledged is, once
the worker has caught up, either stored (a row carrying its stream sequence) or
dead-lettered (a ``bb_dead_letters`` row with its sequence). The exceptions,
by design, are named here: a deadline close request is stored nowhere (it is a
timestamp for the tally), and a memory replaced or forgotten by a later message
of the same id leaves that later message's row.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from nats.js import JetStreamContext

from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects
from tests._worker_helpers import certify, signed_headers, signer
from tests.fuzz.strategies import Wire

__all__ = ["CrashLog", "Published", "account", "publish_all", "report", "unaccounted"]

#: Rows that carry a message's stream sequence, per stream (``%(stream)s``, ``%(seqs)s``).
_STORED = {
    MEMORY_STREAM: """SELECT seq FROM bb_memories WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)
                      UNION SELECT seq FROM bb_memory_forgets WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)
                      -- an exact duplicate, merged into the memory of its text (its provenance row)
                      UNION SELECT seq FROM bb_memory_sources WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)""",
    MESSAGE_STREAM: "SELECT seq FROM bb_messages WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)",
    VOTE_STREAM: """SELECT seq FROM bb_proposals WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)
                    UNION SELECT seq FROM bb_ballots WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)
                    UNION SELECT seq FROM bb_outcomes WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)
                    UNION SELECT applied_seq FROM bb_outcomes WHERE stream = %(stream)s
                                                               AND applied_seq = ANY(%(seqs)s)""",
}
_ENTRIES = "SELECT seq FROM bb_entry_revisions WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)"
_DEAD = "SELECT seq FROM bb_dead_letters WHERE stream = %(stream)s AND seq = ANY(%(seqs)s)"
_REPLACED = """SELECT 1 FROM bb_memories WHERE id = %(id)s AND seq > %(seq)s
               UNION ALL SELECT 1 FROM bb_memory_forgets WHERE id = %(id)s AND seq > %(seq)s"""


@dataclass
class Published:
    """A wire message and what became of it."""

    wire: Wire
    stream: str | None = None
    seq: int | None = None
    #: Why the publish failed (the server or the client refused it), if it did.
    refused: str | None = None
    #: stored, dead, close (consumed, no row by design), replaced, refused, or missing.
    fate: str = "missing"


def _signable(principal: str) -> bool:
    """Whether the test authority issues ``principal`` a credential (a mutated voter may be a
    subject token no identity can have)."""
    try:
        signer(principal)
    except Exception:
        return False
    return True


def _headers(w: Wire, signers: set[str]) -> dict[str, str] | None:
    """The wire's headers, signed by its signer over the bytes published (unsigned when it has
    none, or when a header cannot be signed: a line break in a covered value)."""
    if w.signer is None or w.signer not in signers:
        return w.headers
    try:
        return signed_headers(w.signer, w.subject, w.data, w.headers)
    except InvalidPayloadError:
        return w.headers


async def publish_all(js: JetStreamContext, wires: Sequence[Wire], *, timeout: float = 10.0) -> list[Published]:
    """Publish each message raw, signed by its signer (:attr:`Wire.signer`), and wait for its
    acknowledgement (in order)."""
    signers = {p for p in {w.signer for w in wires if w.signer is not None} if _signable(p)}
    await certify(js, *sorted(signers))
    out: list[Published] = []
    for w in wires:
        p = Published(w)
        try:
            ack = await js.publish(w.subject, w.data, headers=_headers(w, signers), timeout=timeout)
        except Exception as exc:  # refused by the client or the server: not our worker's business
            p.refused = f"{type(exc).__name__}: {exc}"[:200]
            p.fate = "refused"
        else:
            p.stream, p.seq = ack.stream, int(ack.seq)
            if ack.duplicate:
                p.refused, p.fate = "duplicate", "refused"
        out.append(p)
    return out


def _is_close(subject: str) -> bool:
    try:
        return Subjects.parse_vote(subject)[2] == "close"
    except InvalidKeyError:
        return False


def account(dsn: str, published: Sequence[Published], *, max_bytes: int = 1024 * 1024) -> None:
    """Set each acknowledged message's fate from the rows in PostgreSQL."""
    by_stream: dict[str, list[Published]] = {}
    for p in published:
        if p.stream is not None and p.fate != "refused":
            by_stream.setdefault(p.stream, []).append(p)
    with psycopg.connect(dsn) as conn:
        for stream, items in by_stream.items():
            params = {"stream": stream, "seqs": [p.seq for p in items]}
            stored = {r[0] for r in conn.execute(_STORED.get(stream, _ENTRIES), params)}  # type: ignore[arg-type]
            dead = {r[0] for r in conn.execute(_DEAD, params)}
            for p in items:
                if p.seq in dead:
                    p.fate = "dead"
                elif p.seq in stored:
                    p.fate = "stored"
                elif stream == VOTE_STREAM and _is_close(p.wire.subject) and len(p.wire.data) <= max_bytes:
                    p.fate = "close"
                elif stream == MEMORY_STREAM and p.wire.ident and conn.execute(
                        _REPLACED, {"id": p.wire.ident, "seq": p.seq}).fetchone():  # type: ignore[arg-type]
                    p.fate = "replaced"
                else:
                    p.fate = "missing"


def unaccounted(published: Sequence[Published]) -> list[Published]:
    """Acknowledged but neither stored nor dead-lettered (nor consumed by design)."""
    return [p for p in published if p.fate == "missing"]


def report(published: Sequence[Published], limit: int = 12) -> str:
    """The fates counted, and the first messages not accounted for (each a reproducer)."""
    counts = Counter(p.fate for p in published)
    lines = [f"fates: {dict(sorted(counts.items()))}"]
    for p in unaccounted(published)[:limit]:
        lines.append(f"  not stored nor dead-lettered: {p.stream} seq {p.seq}: {p.wire!r}")
    return "\n".join(lines)


class CrashLog(logging.Handler):
    """Collects the worker supervisor's "<component> crashed; restarting" records.

    (A message the per-message guard dead-letters after an unexpected exception is
    logged at ERROR too, but it is contained: the invariant holds for it.)
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "crashed" not in record.getMessage():
            return
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {str(record.exc_info[1])[:200]})"
        self.records.append(text)
