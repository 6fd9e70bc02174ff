"""Finding the credential of an identity (the discovery order of docs/security.md).

Every process connects as one principal: an agent as its agent id, a worker
as its worker name, the CLI as the operator. Its credential (a NATS
``.creds`` file: user JWT + nkey seed) is looked for, first found wins:

1. the explicit argument (``Agent.connect(..., credentials=...)``): a path to a
   ``.creds`` file or a :class:`Credentials` object;
2. ``settings.nats.creds_file`` (``BLACKBOARD_NATS__CREDS_FILE``);
3. ``<settings.nats.credentials_dir>/<id>.creds`` (``BLACKBOARD_NATS__CREDENTIALS_DIR``);
4. ``<settings.dev.data_dir>/auth/creds/<id>.creds``: what ``blackboard dev`` and
   ``blackboard auth add`` write;
5. on a host that holds the identity authority (``settings.security.authority_dir``,
   or the ``<dev.data_dir>/auth`` of ``blackboard dev`` when its signing keys
   are there: an operator's or a developer's machine, the test suite), the
   authority itself: the principal's current credential, issued now if it
   has none (the id must be declared in the policy, e.g. by a glob such as
   the example team's ``team-*``). Holding the signing keys is the power to
   issue any declared identity already, so this grants nothing new.

The user JWT's ``name`` claim is the principal the credential was issued for;
a credential issued for another id is never used (the server would take it
for that other identity): an explicit one, or a file named for the id, that
names another id is an :class:`AuthenticationError` before anything connects;
``creds_file`` (one process-wide file) naming another id is passed over and
the search goes on. No credential anywhere is an :class:`AuthenticationError`
naming the places searched, unless ``settings.nats.insecure_open_bus`` is set
(then the process connects without one, and a WARNING says, once per process,
that the bus is open).

:func:`find_credentials` does the (small) IO: reading the candidate files;
:func:`search_paths` is the pure order. The JWT is not verified here: the
server checks its signature chain and whether it is revoked.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from blackboard.protocol.errors import AuthenticationError, ConfigurationError, InvalidKeyError
from blackboard.protocol.subjects import validate_name
from blackboard.security.jwt import Credentials
from blackboard.settings import Settings

__all__ = [
    "CA_FILE_NAME",
    "OPERATOR_PRINCIPAL",
    "CredentialsArg",
    "FoundCredentials",
    "credential_kind",
    "credential_principal",
    "find_credentials",
    "find_system_credentials",
    "load_credentials_file",
    "resolve_credentials",
    "search_paths",
]

log = logging.getLogger("blackboard.security.credentials")

#: What ``credentials=`` takes: a path to a ``.creds`` file, or the credential itself.
CredentialsArg = str | os.PathLike[str] | Credentials
#: The principal id the ``blackboard`` CLI connects as.
OPERATOR_PRINCIPAL = "operator"
#: A CA certificate beside a credential (in the directory it was found in) that
#: verifies the server's TLS certificate when ``nats.tls_ca_file`` is not set.
CA_FILE_NAME = "ca.pem"
#: The dev credentials directory under ``dev.data_dir``.
_DEV_CREDS = Path("auth") / "creds"

#: Whether the open-bus warning was logged by this process (it is said once).
_warned_open_bus = False


@dataclass(frozen=True, slots=True)
class FoundCredentials:
    """A credential and where it was found."""

    credentials: Credentials = field(repr=False)
    #: The principal id it was issued for (its JWT's ``name``).
    principal: str
    #: Where it came from, for messages: ``the credentials argument``, ``nats.creds_file (/x/a.creds)``...
    origin: str
    #: The ``.creds`` file read (None for a :class:`Credentials` object given in code).
    path: Path | None = None
    #: ``ca.pem`` beside the file, if there is one (verifies the server's TLS certificate).
    ca_file: Path | None = None


def credential_principal(credentials: Credentials, origin: str) -> str:
    """The principal id a credential was issued for: its JWT's ``name`` (not verified).

    Raises:
        AuthenticationError: the JWT is not readable, names no id, or not a valid one.
    """
    try:
        name = credentials.principal
    except AuthenticationError as exc:
        raise AuthenticationError(f"{origin}: {exc}") from exc
    try:
        return validate_name(name, "principal")
    except InvalidKeyError:
        raise AuthenticationError(f"{origin}: the credential names {name!r}, not a valid id") from None


def credential_kind(credentials: Credentials) -> str | None:
    """The kind (``agent``, ``worker``, ``operator``) the authority tagged the JWT with
    (``nats.tags``: ``bb-kind:<kind>``), or None when it carries no such tag."""
    try:
        tags = credentials.claims.get("nats", {}).get("tags") or []
    except (AuthenticationError, AttributeError):
        return None
    for tag in tags if isinstance(tags, list) else []:
        if isinstance(tag, str) and tag.startswith("bb-kind:"):
            return tag.removeprefix("bb-kind:")
    return None


def search_paths(principal: str, settings: Settings) -> list[tuple[str, Path]]:
    """The files searched for ``principal``'s credential, in order, each with the
    setting it comes from (pure: nothing is read)."""
    nats = settings.nats
    paths: list[tuple[str, Path]] = []
    if nats.creds_file is not None:
        paths.append(("nats.creds_file (BLACKBOARD_NATS__CREDS_FILE)", nats.creds_file))
    if nats.credentials_dir is not None:
        paths.append(("nats.credentials_dir (BLACKBOARD_NATS__CREDENTIALS_DIR)",
                      nats.credentials_dir / f"{principal}.creds"))
    paths.append(("the dev credentials (`blackboard dev`, `blackboard auth add`)",
                  settings.dev.data_dir / _DEV_CREDS / f"{principal}.creds"))
    return paths


def _read(path: Path, origin: str) -> Credentials:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthenticationError(f"cannot read the credential {origin}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AuthenticationError(f"{origin} is not a NATS .creds file (not text)") from None
    return Credentials.parse(text, source=origin)


def _ca_beside(path: Path) -> Path | None:
    ca = path.parent / CA_FILE_NAME
    return ca if ca.is_file() else None


def load_credentials_file(path: Path, origin: str | None = None) -> FoundCredentials:
    """Read a ``.creds`` file (no binding to an id: see :func:`find_credentials`).

    Raises:
        AuthenticationError: it cannot be read, is not a ``.creds`` file, or names no valid id.
    """
    origin = origin or str(path)
    creds = _read(path, origin)
    return FoundCredentials(creds, credential_principal(creds, origin), origin, path, _ca_beside(path))


def _explicit(explicit: CredentialsArg) -> FoundCredentials:
    if isinstance(explicit, Credentials):
        origin = "the credentials argument"
        return FoundCredentials(explicit, credential_principal(explicit, origin), origin)
    path = Path(explicit).expanduser()
    origin = f"the credentials argument ({path})"
    if not path.is_file():
        raise AuthenticationError(f"no credential file at {path} (given as credentials=)")
    return load_credentials_file(path, origin)


def _mismatch(principal: str, found: FoundCredentials) -> AuthenticationError:
    return AuthenticationError(
        f"{found.origin} is the credential of {found.principal!r}, not of {principal!r}: "
        f"connect as {found.principal!r}, or give the credential of {principal!r}", principal)


def find_credentials(principal: str, settings: Settings,
                     explicit: CredentialsArg | None = None) -> FoundCredentials | None:
    """The credential ``principal`` connects with (see the module doc for the order).

    Returns None only when none is found and ``settings.nats.insecure_open_bus`` is set.

    Raises:
        InvalidKeyError: ``principal`` is not a valid id.
        AuthenticationError: the explicit credential (or a file named for the id)
            is another id's; a credential file cannot be read or is not one; no
            credential was found (the message names the places searched and the fix).
    """
    validate_name(principal, "principal")
    if explicit is not None:
        found = _explicit(explicit)
        if found.principal != principal:
            raise _mismatch(principal, found)
        return found
    passed_over: FoundCredentials | None = None
    for i, (setting, path) in enumerate(search_paths(principal, settings)):
        if not path.is_file():
            continue
        found = load_credentials_file(path, f"{setting} ({path})")
        if found.principal == principal:
            return found
        if i == 0 and settings.nats.creds_file is not None:
            passed_over = found  # the process-wide file is another identity's: look on
            continue
        raise _mismatch(principal, found)
    try:
        from_authority = _from_authority(principal, settings)
    except AuthenticationError:
        if not settings.nats.insecure_open_bus:
            raise
        from_authority = None  # the open bus does without (the id is not declared)
    if from_authority is not None:
        return from_authority
    if settings.nats.insecure_open_bus:
        _warn_open_bus()
        return None
    searched = "; ".join(f"{setting}: {path}" for setting, path in search_paths(principal, settings))
    also = (f" ({passed_over.origin} is the credential of {passed_over.principal!r})"
            if passed_over is not None else "")
    raise AuthenticationError(
        f"no credential for {principal!r}{also}. Searched: the credentials argument (none given); "
        f"{searched}; no identity authority on this host (security.authority_dir). Issue one with `blackboard auth add {principal}` (or run `blackboard dev --agent "
        f"{principal}`) and point nats.creds_file or nats.credentials_dir at it, or pass "
        f"credentials=<path to {principal}.creds>. Only on a dev machine: an open bus without "
        "authorization (BLACKBOARD_NATS__INSECURE_OPEN_BUS=true).", principal)


def _from_authority(principal: str, settings: Settings) -> FoundCredentials | None:
    """The principal's credential from the authority this host holds, if it holds one."""
    from blackboard.security.authority import Authority  # the signing side, only on its hosts

    authority = Authority.from_settings(settings)
    if settings.security.authority_dir is None and not authority.initialized:
        return None
    path = authority.credentials_path(principal)
    origin = f"the identity authority (security.authority_dir: {authority.directory})"
    try:
        creds = authority.credentials_for(principal)
    except ConfigurationError as exc:
        raise AuthenticationError(f"no credential for {principal!r} from {origin}: {exc}", principal) from exc
    found = FoundCredentials(creds, credential_principal(creds, origin), origin, path, _ca_beside(path))
    if found.principal != principal:
        raise _mismatch(principal, found)
    return found


