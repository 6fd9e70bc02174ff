"""Large binaries (screenshots, files) in the JetStream object store.

Board entries don't carry big blobs: ``board.attach(...)`` stores the bytes as
an object and writes an entry whose value is a reference::

    {"$object": {"bucket": ..., "name": ..., "size": ..., "sha256": ..., "content_type": ...}}

``board.fetch(entry)`` returns the bytes of either kind of entry. Object names
include the content's SHA-256, so a reference always points at the bytes it
was written with.

Reading an object subscribes to its chunks on the object store's stream,
named here: nats-py's ``ObjectStore.get`` would look the stream up by subject
(``$JS.API.STREAM.NAMES``), which an agent holds no right to (docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DIGEST_TYPE
from nats.js.object_store import ObjectStore as NatsObjectStore

from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import (
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    TransportError,
)
from blackboard.protocol.subjects import Header, Subjects, encode_key, validate_name

__all__ = ["OBJECT_REF_KEY", "ObjectRef", "ObjectStore"]

OBJECT_REF_KEY = "$object"

#: Seconds to wait for each chunk of an object being read.
CHUNK_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Where a binary lives in the object store."""

    bucket: str
    name: str
    size: int
    sha256: str
    content_type: str

    def to_value(self) -> dict[str, Any]:
        """The board-entry value referencing this object."""
        return {OBJECT_REF_KEY: {"bucket": self.bucket, "name": self.name, "size": self.size,
                                 "sha256": self.sha256, "content_type": self.content_type}}

    @classmethod
    def from_value(cls, value: Any) -> ObjectRef | None:
        """The reference held by an entry value, or ``None`` if it holds none."""
        if not isinstance(value, Mapping) or not isinstance(value.get(OBJECT_REF_KEY), Mapping):
            return None
        ref = value[OBJECT_REF_KEY]
        try:
            return cls(str(ref["bucket"]), str(ref["name"]), int(ref["size"]), str(ref["sha256"]),
                       str(ref.get("content_type") or "application/octet-stream"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidPayloadError(f"malformed object reference: {exc}") from exc


def _check_name(name: Any) -> None:
    """An object's name is a non-empty string (the object store encodes it).

    Raises:
        InvalidKeyError: it is not.
    """
    if not isinstance(name, str) or not name:
        raise InvalidKeyError(name if isinstance(name, str) else f"<{type(name).__name__}>",
                              "an object name must be a non-empty string")


def object_name(board: str, section: str, key: str, digest: str) -> str:
    """``<board>/<section>/<key-token>/<sha256>``: immutable per content."""
    return f"{validate_name(board, 'board')}/{validate_name(section, 'section')}/{encode_key(key)}/{digest}"


class ObjectStore:
    """The deployment's object store bucket, for one agent (``agent.objects``)."""

    def __init__(self, js: Any, bucket: str) -> None:
        self._js = js
        self.bucket = bucket
        self._store: NatsObjectStore | None = None

    async def _get_store(self) -> NatsObjectStore:
        if self._store is None:
            try:
                self._store = await self._js.object_store(self.bucket)
            except nats.js.errors.NotFoundError as exc:
                raise NotFoundError(self.bucket, f"object store {self.bucket!r} does not exist") from exc
        return self._store

    async def put(self, name: str, data: bytes, *, content_type: str = "application/octet-stream") -> ObjectRef:
        """Store ``data`` under ``name`` (chunked by the object store); returns its reference.

        Raises:
            TransportError: the object store refused or timed out.
        """
        _check_name(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidPayloadError("object data must be bytes")
        if not isinstance(content_type, str):
            raise InvalidPayloadError(f"content_type must be a string, not {type(content_type).__name__}")
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        store = await self._get_store()
        meta = api.ObjectMeta(name=name, description=content_type,
                              headers={Header.CONTENT_TYPE.value: content_type})
        try:
            await store.put(name, data, meta=meta)
        except (nats.errors.Error, TimeoutError) as exc:
            raise TransportError(f"storing object {name!r} failed: {exc!r}") from exc
        return ObjectRef(self.bucket, name, len(data), digest, content_type)

    async def get(self, name: str) -> bytes:
        """The bytes of object ``name``.

        Raises:
            NotFoundError: no such object.
            InvalidKeyError: ``name`` is not a non-empty string.
            InvalidPayloadError: its metadata is malformed or its bytes don't match its digest.
            TransportError: the object store refused or timed out.
        """
        _check_name(name)
        store = await self._get_store()
        try:
            info = await store.get_info(name)
            return await self._read_chunks(name, info)
        except nats.js.errors.NotFoundError as exc:
            raise NotFoundError(name, f"object {name!r} not found") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise TransportError(f"reading object {name!r} failed: {exc!r}") from exc

    async def _read_chunks(self, name: str, info: api.ObjectInfo) -> bytes:
        """The bytes of the object ``info`` describes, checked against its digest.

        What nats-py's ``ObjectStore.get`` does, with the stream named: an ordered
        consumer of the object's chunk subject on ``OBJ_<bucket>``. Links to other
        objects are not followed (this SDK writes none).

        Raises:
            InvalidPayloadError: the metadata is unusable (no chunk id, a link), or the
                bytes don't match its digest.
            nats.errors.Error, TimeoutError: the read failed or a chunk did not come.
        """
        if info.is_link():
            raise InvalidPayloadError(f"object {name!r} is a link to another object; links are not followed")
        if not info.nuid:
            raise InvalidPayloadError(f"object {name!r} has malformed metadata (no chunk id)")
        if not info.size:
            return b""
        subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self.bucket, obj=info.nuid)
        sub = await self._js.subscribe(subject, stream=Subjects.objects_stream(self.bucket), ordered_consumer=True)
        parts: list[bytes] = []
        try:
            while True:
                msg = await sub.next_msg(timeout=CHUNK_TIMEOUT)
                parts.append(msg.data)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        data = b"".join(parts)
        digest = (info.digest or "").replace(OBJ_DIGEST_TYPE, "").replace(OBJ_DIGEST_TYPE.upper(), "")
        try:
            expected = base64.urlsafe_b64decode(digest)
        except (binascii.Error, ValueError) as exc:
            raise InvalidPayloadError(f"object {name!r} has a malformed digest {info.digest!r}") from exc
        if hashlib.sha256(data).digest() != expected:
            raise InvalidPayloadError(f"object {name!r} does not match the digest of its metadata")
        return data

    async def delete(self, name: str) -> None:
        _check_name(name)
        store = await self._get_store()
        try:
            await store.delete(name)
        except nats.js.errors.NotFoundError as exc:
            raise NotFoundError(name, f"object {name!r} not found") from exc

    async def fetch(self, ref: ObjectRef) -> bytes:
        """The bytes of a reference, checked against its SHA-256.

        Raises:
            InvalidPayloadError: the stored bytes don't match the reference.
        """
        data = await self.get(ref.name)
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise InvalidPayloadError(f"object {ref.name!r} does not match its reference's sha256")
        return data

    async def resolve(self, entry: Entry) -> bytes:
        """The bytes of an entry: its referenced object, or its own bytes value."""
        ref = ObjectRef.from_value(entry.value)
        if ref is not None:
            return await self.fetch(ref)
        if isinstance(entry.value, bytes):
            return entry.value
        if isinstance(entry.value, str):
            return entry.value.encode()
        raise InvalidPayloadError(f"entry {entry.section}/{entry.key} holds no binary")
