"""Record signatures on the wire: what is signed and how it is carried (pure, no crypto).

Every record an identity writes carries three headers (docs/protocol.md, "Signatures"):

* ``Bb-Sig-Key``: the signer's public nkey (``U...``, 56 characters),
* ``Bb-Sig-Time``: the signed write time, decimal microseconds since the Unix epoch (UTC),
* ``Bb-Sig``: the Ed25519 signature (64 bytes), unpadded base64url (86 characters).

The signature covers :func:`signing_input`: eight lines (the scheme, the
subject, the ``Nats-Msg-Id``, the signed time, the ``Nats-Expected-Last-Subject-Sequence``,
``KV-Operation`` and ``Nats-TTL`` values or nothing, the key), each ended by
``\\n``, then the record's canonical bytes. A signed message must carry a
``Nats-Msg-Id``.

A writer may sign many records with one signature (a pipelined write path):
each record's signing input is a leaf of a Merkle tree (:func:`leaf_hash`,
:func:`node_hash`: SHA-256, domain-separated), the signature covers
:func:`batch_message` of the tree's root, and each record carries its path to
the root in ``Bb-Sig-Path`` (:func:`encode_path`). A verifier folds the path
(:func:`fold_path`) and checks the signature over the root once per batch. The crypto is in ``blackboard.security.signer`` and
``blackboard.security.verifier``; a reader's answer is a :class:`Verdict`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.subjects import Header

__all__ = [
    "BATCH_SCHEME",
    "MAX_PATH_STEPS",
    "SCHEME",
    "SIGNATURE_BYTES",
    "Path",
    "SignatureHeaders",
    "Verdict",
    "batch_message",
    "encode_path",
    "encode_signature",
    "fold_path",
    "leaf_hash",
    "merkle_tree",
    "node_hash",
    "parse_path",
    "parse_signature",
    "signing_input",
]

#: The first line of every signing input (the scheme and its version).
SCHEME = "bb-sig/1"
#: An Ed25519 signature's size.
SIGNATURE_BYTES = 64
_KEY_RE = re.compile(r"U[A-Z2-7]{55}")
#: Microseconds as decimal digits: no sign, no leading ``+``, at most 19 digits (fits an int64).
_TIME_RE = re.compile(r"(0|[1-9][0-9]{0,18})")
_T = TypeVar("_T")
_MSG_ID = Header.MSG_ID.value
_EXPECTED = Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
_KV_OP = Header.KV_OPERATION.value
_TTL = Header.MSG_TTL.value
_SIG_KEY = Header.SIG_KEY.value
_SIG_TIME = Header.SIG_TIME.value
_SIG = Header.SIG.value
_SIG_PATH = Header.SIG_PATH.value


class Verdict(StrEnum):
    """What a reader concluded about a record's signature, checked in this order."""

    #: No ``Bb-Sig*`` header (or verification is off).
    UNSIGNED = "unsigned"
    #: Unreadable signature headers, or no ``Nats-Msg-Id``.
    MALFORMED = "malformed"
    #: No valid certificate for the key in the registry.
    UNKNOWN_KEY = "unknown_key"
    #: The signature does not verify over this message.
    BAD_SIGNATURE = "bad_signature"
    #: The key's principal is not the record's author (or not the kind of identity that writes it).
    WRONG_AUTHOR = "wrong_author"
    #: The stored time is further from the signed time than ``security.max_clock_skew``.
    STALE = "stale"
    #: The key was revoked at or before the record was stored.
    REVOKED = "revoked"
    VERIFIED = "verified"

    @property
    def ok(self) -> bool:
        """Whether the record verified (the only verdict a reader trusts)."""
        return self is Verdict.VERIFIED


#: One step of a Merkle path: the side the sibling is on (``L`` or ``R``) and its hash.
Path = tuple[tuple[str, bytes], ...]
#: What a batch signature covers: this line, then the 32 bytes of the Merkle root.
BATCH_SCHEME = "bb-sig/1 batch"
#: The longest path a verifier reads (a batch of up to 2**32 records).
MAX_PATH_STEPS = 32
_HASH_BYTES = 32