def find_system_credentials(principal: str, settings: Settings, *, process: str) -> FoundCredentials | None:
    """The credential a server-side process connects with: a worker (as its
    ``worker.name``), ``blackboard setup`` (as :data:`OPERATOR_PRINCIPAL`).

    ``nats.creds_file`` when it is set, whichever worker or operator it was
    issued for (a worker's replicas share one file; an operator may run a
    worker), else :func:`find_credentials` for ``principal``. Never an
    agent's: the server would grant such a process an agent's rights only,
    under which it fails at its first step (streams, consumers, outcomes) or,
    worse, half works. ``process`` names the process in the error.

    Returns None only on an open bus (``nats.insecure_open_bus``) with no credential.

    Raises:
        AuthenticationError: the credential found is an agent's (its JWT's
            ``bb-kind:agent`` tag); or as :func:`find_credentials` raises.
    """
    creds_file = settings.nats.creds_file
    found = (load_credentials_file(creds_file, f"nats.creds_file (BLACKBOARD_NATS__CREDS_FILE) ({creds_file})")
             if creds_file is not None else find_credentials(principal, settings))
    if found is not None and credential_kind(found.credentials) == "agent":
        kind, article = ("operator", "an") if principal == OPERATOR_PRINCIPAL else ("worker", "a")
        raise AuthenticationError(
            f"{found.origin} is the credential of the agent {found.principal!r}: {process} runs as "
            f"{article} {kind} identity, never as an agent. Issue one (`blackboard auth add {principal} --kind {kind}`) "
            "and point nats.creds_file (BLACKBOARD_NATS__CREDS_FILE) at it (docs/security.md)", found.principal)
    return found


def resolve_credentials(principal: str, settings: Settings,
                        explicit: CredentialsArg | None = None) -> Credentials | None:
    """The credential of ``principal`` (:func:`find_credentials`), without where it was found.

    Raises:
        InvalidKeyError, AuthenticationError: see :func:`find_credentials`.
    """
    found = find_credentials(principal, settings, explicit)
    return None if found is None else found.credentials


def _warn_open_bus() -> None:
    global _warned_open_bus  # a once-per-process log line, nothing else
    if not _warned_open_bus:
        _warned_open_bus = True
        log.warning("INSECURE: connecting to NATS without a credential (nats.insecure_open_bus is set): "
                    "on an open bus any process can act as any agent, read every board and erase data. "
                    "Dev only; see docs/security.md")
