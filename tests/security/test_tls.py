"""Dev TLS certificates, and a real nats-server speaking TLS with them."""

from __future__ import annotations

import ssl
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from cryptography import x509

from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import ConfigurationError
from blackboard.security.tls import TlsFiles, client_context, ensure_dev_certificates, server_hosts

HOSTS = ["127.0.0.1", "localhost"]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _names(path: Path) -> set[str]:
    san = _cert(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | \
        {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_the_certificates_are_made(tmp_path: Path) -> None:
    files = ensure_dev_certificates(tmp_path / "tls", HOSTS)
    assert files == TlsFiles(tmp_path / "tls" / "ca.pem", tmp_path / "tls" / "server.pem",
                             tmp_path / "tls" / "server-key.pem")
    for path in (files.ca, files.cert, files.key, tmp_path / "tls" / "ca-key.pem"):
        assert path.exists()
    for key in (files.key, tmp_path / "tls" / "ca-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert _names(files.cert) == {"127.0.0.1", "localhost"}
    ca = _cert(files.ca)
    leaf = _cert(files.cert)
    assert leaf.issuer == ca.subject
    assert leaf.not_valid_after_utc > datetime.now(UTC) + timedelta(days=800)
    # The chain verifies with the CA (what a client does).
    context = client_context(files.ca)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_a_second_call_keeps_the_ca_and_the_certificate(tmp_path: Path) -> None:
    first = ensure_dev_certificates(tmp_path, HOSTS)
    ca, cert, key = first.ca.read_bytes(), first.cert.read_bytes(), first.key.read_bytes()
    again = ensure_dev_certificates(tmp_path, [*reversed(HOSTS), "localhost"])  # same set of hosts
    assert again == first
    assert (again.ca.read_bytes(), again.cert.read_bytes(), again.key.read_bytes()) == (ca, cert, key)


def test_new_hosts_get_a_new_certificate_from_the_same_ca(tmp_path: Path) -> None:
    first = ensure_dev_certificates(tmp_path, HOSTS)
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    again = ensure_dev_certificates(tmp_path, [*HOSTS, "10.1.2.3", "bb.example"])
    assert again.ca.read_bytes() == ca
    assert again.cert.read_bytes() != cert
    assert _names(again.cert) == {"127.0.0.1", "localhost", "10.1.2.3", "bb.example"}
    assert _cert(again.cert).issuer == _cert(again.ca).subject


def test_a_missing_server_certificate_is_made_again(tmp_path: Path) -> None:
    first = ensure_dev_certificates(tmp_path, HOSTS)
    ca = first.ca.read_bytes()
    first.key.unlink()
    again = ensure_dev_certificates(tmp_path, HOSTS)
    assert again.key.exists() and again.ca.read_bytes() == ca


def test_a_new_ca_gets_a_new_server_certificate(tmp_path: Path) -> None:
    first = ensure_dev_certificates(tmp_path, HOSTS)
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    (tmp_path / "ca-key.pem").unlink()  # the CA's key lost: a new CA
    again = ensure_dev_certificates(tmp_path, HOSTS)
    assert again.ca.read_bytes() != ca and again.cert.read_bytes() != cert
    assert _cert(again.cert).issuer == _cert(again.ca).subject
    _cert(again.cert).verify_directly_issued_by(_cert(again.ca))


def test_server_hosts() -> None:
    assert server_hosts("127.0.0.1") == ["127.0.0.1", "::1", "localhost"]
    assert server_hosts("0.0.0.0") == ["127.0.0.1", "::1", "localhost"]
    assert server_hosts("::") == ["127.0.0.1", "::1", "localhost"]
    assert "10.0.0.5" in server_hosts("10.0.0.5")


def test_client_context_refuses_an_unreadable_ca(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the TLS CA certificate"):
        client_context(tmp_path / "missing.pem")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="cannot read the TLS CA certificate"):
        client_context(bad)
    assert client_context(None).verify_mode == ssl.CERT_REQUIRED


# ------------------------------------------------------------------ a real server
@pytest.fixture
def tls_server(stack_dir: Path) -> Iterator[tuple[EmbeddedNats, TlsFiles]]:
    base = stack_dir / f"tls-{uuid.uuid4().hex[:8]}"
    files = ensure_dev_certificates(base / "tls", server_hosts("127.0.0.1"))
    server = EmbeddedNats(base / "nats", port=0, tls=files)
    server.start()
    yield server, files
    server.stop()


@pytest.mark.asyncio
async def test_a_client_trusting_the_ca_connects(tls_server: tuple[EmbeddedNats, TlsFiles]) -> None:
    server, files = tls_server
    assert server.url.startswith("tls://127.0.0.1:")
    nc = await nats.connect(server.url, tls=client_context(files.ca), allow_reconnect=False, connect_timeout=5)
    try:
        sub = await nc.subscribe("tls.test")
        await nc.publish("tls.test", b"over tls")
        assert (await sub.next_msg(timeout=5)).data == b"over tls"
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_a_client_without_the_ca_is_refused(tls_server: tuple[EmbeddedNats, TlsFiles],
                                                  tmp_path: Path) -> None:
    server, _ = tls_server
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
        nc = await nats.connect(server.url, tls=client_context(None), allow_reconnect=False, connect_timeout=5,
                                error_cb=on_error)
        await nc.close()
    # Nor with another dev CA.
    other = ensure_dev_certificates(tmp_path / "other", HOSTS)
    with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
        nc = await nats.connect(server.url, tls=client_context(other.ca), allow_reconnect=False,
                                connect_timeout=5, error_cb=on_error)
        await nc.close()
    assert any("CERTIFICATE_VERIFY_FAILED" in str(e) for e in errors), errors
