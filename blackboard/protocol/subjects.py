"""Every subject, KV key, stream name and header name of the wire protocol.

This is the only module that formats subject strings. Each kind of name has one
function, and every token is validated here, including the safe, reversible
encoding of arbitrary user keys (URLs, file paths, free text) into KV key
tokens.

Layout (``<bucket>`` defaults to ``blackboard``)::

    $KV.<bucket>.<board>.<section>.<key-token>      board entries (one KV bucket)
    bb.mem.<board>.<agent>                          long-term memories to persist
    bb.msg.agent.<agent>                            direct messages (durable inbox)
    bb.msg.board.<board>                            broadcasts to a board's agents
    bb.msg.topic.<topic tokens...>                  topic messages
    bb.rpc.<agent>                                  request/reply (core NATS)
    inbox-<agent>                                   an agent's durable inbox consumer on BB_MSG
    bb.vote.<board>.<proposal>.proposal|close|outcome|applied   consensus voting
    bb.vote.<board>.<proposal>.ballot.<voter>       a ballot (the subject's voter is authoritative)
    bb.search.<principal>.<endpoint>                search micro service (as that principal)
    bb.inbox.<principal>                            inbox administration (the system service)
    bb.keys.cert.<public key>                       an identity's certificate (its user JWT; stream BB_KEYS)
    bb.keys.revocations                             the revoked signing keys (operators only)
    <worker>-<handler>                              the worker's durable consumer of one stream

JetStream API and reply subjects (formatted and parsed here too)::

    $JS.API.DIRECT.GET.<stream>[.<subject>]         direct get (by sequence, or last of a subject)
    $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>   pull request
    $JS.API.CONSUMER.RESET.<stream>.<consumer>      reset a consumer to its ack floor
    $JS.ACK.[<domain>.<account>.]<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>[...]
                                                    a delivered message's reply (ack) subject

The subscription pattern algebra (:func:`subject_matches`, :func:`pattern_covers`,
:func:`patterns_overlap`) follows the NATS wildcard rules (``*`` one token,
trailing ``>`` one or more).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from blackboard.protocol.errors import InvalidKeyError

__all__ = [
    "INBOX_SERVICE",
    "KEYS_STREAM",
    "MAX_KEY_TOKEN_LENGTH",
    "MEMORY_STREAM",
    "MESSAGE_STREAM",
    "RPC_QUEUE_GROUP",
    "SEARCH_SERVICE",
    "VOTE_KINDS",
    "VOTE_STREAM",
    "Grants",
    "Header",
    "KeyParts",
    "Subjects",
    "VoteSubject",
    "decode_key",
    "encode_key",
    "parse_ttl",
    "pattern_covers",
    "pattern_regex",
    "patterns_overlap",
    "subject_matches",
    "validate_name",
    "validate_user_key",
]

#: Tokens used for boards, sections, agent ids, proposal ids and topics
#: (always ``fullmatch``: ``$`` alone would let a trailing newline through).
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: A user key that is already a safe token is kept as it is (readable in the
#: ``nats`` CLI); anything else is ``=`` followed by unpadded base64url of its
#: UTF-8 bytes. ``=`` cannot occur in a plain token, so decoding is unambiguous.
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
#: ``bb.mem.<board>.<agent>``, both tokens valid names, in one match (the ingest hot path).
#: A user public nkey: ``U`` and 55 more base32 characters (its checksum is checked with the certificate).
_USER_KEY_RE = re.compile(r"U[A-Z2-7]{55}")
_MEMORY_RE = re.compile(r"bb\.mem\.([A-Za-z0-9_-]{1,128})\.([A-Za-z0-9_-]{1,128})")
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ENCODED_PREFIX = "="
MAX_KEY_TOKEN_LENGTH = 1024

MEMORY_STREAM = "BB_MEMORY"
MESSAGE_STREAM = "BB_MSG"
VOTE_STREAM = "BB_VOTE"
#: The key registry: identities' certificates and the revocations (docs/security.md, "Signatures").
KEYS_STREAM = "BB_KEYS"
#: Message kinds of a proposal's subjects (see docs/voting.md): the proposal,
#: ballots, deadline close requests, the recorded outcome and its application.
VOTE_KINDS = ("proposal", "ballot", "close", "outcome", "applied")


class VoteSubject(NamedTuple):
    """A parsed vote subject (:meth:`Subjects.parse_vote`); ``voter`` is set for ballots only."""

    board: str
    proposal_id: str
    kind: str
    voter: str | None = None

SEARCH_SERVICE = "blackboard-search"
#: The inbox administration service of the system (``bb.inbox.<agent>``), also its queue group.
INBOX_SERVICE = "blackboard-inbox"
#: Queue group of request handlers on ``bb.rpc.<agent>`` (processes of one agent share the load).
RPC_QUEUE_GROUP = "bb-rpc"


class Header(StrEnum):
    """Header names used on the wire."""

    #: ``msgpack`` (default when absent) or ``json``: encoding of the payload.
    ENCODING = "Bb-Encoding"
    #: KV operation marker, as in the JetStream KV protocol: ``DEL`` or ``PURGE``.
    KV_OPERATION = "KV-Operation"
    ROLLUP = "Nats-Rollup"
    #: Set by the server on a *subject delete marker*: the empty message it
    #: places when a key's last message is removed by its ``Nats-TTL`` or the
    #: stream's max age (streams with ``subject_delete_marker_ttl``). A reader
    #: takes it as a purge of the key.
    MARKER_REASON = "Nats-Marker-Reason"
    EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
    MSG_ID = "Nats-Msg-Id"
    MSG_TTL = "Nats-TTL"
    #: Set by the server on messages served by direct get and consumers.
    SEQUENCE = "Nats-Sequence"
    SUBJECT = "Nats-Subject"
    TIMESTAMP = "Nats-Time-Stamp"
    STATUS = "Status"
    #: Text of a status reply (e.g. ``Consumer Deleted``).
    DESCRIPTION = "Description"
    #: On a pull request's end-of-request status: how many of its messages were not sent.
    PENDING_MESSAGES = "Nats-Pending-Messages"
    #: On a push consumer's idle heartbeat (status 100): the last consumer and stream
    #: sequences it has delivered up to, and, when it is stalled, the flow-control reply
    #: subject it waits for.
    LAST_CONSUMER = "Nats-Last-Consumer"
    LAST_STREAM = "Nats-Last-Stream"
    CONSUMER_STALLED = "Nats-Consumer-Stalled"
    #: Set on an error reply of a request handler: the error class name.
    ERROR = "Bb-Error"
    #: The ``nats.micro`` error headers of a service's error reply: text and code.
    SERVICE_ERROR = "Nats-Service-Error"
    SERVICE_ERROR_CODE = "Nats-Service-Error-Code"
    #: On an object's metadata (object store): the media type of its bytes.
    CONTENT_TYPE = "Content-Type"
    #: On a recorded vote outcome: the target entry's revision when it was
    #: recorded (0: absent); the accepted value is written after it.
    BASE_REVISION = "Bb-Base-Revision"
    #: A record's signature (docs/protocol.md, "Signatures"): the signer's public
    #: nkey (``U...``), the signed write time (decimal microseconds since the Unix
    #: epoch) and the Ed25519 signature (unpadded base64url).
    SIG_KEY = "Bb-Sig-Key"
    SIG_TIME = "Bb-Sig-Time"
    SIG = "Bb-Sig"
    #: On a record signed in a batch: its Merkle path to the batch's signed root
    #: (``L``/``R`` and a sibling hash, unpadded base64url, per step, joined by ``.``).
    SIG_PATH = "Bb-Sig-Path"
    #: W3C trace context (docs/observability.md, "Tracing"): the writer's span, for the
    #: reader's span to join its trace; not covered by the signature.
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"


#: Units of a Go duration, as nats-server reads ``Nats-TTL`` (e.g. ``90s``, ``1h30m``, ``1.5h``).
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_ttl(value: str) -> float | None:
    """Seconds of a ``Nats-TTL`` header value (an integer of seconds or a Go duration);
    None for ``never`` or a value nats-server would not accept either (no expiry)."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    if not value or value == "never":
        return None
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(value):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(value) and total > 0 else None


