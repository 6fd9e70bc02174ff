"""The identity authority: signing keys, the policy, issued identities, the server's config.

One directory (``blackboard dev`` uses ``<data_dir>/auth``; production keeps it
with the operators, off the servers)::

    keys/operator.nk  keys/account.nk  keys/system.nk    signing seeds (0600; the secrets)
    keys/operator.jwt                                    the operator JWT (signed once, kept)
    policy.toml                                          the declared policy (edit it)
    registry.json                                        every identity issued, and revoked
    creds/<id>.creds                                     issued credentials (0600)
    nats-auth.conf                                       the server's operator/resolver config
    tls/                                                 dev TLS certificates (tls.py)

Issuing an identity mints a user JWT signed by the account key, with the
permissions the policy gives that principal (permissions.py). No server
change is needed to add one. Revoking one (and issuing a principal again,
which revokes its earlier keys so stale rights do not linger) changes the
account JWT; the server applies it on a config reload (``nats-server
--signal reload`` or SIGHUP), disconnecting revoked users at once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blackboard.protocol.errors import AuthenticationError, ConfigurationError
from blackboard.protocol.subjects import Grants, validate_name
from blackboard.security.files import write_private
from blackboard.security.jwt import (
    Credentials,
    account_claims,
    decode_claims,
    encode,
    new_seed,
    operator_claims,
    public_key,
    user_claims,
)
from blackboard.security.permissions import permissions_for
from blackboard.security.policy import DEFAULT_POLICY, AccessPolicy, Kind, Rights
from blackboard.security.tls import TlsFiles, ensure_dev_certificates, server_hosts
from blackboard.settings import Settings

__all__ = ["Authority", "Identity", "LocalAuth"]

_ACCOUNT_NAME = "blackboard"
_SYSTEM_NAME = "SYS"


@dataclass(frozen=True, slots=True)
class Identity:
    """One issued identity (a key pair bound to a principal id)."""

    principal: str
    kind: str
    public_key: str
    issued_at: int
    revoked_at: int | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class Authority:
    """The signing keys and records under one directory (see the module doc)."""

    def __init__(self, directory: Path, grants: Grants, *, policy_file: Path | None = None) -> None:
        self.directory = directory
        self.grants = grants
        self.policy_file = policy_file or directory / "policy.toml"
        self.creds_dir = directory / "creds"
        self.config_file = directory / "nats-auth.conf"
        self._keys = directory / "keys"
        self._registry = directory / "registry.json"
        #: The registry as last read, with the file's (mtime, size, inode) then.
        self._read: tuple[tuple[int, int, int], list[Identity]] | None = None

    # -- setting up ------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings) -> Authority:
        directory = settings.security.authority_dir or settings.dev.data_dir / "auth"
        return cls(directory, Grants(settings.board.bucket, settings.board.objects_bucket),
                   policy_file=settings.security.policy_file)

    @property
    def initialized(self) -> bool:
        return all((self._keys / f"{k}.nk").exists() for k in ("operator", "account", "system"))

    def init(self, *, policy: str | None = None) -> bool:
        """Make the signing keys (and the policy, from ``policy`` or the default) if missing.

        Returns whether anything was made. Existing keys and policy are kept.
        """
        made = False
        for name, kind in (("operator", "operator"), ("account", "account"), ("system", "account")):
            path = self._keys / f"{name}.nk"
            if not path.exists():
                write_private(path, new_seed(kind) + "\n")
                made = True
        if not self.policy_file.exists():
            self.policy_file.parent.mkdir(parents=True, exist_ok=True)
            self.policy_file.write_text(policy if policy is not None else DEFAULT_POLICY, encoding="utf-8")
            made = True
        self.creds_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return made

    def _seed(self, name: str) -> str:
        path = self._keys / f"{name}.nk"
        try:
            return path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise ConfigurationError(
                f"no identity authority in {self.directory} (run `blackboard auth init`)") from None

    # -- the policy ------------------------------------------------------------
    def policy(self) -> AccessPolicy:
        return AccessPolicy.load(self.policy_file)

    def declare(self, principal: str, *, kind: Kind = "agent", roles: list[str] | None = None) -> bool:
        """Append a table for ``principal`` to the policy file unless it already declares it.

        Returns whether the file changed. The file is appended to, so comments
        and layout are kept.
        """
        validate_name(principal, f"{kind} id")
        policy = self.policy()
        if policy.kind_of(principal) is not None:
            return False
        section = {"agent": "agents", "worker": "workers", "operator": "operators"}[kind]
        lines = [f"\n[{section}.{principal}]\n"]
        if roles:
            lines.append("roles = [" + ", ".join(json.dumps(r) for r in roles) + "]\n")
        text = self.policy_file.read_text(encoding="utf-8")
        candidate = text + "".join(lines)
        AccessPolicy.parse(candidate, source=str(self.policy_file))  # refuse unknown roles before writing
        self.policy_file.write_text(candidate, encoding="utf-8")
        return True

    # -- the registry ----------------------------------------------------------
    def identities(self) -> list[Identity]:
        """Every identity issued, in issue order (revoked ones included)."""
        try:
            stat = self._registry.stat()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigurationError(f"cannot read the identity registry {self._registry}: {exc}") from None
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._read is not None and self._read[0] == stamp:  # unchanged since read (a host issuing many)
            return list(self._read[1])
        try:
            doc = json.loads(self._registry.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the identity registry {self._registry}: {exc}") from None
        identities = [Identity(**item) for item in doc.get("identities", [])]
        self._read = (stamp, identities)
        return list(identities)

    def _save(self, identities: list[Identity]) -> None:
        doc: dict[str, Any] = {"version": 1, "identities": [asdict(i) for i in identities]}
        write_private(self._registry, json.dumps(doc, indent=2) + "\n")
        self._read = None

    def revocations(self) -> dict[str, int]:
        """Revoked user public keys and when (what the account JWT carries)."""
        return {i.public_key: i.revoked_at for i in self.identities() if i.revoked_at is not None}

    # -- issuing and revoking --------------------------------------------------
    def rights(self, principal: str) -> Rights:
        rights = self.policy().rights(principal)
        if rights is None:
            raise ConfigurationError(
                f"{principal!r} is not declared in the access policy {self.policy_file} "
                f"(add an [agents.{principal}] table, or run `blackboard auth add {principal}`)")
        return rights

    def mint(self, principal: str, *, now: int | None = None) -> Credentials:
        """A new credential for a declared principal, with its rights from the policy (no records)."""
        rights = self.rights(principal)
        seed = new_seed("user")
        perms = permissions_for(rights, self.grants, public_key(seed))
        claims = user_claims(public_key(seed), principal, issued_at=now if now is not None else int(time.time()),
                             pub_allow=list(perms.publish), sub_allow=list(perms.subscribe),
                             responses=perms.responses, tags=[f"bb-kind:{rights.kind}"])
        return Credentials(encode(claims, self._seed("account")), seed)

    def issue(self, principal: str, *, write: bool = True) -> tuple[Credentials, bool]:
        """Issue ``principal`` a credential (``creds/<id>.creds``) and record it.

        Any earlier active key of the same principal is revoked (its JWT would
        keep the rights it was issued with). Returns the credential and
        whether the server's config changed (a reload is needed).
        """
        now = int(time.time())
        creds = self.mint(principal, now=now)
        identities = self.identities()
        changed = False
        updated: list[Identity] = []
        for ident in identities:
            if ident.principal == principal and ident.active:
                ident = Identity(ident.principal, ident.kind, ident.public_key, ident.issued_at, now)
                changed = True
            updated.append(ident)
        kind = self.policy().kind_of(principal) or "agent"
        # Revocations name public keys: the new key is not touched by the old one's.
        updated.append(Identity(principal, kind, creds.public_key, now))
        self._save(updated)
        if write:
            write_private(self.creds_dir / f"{principal}.creds", creds.render())
        if changed:
            self.write_server_config()
        return creds, changed

    def credentials_for(self, principal: str) -> Credentials:
        """``principal``'s current credential: its ``creds/<id>.creds`` while that key is
        active, else a new one issued now (the principal must be declared in the policy).

        For hosts that hold the authority (an operator's machine, ``blackboard dev``,
        the test suite); an agent's host holds only its own ``.creds`` file.

        Raises:
            ConfigurationError: the principal is not declared in the policy.
        """
        path = self.credentials_path(principal)
        if path.exists():
            creds = Credentials.parse(path.read_text(encoding="utf-8"), source=str(path))
            if any(i.public_key == creds.public_key and i.active for i in self.identities()):
                return creds
        return self.issue(principal)[0]

    def credentials_path(self, principal: str) -> Path:
        return self.creds_dir / f"{validate_name(principal, 'principal')}.creds"

    def revoke(self, principal: str) -> list[Identity]:
        """Revoke every active key of ``principal`` and remove its credential file.

        Returns the identities revoked (empty if none was active); the server
        refuses them after its next config reload.
        """
        now = int(time.time())
        revoked: list[Identity] = []
        updated: list[Identity] = []
        for ident in self.identities():
            if ident.principal == principal and ident.active:
                ident = Identity(ident.principal, ident.kind, ident.public_key, ident.issued_at, now)
                revoked.append(ident)
            updated.append(ident)
        if revoked:
            self._save(updated)
            with contextlib.suppress(FileNotFoundError):
                self.credentials_path(principal).unlink()
            self.write_server_config()
        return revoked

    # -- the server's config ---------------------------------------------------
    def server_config(self) -> str:
        """The nats-server config block of operator mode: the operator, the accounts, revocations."""
        now = int(time.time())
        operator, account, system = self._seed("operator"), self._seed("account"), self._seed("system")
        op_jwt = self._operator_jwt(operator, system)
        acct_jwt = encode(account_claims(account, _ACCOUNT_NAME, issued_at=now, jetstream=True,
                                         revocations=self.revocations()), operator)
        sys_jwt = encode(account_claims(system, _SYSTEM_NAME, issued_at=now, jetstream=False), operator)
        return (
            "# Rendered by `blackboard auth render` from the identity authority; do not edit.\n"
            f"operator: \"{op_jwt}\"\n"
            f"system_account: \"{public_key(system)}\"\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f"  {public_key(account)}: \"{acct_jwt}\"\n"
            f"  {public_key(system)}: \"{sys_jwt}\"\n"
            "}\n"
        )

    def _operator_jwt(self, operator: str, system: str) -> str:
        """The operator JWT, signed once and kept (``keys/operator.jwt``): nats-server refuses
        to reload a config whose trusted operator changed, so a JWT signed again at each render
        (a new ``iat``) would keep revocations from ever taking effect on a running server."""
        path = self._keys / "operator.jwt"
        try:
            token = path.read_text(encoding="utf-8").strip()
            claims = decode_claims(token)
            if claims.get("sub") == public_key(operator) and \
                    claims.get("nats", {}).get("system_account") == public_key(system):
                return token
        except (FileNotFoundError, AuthenticationError, AttributeError):
            pass
        token = encode(operator_claims(operator, "blackboard", public_key(system), issued_at=int(time.time())),
                       operator)
        write_private(path, token + "\n")
        return token

    def write_server_config(self, path: Path | None = None) -> Path:
        """Write :meth:`server_config` (default ``nats-auth.conf``) for the server to include."""
        target = path or self.config_file
        write_private(target, self.server_config())
        return target


@dataclass(frozen=True)
class LocalAuth:
    """An authority with the dev TLS files of the server it authorizes: what a server on this
    host runs with (``blackboard dev``, the test suite, the benches)."""

    authority: Authority
    tls: TlsFiles

    @classmethod
    def prepare(cls, authority: Authority, *, principals: Iterable[str] = ("operator", "worker"),
                host: str = "127.0.0.1") -> LocalAuth:
        """Issue ``principals`` their credentials (keeping active ones), make the dev TLS
        certificates for ``host`` (in ``<authority>/tls``) and write the server's config.
        The authority must be initialized (:meth:`Authority.init`)."""
        for principal in principals:
            authority.credentials_for(principal)
        tls = ensure_dev_certificates(authority.directory / "tls", server_hosts(host))
        authority.write_server_config()
        return cls(authority, tls)

    @property
    def config(self) -> Path:
        """The server's operator-mode config (included by the server's config)."""
        return self.authority.config_file

    def creds(self, principal: str) -> Path:
        """``principal``'s ``.creds`` file (issued now if it has none)."""
        self.authority.credentials_for(principal)
        return self.authority.credentials_path(principal)
