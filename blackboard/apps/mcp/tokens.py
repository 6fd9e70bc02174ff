"""The MCP server's client tokens: a file mapping the SHA-256 of each bearer token to the agent
identity its holder acts as (docs/mcp.md, "Tokens").

A token is ``bbmcp_`` and 43 URL-safe characters (256 random bits). It is shown once, when it is
made (:meth:`TokenFile.add`); the file keeps only its hash, so a copy of the file grants
nothing. Whoever can *write* the file can mint identities, so it is written with mode 0600 and
a file that others may write is refused. The file is JSON::

    {"version": 1,
     "tokens": [{"id": "3f2a9c1be07d", "agent": "planner", "sha256": "<64 hex>",
                 "created": "2026-11-26T01:02:03Z"}]}

``id`` (the hash's first 12 hex digits) names a token in listings and revocations without
revealing it. :meth:`TokenFile.identify` reads the file again when it changed, so a token
added or revoked takes effect at the server's next request, without a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blackboard.protocol.errors import ConfigurationError, InvalidKeyError
from blackboard.protocol.subjects import validate_name
from blackboard.security.files import write_private

__all__ = ["TOKEN_PREFIX", "TokenFile", "TokenRecord"]

#: What every token starts with (so a leaked one is recognisable, e.g. by secret scanners).
TOKEN_PREFIX = "bbmcp_"
_TOKEN = re.compile(r"bbmcp_[A-Za-z0-9_-]{43}")
_HASH = re.compile(r"[0-9a-f]{64}")
_VERSION = 1
_ID_LENGTH = 12


@dataclass(frozen=True)
class TokenRecord:
    """One token of the file: its id (the hash's first 12 hex digits), the agent it acts as,
    the SHA-256 of the token (hex) and when it was made (UTC, ISO 8601)."""

    id: str
    agent_id: str
    sha256: str
    created: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "agent": self.agent_id, "sha256": self.sha256, "created": self.created}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenFile:
    """The token file at ``path`` (it need not exist until the first :meth:`add`).

    Reading is cached by the file's (inode, size, mtime): :meth:`identify` costs a ``stat``
    while the file is unchanged.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cache_key: tuple[int, int, int] | None = None
        self._cache: tuple[TokenRecord, ...] = ()

    # ----------------------------------------------------------------- reading
    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def records(self) -> list[TokenRecord]:
        """Every token of the file (none when the file does not exist).

        Raises:
            ConfigurationError: the file cannot be read, is not a token file, or others may
                write it.
        """
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._cache_key, self._cache = None, ()
            return []
        except OSError as exc:
            raise ConfigurationError(f"cannot read the MCP token file {self.path}: {exc.strerror or exc}") from exc
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._cache_key:
            self._check_mode(st)
            self._cache = tuple(self._parse())
            self._cache_key = key
        return list(self._cache)

    def _check_mode(self, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise ConfigurationError(f"the MCP token file {self.path} is not a regular file")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigurationError(
                f"the MCP token file {self.path} may be written by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): whoever writes it can act as any agent it names; "
                f"`chmod 600 {self.path}`")

    def _parse(self) -> Iterator[TokenRecord]:
        where = f"the MCP token file {self.path}"
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(f"cannot read {where}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise ConfigurationError(f"{where} is not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("tokens"), list):
            raise ConfigurationError(f"{where} is not a token file (version {_VERSION}, a list 'tokens')")
        for i, item in enumerate(data["tokens"]):
            if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("id", "agent", "sha256")):
                raise ConfigurationError(f"{where}: token {i} needs the strings id, agent and sha256")
            if not _HASH.fullmatch(item["sha256"]):
                raise ConfigurationError(f"{where}: token {i}'s sha256 is not 64 lowercase hex digits")
            try:
                agent_id = validate_name(item["agent"], "agent id")
            except InvalidKeyError as exc:
                raise ConfigurationError(f"{where}: token {i}: {exc}") from None
            yield TokenRecord(item["id"], agent_id, item["sha256"], str(item.get("created", "")))

    def identify(self, token: str) -> str | None:
        """The agent id ``token`` acts as, or None for a token this file does not hold (malformed,
        unknown or revoked). Every stored hash is compared, in constant time, whatever matches.

        Raises:
            ConfigurationError: the file became unreadable or invalid (as :meth:`records`).
        """
        # The regular expression runs on the token's shape only; a token of the right shape is
        # hashed, and the hash is compared with every record's, without stopping at a match.
        presented = _digest(token) if _TOKEN.fullmatch(token) else "0" * 64
        found: str | None = None
        for record in self.records():
            if hmac.compare_digest(presented, record.sha256) and found is None:
                found = record.agent_id
        return found

    # ----------------------------------------------------------------- writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[TokenRecord]]:
        """The records, under an exclusive lock (a sidecar ``.lock`` file), for a change."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = self.path.with_name(f".{self.path.name}.lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._cache_key = None
            yield self.records()
        finally:
            os.close(fd)

    def _write(self, records: list[TokenRecord]) -> None:
        body = {"version": _VERSION, "tokens": [r.to_json() for r in records]}
        write_private(self.path, json.dumps(body, indent=2) + "\n")
        self._cache_key = None

    def ensure(self) -> None:
        """Make the file, holding no token (mode 0600), if it does not exist.

        Raises:
            ConfigurationError: the file exists but is invalid or others may write it.
        """
        with self._locked() as records:
            if not self.exists:
                self._write(records)

    def add(self, agent_id: str) -> tuple[str, TokenRecord]:
        """Make a new token for ``agent_id`` and store its hash (the file is made, mode 0600, if
        it does not exist). The token is returned and never stored: show it once.

        Raises:
            InvalidKeyError: ``agent_id`` is not a valid agent id.
            ConfigurationError: the file is invalid or others may write it.
        """
        agent_id = validate_name(agent_id, "agent id")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        digest = _digest(token)
        record = TokenRecord(digest[:_ID_LENGTH], agent_id, digest,
                             time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self._locked() as records:
            self._write([*records, record])
        return token, record

    def revoke(self, *, agent_id: str | None = None, token_id: str | None = None) -> list[TokenRecord]:
        """Remove the tokens of ``agent_id`` (all of them), or the one whose id is (or starts with)
        ``token_id``; returns those removed (none: nothing matched, the file is unchanged).

        Raises:
            ConfigurationError: neither or both given; a token id prefix that names several
                tokens; the file is invalid.
        """
        if (agent_id is None) == (token_id is None):
            raise ConfigurationError("revoke the tokens of an agent or one token by its id, not both")
        if token_id is not None and not re.fullmatch(r"[0-9a-f]{4,12}", token_id):
            raise ConfigurationError(f"a token id is 4 to 12 hex digits (as `token list` shows), not {token_id!r}")
        with self._locked() as records:
            if token_id is not None:
                gone = [r for r in records if r.id.startswith(token_id)]
                if len(gone) > 1:
                    raise ConfigurationError(f"token id {token_id!r} names {len(gone)} tokens: give more of it")
            else:
                gone = [r for r in records if r.agent_id == agent_id]
            if gone:
                self._write([r for r in records if r not in gone])
        return gone