def _shown(value: object) -> str:
    """A refused token as an error shows it: a string as it is, anything else by its
    type (``str()`` of a value nested thousands deep would raise RecursionError)."""
    return value if isinstance(value, str) else f"<{type(value).__name__}>"


def validate_name(value: str, what: str = "name") -> str:
    """Check a board, section, agent, proposal or topic token.

    Raises:
        InvalidKeyError: the token is empty, too long or has characters outside
            ``[A-Za-z0-9_-]``.
    """
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidKeyError(
            _shown(value), f"{what} must be 1-128 characters of letters, digits, '_' or '-'"
        )
    return value


def validate_user_key(value: str) -> str:
    """Check the form of a user public nkey (``U`` + 55 base32 characters; 56 in all).

    Raises:
        InvalidKeyError: anything else.
    """
    if not isinstance(value, str) or not _USER_KEY_RE.fullmatch(value):
        raise InvalidKeyError(_shown(value), "not a user public key (U and 55 base32 characters)")
    return value


def encode_key(key: str) -> str:
    """Encode an arbitrary user key into one KV key token (reversible).

    Raises:
        InvalidKeyError: the key is empty, not a string, or too long once encoded.
    """
    if not isinstance(key, str) or key == "":
        raise InvalidKeyError(_shown(key), "a key must be a non-empty string")
    if _PLAIN_KEY_RE.fullmatch(key):
        return key
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(key, "a key must be valid UTF-8 text") from exc
    token = _ENCODED_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(token) > MAX_KEY_TOKEN_LENGTH:
        raise InvalidKeyError(
            key[:64] + "...", f"key is too long ({len(token)} > {MAX_KEY_TOKEN_LENGTH} once encoded)"
        )
    return token