@dataclass(frozen=True, slots=True)
class SignatureHeaders:
    """The signature headers of one message, read (not verified)."""

    public_key: str
    signed_at_us: int
    signature: bytes
    #: The record's Merkle path when it was signed in a batch (None: signed alone).
    path: Path | None = None


def leaf_hash(data: bytes) -> bytes:
    """A record's leaf in a batch: SHA-256 of ``0x00`` and its signing input."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An inner node of a batch's tree: SHA-256 of ``0x01``, the left and the right child."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def batch_message(root: bytes) -> bytes:
    """What a batch's signature covers: ``bb-sig/1 batch``, a line break, the root."""
    return BATCH_SCHEME.encode("ascii") + b"\n" + root


def merkle_tree(leaves: list[bytes]) -> tuple[bytes, list[Path]]:
    """The root over ``leaves`` and each leaf's path to it.

    Level by level, neighbours pair up left to right; the last node of an odd
    level goes up unchanged (no step in its leaves' paths).
    """
    if not leaves:
        raise ValueError("a batch needs at least one record")
    paths: list[list[tuple[str, bytes]]] = [[] for _ in leaves]
    #: each node of the current level, with the leaves under it
    level: list[tuple[bytes, list[int]]] = [(leaf, [i]) for i, leaf in enumerate(leaves)]
    while len(level) > 1:
        up: list[tuple[bytes, list[int]]] = []
        for n in range(0, len(level) - 1, 2):
            (left, under_left), (right, under_right) = level[n], level[n + 1]
            for i in under_left:
                paths[i].append(("R", right))
            for i in under_right:
                paths[i].append(("L", left))
            up.append((node_hash(left, right), under_left + under_right))
        if len(level) % 2:
            up.append(level[-1])
        level = up
    return level[0][0], [tuple(p) for p in paths]


def fold_path(leaf: bytes, path: Path) -> bytes:
    """The root a leaf's path leads to."""
    node = leaf
    for side, sibling in path:
        node = node_hash(sibling, node) if side == "L" else node_hash(node, sibling)
    return node


def encode_path(path: Path) -> str:
    """The ``Bb-Sig-Path`` text of a path: per step ``L``/``R`` and the sibling's unpadded
    base64url, joined by ``.``."""
    return ".".join(side + base64.urlsafe_b64encode(sibling).rstrip(b"=").decode("ascii")
                    for side, sibling in path)


#: What was already read and found well formed: keys, signatures (the records of a batch
#: share theirs) and path steps (the upper steps of a batch's paths are shared). Bounded.
_READ_KEYS: dict[str, str] = {}
_READ_SIGS: dict[str, bytes] = {}
_PATH_STEPS: dict[str, bytes] = {}
_READ_KEPT = 4096
_URLSAFE = bytes.maketrans(b"-_", b"+/")
#: The last character of the unpadded base64 of 32 bytes (258 bits: the last 2 are 0) and of 64
#: bytes (516 bits: the last 4 are 0), in canonical form.
_LAST_OF_32 = frozenset("AEIMQUYcgkosw048")
_LAST_OF_64 = frozenset("AQgw")


def _remember(cache: dict[str, _T], text: str, value: _T) -> None:
    if len(cache) >= _READ_KEPT:
        cache.clear()
    cache[text] = value


