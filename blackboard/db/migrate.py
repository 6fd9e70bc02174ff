"""Schema migrations: numbered plain SQL files applied in order, exactly once.

``migrations/NNNN_name.sql`` (shipped in the package as ``blackboard/migrations``)
is an append-only list. ``migrate()`` takes a PostgreSQL advisory lock, so
several workers starting at once apply each file once, records every applied
file with its checksum in ``bb_schema_migrations`` and refuses to run when an
applied file has changed since.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from blackboard.db.pool import connect
from blackboard.protocol.errors import MigrationError, StorageError
from blackboard.settings import Settings

__all__ = ["MIGRATIONS_DIR", "MIN_PGVECTOR", "Migration", "load_migrations", "migrate", "pending",
           "pgvector_version"]

log = logging.getLogger("blackboard.db.migrate")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: Key of the session advisory lock held while migrating ("bbmigr" in ASCII).
ADVISORY_LOCK_KEY = 0x62626D69677200

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS bb_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
_SELECT_APPLIED = "SELECT version, name, checksum FROM bb_schema_migrations ORDER BY version"
_INSERT_APPLIED = "INSERT INTO bb_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"

#: The oldest pgvector the schema works with (``halfvec``, migration 0012), and the oldest
#: with iterative index scans (filtered semantic searches re-run exactly without them).
MIN_PGVECTOR = (0, 7, 0)
ITERATIVE_SCANS_PGVECTOR = (0, 8, 0)
_PGVECTOR = """
SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'),
       (SELECT default_version FROM pg_available_extensions WHERE name = 'vector')"""
#: Whether this session's role may create pgvector (a superuser; or the extension is trusted,
#: which pgvector is not, and the role may create in the database), with the names for the hint.
_MAY_CREATE_PGVECTOR = """
SELECT current_user, current_database(),
       coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
       OR (coalesce((SELECT bool_or(trusted) FROM pg_available_extension_versions WHERE name = 'vector'), false)
           AND has_database_privilege(current_database(), 'CREATE'))"""


def pgvector_version(text: str) -> tuple[int, ...]:
    """``"0.8.1"`` -> ``(0, 8, 1)`` (a suffix after the numbers is ignored)."""
    parts = []
    for part in text.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


async def _check_pgvector(conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> None:
    """Refuse to migrate, with what to do, when the server's pgvector is missing or too old, or
    when migration 0001 could not create it (the role is not a superuser: the extension is
    created in the database by one beforehand, docs/operations.md).

    Raises:
        MigrationError: pgvector is not installed on the server, or older than
            :data:`MIN_PGVECTOR` (in this database, or on the server), or not created in
            this database and the role may not create it.
    """
    row = await (await conn.execute(_PGVECTOR)).fetchone()
    installed, available = (row or (None, None))
    if installed is None and available is None:
        raise MigrationError(0, "pgvector is not installed on the PostgreSQL server: install it "
                                "(https://github.com/pgvector/pgvector, or the pgvector/pgvector image)")
    version = pgvector_version(str(installed or available))
    if version < MIN_PGVECTOR:
        if installed is not None and available is not None and pgvector_version(str(available)) >= MIN_PGVECTOR:
            hint = (f"the server has {available}: run ALTER EXTENSION vector UPDATE in this database "
                    "(as a superuser or the extension's owner)")
        else:
            hint = "install a newer pgvector on the server, then run ALTER EXTENSION vector UPDATE"
        where = "in this database" if installed is not None else "on the server"
        raise MigrationError(0, f"pgvector {installed or available} is {where}; blackboard needs "
                                f"{_dotted(MIN_PGVECTOR)} or later: {hint}")
    if installed is None:
        row = await (await conn.execute(_MAY_CREATE_PGVECTOR)).fetchone()
        if row is not None and not row[2]:
            raise MigrationError(0, f"pgvector is not created in database {row[1]!r} and role {row[0]!r} may "
                                    "not create it (only a superuser may): run CREATE EXTENSION vector; "
                                    "in that database as a superuser, then migrate again (docs/operations.md)")
    if version < ITERATIVE_SCANS_PGVECTOR:
        log.warning("pgvector %s has no iterative index scans (%s): filtered semantic searches re-run "
                    "exactly more often", installed or available, _dotted(ITERATIVE_SCANS_PGVECTOR))


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Read the migration files of ``directory``, ordered by version.

    Raises:
        MigrationError: a file name is malformed or two files share a version.
    """
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(0, f"bad migration file name {path.name!r} (want NNNN_name.sql)")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(version, f"two migration files with version {version}")
        found[version] = Migration(version, match.group(2), path.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def pending(migrations: list[Migration], applied: dict[int, str]) -> list[Migration]:
    """The migrations still to apply, given ``{version: checksum}`` of applied ones.

    Raises:
        MigrationError: an applied migration's file changed or disappeared.
    """
    known = {m.version: m for m in migrations}
    for version, checksum in applied.items():
        mig = known.get(version)
        if mig is None:
            raise MigrationError(version, "applied migration is missing from this release")
        if mig.checksum != checksum:
            raise MigrationError(version, f"migration {version} ({mig.name}) changed after it was applied")
    return [m for m in migrations if m.version not in applied]


async def migrate(settings: Settings, *, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply the pending migrations; a no-op when the schema is current.

    Safe to call from several processes at once (advisory lock). Each file runs
    in its own transaction together with its version-table record.

    Returns:
        The versions applied by this call.

    Raises:
        MigrationError: a migration failed, an applied file changed, or the
            server's pgvector is missing or older than :data:`MIN_PGVECTOR`, or is not
            created in the database and the role may not create it (not a superuser).
        StorageError: PostgreSQL is not reachable.
    """
    migrations = load_migrations(directory)
    conn = await connect(settings.postgres, autocommit=True, name="blackboard-migrate")
    done: list[int] = []
    try:
        await conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
        try:
            await _check_pgvector(conn)
            await conn.execute(_CREATE_VERSION_TABLE)
            cur = await conn.execute(_SELECT_APPLIED)
            applied = {int(str(v)): str(c) for v, _n, c in await cur.fetchall()}
            for mig in pending(migrations, applied):
                try:
                    async with conn.transaction():
                        await conn.execute(mig.sql.encode())
                        await conn.execute(_INSERT_APPLIED, (mig.version, mig.name, mig.checksum))
                except psycopg.Error as exc:
                    raise MigrationError(mig.version, f"migration {mig.version} ({mig.name}) failed: {exc}") from exc
                log.info("applied migration %04d_%s", mig.version, mig.name)
                done.append(mig.version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    except psycopg.OperationalError as exc:
        raise StorageError(f"PostgreSQL failed while migrating: {exc}") from exc
    finally:
        await conn.close()
    return done