def decode_key(token: str) -> str:
    """Invert :func:`encode_key`.

    Raises:
        InvalidKeyError: the token is not a valid encoded key.
    """
    if not token.startswith(_ENCODED_PREFIX):
        if _PLAIN_KEY_RE.fullmatch(token):
            return token
        raise InvalidKeyError(token, "not a valid key token")
    body = token[1:]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidKeyError(token, "not a valid encoded key token") from exc


# -- subscription patterns (pure) --------------------------------------------
def subject_matches(subject: str, pattern: str) -> bool:
    """Whether a concrete ``subject`` matches a NATS ``pattern`` (``*``, trailing ``>``)."""
    s = subject.split(".")
    p = pattern.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(s) == len(p)


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every subject matched by ``inner`` is matched by ``outer``."""
    o = outer.split(".")
    n = inner.split(".")
    for i, tok in enumerate(o):
        if tok == ">":
            return len(n) > i
        if i >= len(n) or n[i] == ">":
            return False
        if tok != "*" and (n[i] == "*" or n[i] != tok):
            return False
    return len(n) == len(o)


def patterns_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both patterns."""
    x = a.split(".")
    y = b.split(".")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False
        if x[i] == ">" or y[i] == ">":
            return True
        if x[i] != y[i] and x[i] != "*" and y[i] != "*":
            return False
    return True


def pattern_regex(pattern: str) -> str:
    """A POSIX regular expression (PostgreSQL's ``~``) matching exactly the subjects that the
    NATS ``pattern`` matches (:func:`subject_matches`): anchored, literal tokens escaped,
    ``*`` one token, a trailing ``>`` one or more."""
    out = []
    tokens = pattern.split(".")
    for i, tok in enumerate(tokens):
        if tok == ">" and i == len(tokens) - 1:
            out.append(r"[^.]+(\.[^.]+)*")
        elif tok == "*":
            out.append(r"[^.]+")
        else:
            out.append(re.escape(tok))
    return "^" + r"\.".join(out) + "$"


@dataclass(frozen=True, slots=True)
class KeyParts:
    """A board entry's address, decoded from a KV subject or key."""

    board: str
    section: str
    key: str


