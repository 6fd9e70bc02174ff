"""TLS certificates for the dev stack and the tests (``trustme``), and client contexts.

``blackboard dev`` makes a private CA once (kept in its auth directory, key
0600) and a server certificate for the hosts it listens on; clients verify
the server with the CA's certificate (``ca.pem``). Production brings its own
certificates (docs/security.md).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from blackboard.protocol.errors import ConfigurationError
from blackboard.security.files import write_private

__all__ = ["TlsFiles", "client_context", "ensure_dev_certificates", "server_hosts"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a server's TLS setup: the CA clients trust, the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path


def _hosts_file(directory: Path) -> Path:
    return directory / "server-hosts.txt"


def ensure_dev_certificates(directory: Path, hosts: list[str]) -> TlsFiles:
    """The dev CA and a server certificate for ``hosts`` under ``directory`` (made if missing).

    The CA is kept (so clients keep trusting it); the server certificate is
    made again when the hosts change or it is within 30 days of expiring.
    """
    import trustme

    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    ca_key = directory / "ca-key.pem"
    new_ca = not (files.ca.exists() and ca_key.exists())
    if not new_ca:
        ca = trustme.CA.from_pem(files.ca.read_bytes(), ca_key.read_bytes())
    else:
        ca = trustme.CA(organization_name="blackboard dev")
        write_private(ca_key, ca.private_key_pem.bytes())
        files.ca.write_bytes(ca.cert_pem.bytes())
    wanted = ",".join(sorted(set(hosts)))
    hosts_file = _hosts_file(directory)
    current = hosts_file.read_text() if hosts_file.exists() else ""
    # A new CA needs a new server certificate: clients trust only the new CA.
    fresh = not new_ca and files.cert.exists() and files.key.exists() and current == wanted
    if fresh:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        fresh = cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=30)
    if not fresh:
        names = [h for h in sorted(set(hosts)) if h]
        leaf = ca.issue_cert(*names, common_name=names[0] if names else "localhost",
                             not_after=datetime.now(UTC) + timedelta(days=825))
        write_private(files.key, leaf.private_key_pem.bytes())
        files.cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
        hosts_file.write_text(wanted)
    return files


def server_hosts(host: str) -> list[str]:
    """The names a dev server certificate covers for a listen address."""
    names = {"localhost", "127.0.0.1", "::1"}
    if host not in ("0.0.0.0", "::", ""):  # every interface: the names above, plus what you add
        names.add(host)
    return sorted(names)


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """A client context verifying the server against ``ca_file`` (None: the system's CAs).

    Raises:
        ConfigurationError: the CA file cannot be read.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot read the TLS CA certificate {ca_file}: {exc}") from None
    return context
