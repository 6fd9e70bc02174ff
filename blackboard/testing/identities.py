"""The identities and TLS files of a test stack: an identity authority of its own.

A stack runs with authorization and TLS, as ``blackboard dev`` and production do: one
authority per stack (``blackboard.security.authority``) issues the operator (who creates
the streams), the worker and every agent its credential, renders the servers' operator-mode
config, and a dev CA signs a server certificate for the names clients use (loopback, and
``nats-1``..``nats-3`` inside a container network).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority
from blackboard.security.policy import STANDARD_ROLES
from blackboard.security.tls import TlsFiles, ensure_dev_certificates, server_hosts
from blackboard.settings import Settings

__all__ = ["TEST_POLICY", "StackIdentities"]

#: The default policy of a test stack: every agent id is a member (reads, writes and votes on
#: every board), one worker identity and one operator.
TEST_POLICY = "version = 1\n\n" + STANDARD_ROLES + """
[agents."*"]
roles = ["member"]

[workers.worker]

[operators.operator]
"""

#: The principals every stack issues at start-up.
SYSTEM_PRINCIPALS = ("operator", "worker")


@dataclass(frozen=True)
class StackIdentities:
    """A stack's authority and the TLS files of its servers."""

    authority: Authority
    tls: TlsFiles

    @classmethod
    def create(cls, directory: Path, *, settings: Settings, hosts: Iterable[str] = (),
               policy: str | None = None) -> StackIdentities:
        """Make (or reuse) the authority under ``directory``: keys, ``policy`` (default
        :data:`TEST_POLICY`), the operator's and worker's credentials, a server certificate
        for loopback and ``hosts``, and the servers' config (``nats-auth.conf``)."""
        authority = Authority(directory, Grants(settings.board.bucket, settings.board.objects_bucket))
        authority.init(policy=policy if policy is not None else TEST_POLICY)
        for principal in SYSTEM_PRINCIPALS:
            authority.credentials_for(principal)
        names = sorted({*server_hosts("127.0.0.1"), *(h for h in hosts if h)})
        tls = ensure_dev_certificates(directory / "tls", names)
        authority.write_server_config()
        # Clients that find their credential in the authority's directory trust this CA.
        (authority.creds_dir / "ca.pem").write_bytes(tls.ca.read_bytes())
        return cls(authority, tls)

    @property
    def directory(self) -> Path:
        return self.authority.directory

    @property
    def server_config(self) -> Path:
        """The servers' operator-mode config (the include of a nats-server config)."""
        return self.authority.config_file

    @property
    def policy_file(self) -> Path:
        return self.authority.policy_file

    def creds(self, principal: str) -> Path:
        """``principal``'s ``.creds`` file (issued now if it has none).

        Raises:
            ConfigurationError: the policy does not declare ``principal``.
        """
        self.authority.credentials_for(principal)
        return self.authority.credentials_path(principal)