class Subjects:
    """Builds the names of one deployment (the KV bucket comes from settings)."""

    __slots__ = ("_sections", "bucket", "kv_prefix", "kv_stream")

    def __init__(self, bucket: str = "blackboard") -> None:
        self.bucket = validate_name(bucket, "bucket")
        self.kv_stream = f"KV_{bucket}"
        self.kv_prefix = f"$KV.{bucket}."
        #: validated "<board>.<section>." prefixes (bounded cache of the hot path)
        self._sections: dict[tuple[str, str], str] = {}

    def _section_prefix(self, board: str, section: str) -> str:
        try:
            prefix = self._sections.get((board, section))
        except TypeError:  # an unhashable board or section (a dict, a list): refused below
            prefix = None
        if prefix is None:
            prefix = f"{validate_name(board, 'board')}.{validate_name(section, 'section')}."
            if len(self._sections) >= 4096:
                self._sections.clear()
            self._sections[(board, section)] = prefix
        return prefix

    # -- board entries -------------------------------------------------
    def kv_key(self, board: str, section: str, key: str) -> str:
        """The KV key ``board.section.key-token``."""
        return self._section_prefix(board, section) + encode_key(key)

    def entry(self, board: str, section: str, key: str) -> str:
        """The subject of one entry: ``$KV.<bucket>.<board>.<section>.<token>``."""
        return self.kv_prefix + self.kv_key(board, section, key)

    def entry_filter(self, board: str | None = None, section: str | None = None, key: str | None = None) -> str:
        """A subject filter for a watch or listing.

        ``None`` for the board means every board; ``None`` for the section every
        section of the board; ``None`` for the key every key of the section.
        """
        if board is None:
            if section is not None or key is not None:
                raise InvalidKeyError(_shown(section or key), "a section or key needs a board")
            return self.kv_prefix + ">"
        validate_name(board, "board")
        if section is None:
            if key is not None:
                return f"{self.kv_prefix}{board}.*.{encode_key(key)}"
            return f"{self.kv_prefix}{board}.>"
        validate_name(section, "section")
        if key is None:
            return f"{self.kv_prefix}{board}.{section}.*"
        return f"{self.kv_prefix}{board}.{section}.{encode_key(key)}"

    def parse_entry(self, subject: str) -> KeyParts:
        """Decode an entry subject (or a bare KV key) into its parts.

        Raises:
            InvalidKeyError: the subject is not an entry subject of this bucket.
        """
        rest = subject[len(self.kv_prefix):] if subject.startswith(self.kv_prefix) else subject
        parts = rest.split(".")
        if len(parts) != 3:
            raise InvalidKeyError(subject, "not a board entry subject")
        return KeyParts(parts[0], parts[1], decode_key(parts[2]))

    # -- long-term memory ----------------------------------------------
    @staticmethod
    def memory(board: str, agent: str) -> str:
        return f"bb.mem.{validate_name(board, 'board')}.{validate_name(agent, 'agent')}"

    @staticmethod
    def parse_memory(subject: str) -> tuple[str, str]:
        """Split a memory subject into ``(board, agent)``, both validated.

        Raises:
            InvalidKeyError: not a ``bb.mem.<board>.<agent>`` subject with valid names.
        """
        m = _MEMORY_RE.fullmatch(subject)
        if m is None:
            raise InvalidKeyError(subject, "not a memory subject bb.mem.<board>.<agent>")
        board, agent = m.groups()
        return board, agent

    @staticmethod
    def memory_all() -> str:
        return "bb.mem.>"

    @staticmethod
    def memory_board(board: str) -> str:
        """Every agent's memories on one board (a consumer's filter)."""
        return f"bb.mem.{validate_name(board, 'board')}.*"

    # -- the key registry (BB_KEYS) ---------------------------------------
    @staticmethod
    def key_certificate(public_key: str) -> str:
        """``bb.keys.cert.<public key>``: the certificate (user JWT) of a signing key.

        Raises:
            InvalidKeyError: not a user public nkey (``U`` + 55 base32 characters).
        """
        return f"bb.keys.cert.{validate_user_key(public_key)}"

    @staticmethod
    def key_revocations() -> str:
        """``bb.keys.revocations``: the revoked signing keys (the last message wins)."""
        return "bb.keys.revocations"

    @staticmethod
    def keys_all() -> str:
        """Every subject of the key registry stream ``BB_KEYS``."""
        return "bb.keys.>"

    @staticmethod
    def certificate_msg_id(public_key: str, digest: str) -> str:
        """``Nats-Msg-Id`` of a certificate's publication (``digest``: of the certificate's
        text): publishing the same certificate again within the duplicate window is dropped."""
        return f"bb-cert:{validate_user_key(public_key)}:{validate_name(digest, 'digest')}"

    @staticmethod
    def revocations_msg_id(digest: str) -> str:
        """``Nats-Msg-Id`` of a revocations record's publication (``digest``: of its bytes)."""
        return f"bb-revocations:{validate_name(digest, 'digest')}"

    # -- messages --------------------------------------------------------
    @staticmethod
    def direct(agent: str) -> str:
        return f"bb.msg.agent.{validate_name(agent, 'agent')}"

    @staticmethod
    def broadcast(board: str) -> str:
        return f"bb.msg.board.{validate_name(board, 'board')}"

    @staticmethod
    def topic(topic: str, *, pattern: bool = True) -> str:
        """A topic subject; ``topic`` is dot-separated tokens, e.g. ``build.failed``.

        Patterns for subscriptions may use ``*`` and a trailing ``>``;
        ``pattern=False`` (publishing) refuses wildcards.
        """
        if not isinstance(topic, str):
            raise InvalidKeyError(_shown(topic), "a topic must be a string")
        tokens = topic.split(".")
        for i, tok in enumerate(tokens):
            if pattern and (tok == "*" or (tok == ">" and i == len(tokens) - 1)):
                continue
            validate_name(tok, "topic token")
        return "bb.msg.topic." + topic

    @staticmethod
    def inbox_consumer(agent: str) -> str:
        """The durable consumer on ``BB_MSG`` that is ``agent``'s inbox: ``inbox-<agent>``."""
        return f"inbox-{validate_name(agent, 'agent')}"

    @staticmethod
    def inbox_start_key(filter_subject: str) -> str:
        """Consumer metadata key holding the stream sequence a filter was added at."""
        return f"bb.start:{filter_subject}"

    @staticmethod
    def consumer_reset_api(stream: str, consumer: str) -> str:
        """The JetStream API subject that resets a consumer to its ack floor (nats-server 2.14+)."""
        # Both names come from this module (stream constants, inbox_consumer).
        return f"$JS.API.CONSUMER.RESET.{stream}.{consumer}"

    @staticmethod
    def objects_stream(bucket: str) -> str:
        """The stream behind an object store bucket: ``OBJ_<bucket>``."""
        return f"OBJ_{bucket}"

    @staticmethod
    def worker_consumer(group: str, handler: str) -> str:
        """The durable consumer a worker group's handler reads its stream with: ``<group>-<handler>``
        (every worker of the group shares it)."""
        return f"{validate_name(group, 'worker group')}-{validate_name(handler, 'handler name')}"

    @staticmethod
    def consumer_create_api(stream: str, name: str, filter_subject: str) -> str:
        """The JetStream API subject creating consumer ``name`` with one filter subject:
        ``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``. The filter is in the subject,
        so the server's permissions check it (it refuses a body whose filter differs)."""
        return f"$JS.API.CONSUMER.CREATE.{stream}.{validate_name(name, 'consumer name')}.{filter_subject}"

    @staticmethod
    def consumer_next_api(stream: str, consumer: str) -> str:
        """The JetStream API subject of a pull request (``$JS.API.CONSUMER.MSG.NEXT``)."""
        return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"

    @staticmethod
    def reply_inbox(prefix: str, token: str) -> str:
        """A reply subject under a client's reply subscription; ``token="*"`` gives that subscription."""
        return f"{prefix}.{token if token == '*' else validate_name(token, 'reply token')}"

    @staticmethod
    def messages_all() -> str:
        return "bb.msg.>"

    @staticmethod
    def rpc(agent: str) -> str:
        return f"bb.rpc.{validate_name(agent, 'agent')}"

    # -- voting ----------------------------------------------------------
    @staticmethod
    def vote(board: str, proposal_id: str, kind: str, voter: str | None = None) -> str:
        """``bb.vote.<board>.<proposal>.<kind>``, or ``bb.vote.<board>.<proposal>.ballot.<voter>``.

        ``kind`` is one of :data:`VOTE_KINDS`; a ballot's subject carries its
        voter (6 tokens), every other kind has none (5 tokens).

        Raises:
            InvalidKeyError: an invalid token, a ballot without voter, or a voter on another kind.
        """
        if kind not in VOTE_KINDS:
            raise InvalidKeyError(kind, f"vote subject kind must be one of {', '.join(VOTE_KINDS)}")
        base = f"bb.vote.{validate_name(board, 'board')}.{validate_name(proposal_id, 'proposal id')}.{kind}"
        if kind == "ballot":
            if voter is None:
                raise InvalidKeyError(base, "a ballot subject names its voter")
            return f"{base}.{validate_name(voter, 'voter')}"
        if voter is not None:
            raise InvalidKeyError(base, f"a {kind} subject has no voter")
        return base

    @staticmethod
    def parse_vote(subject: str) -> VoteSubject:
        """Split a vote subject into ``(board, proposal_id, kind, voter)`` (``voter`` is ``None``
        except for a ballot).

        Raises:
            InvalidKeyError: not a ``bb.vote.<board>.<proposal>.<kind>`` subject (with
                ``.<voter>`` after ``ballot``, and only there).
        """
        parts = subject.split(".")
        if len(parts) not in (5, 6) or parts[:2] != ["bb", "vote"] or parts[4] not in VOTE_KINDS \
                or (len(parts) == 6) != (parts[4] == "ballot"):
            raise InvalidKeyError(subject, "not a vote subject")
        voter = validate_name(parts[5], "voter") if len(parts) == 6 else None
        return VoteSubject(validate_name(parts[2], "board"), validate_name(parts[3], "proposal id"), parts[4], voter)

    @staticmethod
    def vote_filter(board: str | None = None, proposal_id: str | None = None) -> str:
        """Every vote subject (``bb.vote.>``), a board's (``bb.vote.<board>.>``) or one
        proposal's (``bb.vote.<board>.<proposal>.>``: ballots have 6 tokens, so never ``.*``)."""
        if board is None:
            return "bb.vote.>"
        validate_name(board, "board")
        if proposal_id is None:
            return f"bb.vote.{board}.>"
        return f"bb.vote.{board}.{validate_name(proposal_id, 'proposal id')}.>"

    @staticmethod
    def votes_all() -> str:
        return "bb.vote.>"

    @staticmethod
    def close_msg_id(board: str, proposal_id: str, second: int) -> str:
        """``Nats-Msg-Id`` of a deadline close request: closers within one second are deduplicated."""
        return f"bb-close:{validate_name(board, 'board')}.{validate_name(proposal_id, 'proposal id')}:{int(second)}"

    @staticmethod
    def apply_msg_id(board: str, proposal_id: str) -> str:
        """``Nats-Msg-Id`` of the board write applying a proposal's outcome (one application per proposal)."""
        return f"bb-apply:{validate_name(board, 'board')}.{validate_name(proposal_id, 'proposal id')}"

    # -- JetStream API ------------------------------------------------------
    @staticmethod
    def direct_get(stream: str, last_by_subject: str | None = None) -> str:
        """The direct-get API subject of a stream (optionally: the last message of a subject)."""
        base = f"$JS.API.DIRECT.GET.{stream}"
        return base if last_by_subject is None else f"{base}.{last_by_subject}"

    @staticmethod
    def parse_ack(reply: str) -> tuple[str, int, datetime]:
        """Stream, stream sequence and server time of a JetStream message, from its reply (ack) subject.

        ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>``
        (9 tokens), or the domain form with ``<domain>.<account hash>`` after
        ``ACK`` (11 tokens, newer servers add a random one). JetStream stamps
        messages in nanoseconds; the time is truncated to microseconds with
        integer arithmetic (exact, where nats-py's ``metadata.timestamp`` goes
        through a float and may be 1 µs off). A plain tuple: this runs once per
        ingested message.

        Raises:
            InvalidKeyError: not a JetStream ack subject.
        """
        tokens = reply.split(".")
        n = len(tokens)
        if n >= 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
            try:  # two literal branches: ~40 ns faster than computed indexes
                if n == 9:
                    return tokens[2], int(tokens[5]), _UNIX_EPOCH + timedelta(microseconds=int(tokens[7]) // 1000)
                if n >= 11:
                    return tokens[4], int(tokens[7]), _UNIX_EPOCH + timedelta(microseconds=int(tokens[9]) // 1000)
            except ValueError:
                pass
        raise InvalidKeyError(reply, "not a JetStream ack subject")

    # -- the system service: search, inbox administration --------------------
    @staticmethod
    def search(principal: str, endpoint: str) -> str:
        """A search request as ``principal``: ``bb.search.<principal>.<endpoint>`` (the server lets
        only that principal publish there; the service reads it back with :meth:`parse_search`)."""
        return f"bb.search.{validate_name(principal, 'principal')}.{validate_name(endpoint, 'endpoint')}"

    @staticmethod
    def search_endpoint(endpoint: str) -> str:
        """What the search service's ``endpoint`` listens on: ``bb.search.*.<endpoint>``."""
        return f"bb.search.*.{validate_name(endpoint, 'endpoint')}"

    @staticmethod
    def parse_search(subject: str) -> tuple[str, str]:
        """``(principal, endpoint)`` of a search request's subject.

        Raises:
            InvalidKeyError: not a ``bb.search.<principal>.<endpoint>`` subject with valid names.
        """
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != "bb" or parts[1] != "search":
            raise InvalidKeyError(subject, "not a search subject bb.search.<principal>.<endpoint>")
        return validate_name(parts[2], "principal"), validate_name(parts[3], "endpoint")

    @staticmethod
    def inbox_admin(principal: str) -> str:
        """An inbox administration request as ``principal``: ``bb.inbox.<principal>``."""
        return f"bb.inbox.{validate_name(principal, 'principal')}"

    @staticmethod
    def inbox_admin_all() -> str:
        """What the inbox administration endpoint listens on: ``bb.inbox.*``."""
        return "bb.inbox.*"

    @staticmethod
    def parse_inbox_admin(subject: str) -> str:
        """The principal of an inbox administration request's subject.

        Raises:
            InvalidKeyError: not a ``bb.inbox.<principal>`` subject with a valid name.
        """
        parts = subject.split(".")
        if len(parts) != 3 or parts[0] != "bb" or parts[1] != "inbox":
            raise InvalidKeyError(subject, "not an inbox administration subject bb.inbox.<principal>")
        return validate_name(parts[2], "principal")

    @staticmethod
    def parse_message_filter(subject: str) -> tuple[str, str]:
        """What a ``BB_MSG`` filter subject selects: ``("direct", agent)``, ``("broadcast", board)``
        or ``("topic", topic pattern)``.

        Raises:
            InvalidKeyError: anything else (``bb.msg.>``, a wildcard agent or board, another stream's
                subject, an invalid token).
        """
        if not isinstance(subject, str):
            raise InvalidKeyError(_shown(subject), "a message filter must be a string")
        parts = subject.split(".", 3)
        if len(parts) == 4 and parts[0] == "bb" and parts[1] == "msg":
            if parts[2] == "agent":
                return "direct", validate_name(parts[3], "agent")
            if parts[2] == "board":
                return "broadcast", validate_name(parts[3], "board")
            if parts[2] == "topic":
                Subjects.topic(parts[3])
                return "topic", parts[3]
        raise InvalidKeyError(subject, "not a direct, broadcast or topic subject of BB_MSG")


# -- permission patterns (blackboard/security/permissions.py renders them into user JWTs) --
def _grant_token(value: str, what: str) -> str:
    """A board or principal token of a permission pattern: a name, or ``*`` for every one."""
    return value if value == "*" else validate_name(value, what)


class Grants:
    """Subject patterns of the permissions an identity is granted (docs/security.md).

    Each pattern is one a NATS user permission allows; ``board`` may be ``*``
    (every board). Built here, like every other subject.
    """

    __slots__ = ("bucket", "kv_prefix", "kv_stream", "objects_bucket")

    def __init__(self, bucket: str = "blackboard", objects_bucket: str = "blackboard-objects") -> None:
        self.bucket = validate_name(bucket, "bucket")
        self.kv_stream = f"KV_{bucket}"
        self.kv_prefix = f"$KV.{bucket}"
        self.objects_bucket = validate_name(objects_bucket, "objects bucket")

    # board entries
    def entries(self, board: str) -> str:
        """Write (publish) every key of a board: ``$KV.<bucket>.<board>.>``."""
        return f"{self.kv_prefix}.{_grant_token(board, 'board')}.>"

    def entry_get(self, board: str) -> str:
        """Direct get (last by subject) of a board's keys."""
        return f"$JS.API.DIRECT.GET.{self.kv_stream}.{self.entries(board)}"

    def entry_consumer(self, board: str) -> str:
        """Create a consumer (named, one filter inside the board) on the board stream."""
        return f"$JS.API.CONSUMER.CREATE.{self.kv_stream}.*.{self.entries(board)}"

    # votes
    @staticmethod
    def votes(board: str) -> str:
        return f"bb.vote.{_grant_token(board, 'board')}.>"

    def vote_get(self, board: str) -> str:
        return f"$JS.API.DIRECT.GET.{VOTE_STREAM}.{self.votes(board)}"

    def vote_consumer(self, board: str) -> str:
        return f"$JS.API.CONSUMER.CREATE.{VOTE_STREAM}.*.{self.votes(board)}"

    @staticmethod
    def proposals(board: str) -> str:
        return f"bb.vote.{_grant_token(board, 'board')}.*.proposal"

    @staticmethod
    def ballots(board: str, voter: str) -> str:
        """A voter's own ballots on a board's proposals (the voter is the subject's last token)."""
        return f"bb.vote.{_grant_token(board, 'board')}.*.ballot.{validate_name(voter, 'voter')}"

    # memories and messages
    @staticmethod
    def memory_reads(board: str) -> list[str]:
        """Read a board's memories from the memory stream (consumers with the filter in the API
        subject, last-by-subject direct gets)."""
        pattern = f"bb.mem.{_grant_token(board, 'board')}.>"
        return [f"$JS.API.CONSUMER.CREATE.{MEMORY_STREAM}.*.{pattern}",
                f"$JS.API.DIRECT.GET.{MEMORY_STREAM}.{pattern}"]

    @staticmethod
    def memories(board: str, agent: str) -> str:
        return f"bb.mem.{_grant_token(board, 'board')}.{validate_name(agent, 'agent')}"

    @staticmethod
    def broadcasts(board: str) -> str:
        return f"bb.msg.board.{_grant_token(board, 'board')}"

    @staticmethod
    def direct_messages(agent: str) -> str:
        """``bb.msg.agent.<agent>``; ``*``: to any agent."""
        return f"bb.msg.agent.{_grant_token(agent, 'agent')}"

    @staticmethod
    def topics(pattern: str) -> str:
        """``bb.msg.topic.<pattern>`` (``>`` for every topic)."""
        return "bb.msg.topic.>" if pattern == ">" else Subjects.topic(pattern)

    @staticmethod
    def rpc(agent: str) -> str:
        return f"bb.rpc.{_grant_token(agent, 'agent')}"

    @staticmethod
    def inbox_api(agent: str) -> list[str]:
        """Pull, ack, info and reset of the agent's own durable inbox consumer."""
        consumer = Subjects.inbox_consumer(agent)
        return [f"$JS.API.CONSUMER.MSG.NEXT.{MESSAGE_STREAM}.{consumer}",
                f"$JS.API.CONSUMER.INFO.{MESSAGE_STREAM}.{consumer}",
                f"$JS.API.CONSUMER.RESET.{MESSAGE_STREAM}.{consumer}",
                f"$JS.ACK.{MESSAGE_STREAM}.{consumer}.>"]

    # the system service
    @staticmethod
    def search(principal: str) -> str:
        """Search requests as ``principal``: ``bb.search.<principal>.*``."""
        return f"bb.search.{validate_name(principal, 'principal')}.*"

    @staticmethod
    def inbox_admin(principal: str) -> str:
        """Inbox administration requests as ``principal``: ``bb.inbox.<principal>``."""
        return f"bb.inbox.{validate_name(principal, 'principal')}"

    # the key registry
    @staticmethod
    def key_reads() -> list[str]:
        """Direct gets of the key registry (any certificate, the revocations), and one-shot
        consumers of one certificate (named, the filter in the subject: what a reader asks when
        a replica behind answered 404)."""
        return [f"$JS.API.DIRECT.GET.{KEYS_STREAM}.bb.keys.>",
                f"$JS.API.CONSUMER.CREATE.{KEYS_STREAM}.*.bb.keys.cert.*"]

    @staticmethod
    def key_revocations() -> str:
        """Subscribe to revocation news (``bb.keys.revocations``)."""
        return Subjects.key_revocations()

    @staticmethod
    def own_certificate(public_key: str) -> str:
        """Publish the certificate of one's own key: ``bb.keys.cert.<public key>``."""
        return Subjects.key_certificate(public_key)

    # replies and the JetStream API
    @staticmethod
    def reply_prefix(principal: str) -> str:
        """The reply-inbox prefix of a principal's connections: ``_INBOX.<principal>``."""
        return f"_INBOX.{validate_name(principal, 'principal')}"

    @staticmethod
    def replies(principal: str) -> str:
        return f"_INBOX.{validate_name(principal, 'principal')}.>"

    @staticmethod
    def account_info() -> str:
        return "$JS.API.INFO"

    def objects(self) -> list[str]:
        """Read the object store (its stream info, direct gets, consumers of its chunks)."""
        stream = f"OBJ_{self.objects_bucket}"
        return [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}",
                f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
                f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.DELETE.{stream}.*"]

    def object_writes(self) -> list[str]:
        """Write objects: their chunks and metadata, and purging an object's old chunks."""
        return [f"$O.{self.objects_bucket}.>", f"$JS.API.STREAM.PURGE.OBJ_{self.objects_bucket}"]

    @staticmethod
    def everything() -> str:
        return ">"
