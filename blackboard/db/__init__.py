"""PostgreSQL access: the pool (pgvector registered), migrations, query builders."""

from blackboard.db.migrate import Migration, load_migrations, migrate, pending
from blackboard.db.pool import configure_connection, connect, open_pool

__all__ = [
    "Migration",
    "configure_connection",
    "connect",
    "load_migrations",
    "migrate",
    "open_pool",
    "pending",
]