def _b64url(text: str, size: int, last: frozenset[str], what: str) -> bytes:
    """The ``size`` bytes of their canonical unpadded base64url ``text``.

    Raises:
        InvalidPayloadError: any other text.
    """
    if not isinstance(text, str) or len(text) != (size * 4 + 2) // 3 or text[-1] not in last \
            or not text.isascii() or "+" in text or "/" in text:
        raise InvalidPayloadError(f"{what} is not the canonical base64url of {size} bytes")
    try:
        raw = binascii.a2b_base64(text.encode("ascii").translate(_URLSAFE) + b"=" * (-len(text) % 4),
                                  strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidPayloadError(f"{what} is not base64url") from exc
    if len(raw) != size:  # pragma: no cover - the length and the last character admit no other
        raise InvalidPayloadError(f"{what} is not the canonical base64url of {size} bytes")
    return raw


def _read_signature(sig: str) -> bytes:
    return _b64url(sig, SIGNATURE_BYTES, _LAST_OF_64, "Bb-Sig")


def parse_path(text: str) -> Path:
    """Read a ``Bb-Sig-Path`` header.

    Raises:
        InvalidPayloadError: not 1 to :data:`MAX_PATH_STEPS` steps of the form.
    """
    steps = text.split(".")
    if not text or len(steps) > MAX_PATH_STEPS:
        raise InvalidPayloadError(f"Bb-Sig-Path holds 1 to {MAX_PATH_STEPS} steps")
    out: list[tuple[str, bytes]] = []
    for step in steps:
        raw = _PATH_STEPS.get(step)
        if raw is None:
            if step[:1] not in ("L", "R"):
                raise InvalidPayloadError("a Bb-Sig-Path step is L or R and 43 characters of base64url")
            raw = _b64url(step[1:], _HASH_BYTES, _LAST_OF_32, "a Bb-Sig-Path step")
            _remember(_PATH_STEPS, step, raw)
        out.append((step[0], raw))
    return tuple(out)


def _line(value: str | None, what: str) -> str:
    if value is None:
        return ""
    if "\n" in value:
        raise InvalidPayloadError(f"a signed message's {what} holds a line break")
    return value


def signing_input(subject: str, headers: Mapping[str, str], signed_at_us: int, public_key: str,
                  record: bytes) -> bytes:
    """The bytes a record's signature covers (see the module docstring).

    ``headers`` are the message's headers (``Nats-Msg-Id``, and when present
    ``Nats-Expected-Last-Subject-Sequence``, ``KV-Operation``, ``Nats-TTL``);
    ``record`` the record's canonical bytes (empty for a tombstone).

    Raises:
        InvalidPayloadError: no ``Nats-Msg-Id``, or a value holding a line break.
    """
    msg_id = headers.get(_MSG_ID)
    if not msg_id:
        raise InvalidPayloadError("a signed message needs a Nats-Msg-Id")
    head = "\n".join((
        SCHEME, _line(subject, "subject"), _line(msg_id, "Nats-Msg-Id"), str(signed_at_us),
        _line(headers.get(_EXPECTED), _EXPECTED), _line(headers.get(_KV_OP), _KV_OP),
        _line(headers.get(_TTL), _TTL), _line(public_key, "key"), "",
    ))
    return head.encode("utf-8") + record


def encode_signature(signature: bytes) -> str:
    """The ``Bb-Sig`` text of a signature: unpadded base64url."""
    return base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")


def parse_signature(headers: Mapping[str, str] | None) -> SignatureHeaders | None:
    """Read a message's signature headers.

    Returns None when it carries none of them (an unsigned message).

    Raises:
        InvalidPayloadError: some but not all of them, a value not of its form
            (a user public key, decimal microseconds, 86 characters of base64url
            encoding 64 bytes exactly), or no ``Nats-Msg-Id``.
    """
    if not headers:
        return None
    key = headers.get(_SIG_KEY)
    stamp = headers.get(_SIG_TIME)
    sig = headers.get(_SIG)
    if key is None and stamp is None and sig is None:
        return None
    if key is None or stamp is None or sig is None:
        raise InvalidPayloadError("a signed message needs Bb-Sig-Key, Bb-Sig-Time and Bb-Sig")
    if key not in _READ_KEYS:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise InvalidPayloadError("Bb-Sig-Key is not a user public key")
        _remember(_READ_KEYS, key, key)
    if not isinstance(stamp, str) or not _TIME_RE.fullmatch(stamp):
        raise InvalidPayloadError("Bb-Sig-Time is not decimal microseconds")
    raw = _READ_SIGS.get(sig)  # (the records of a batch share one)
    if raw is None:
        raw = _read_signature(sig)
        _remember(_READ_SIGS, sig, raw)
    if not headers.get(_MSG_ID):
        raise InvalidPayloadError("a signed message needs a Nats-Msg-Id")
    path = headers.get(_SIG_PATH)
    return SignatureHeaders(key, int(stamp), raw, None if path is None else parse_path(path))
