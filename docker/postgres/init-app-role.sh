#!/bin/sh
# Run once by the postgres image's entrypoint on an empty volume (/docker-entrypoint-initdb.d),
# as the superuser, over the local socket (which asks for the superuser's password too:
# POSTGRES_INITDB_ARGS). It creates the role the workers use: it may log in and nothing more
# (no superuser, cannot create roles or databases), owns the blackboard database and so
# everything the migrations create there. pgvector is created here, by the superuser, because
# only a superuser may create it; the migrations' CREATE EXTENSION IF NOT EXISTS is then a no-op.
# docs/operations.md, "PostgreSQL roles and authentication".
# No `set -eu`: the entrypoint sources a script that is not executable, and would keep them.
: "${POSTGRES_APP_PASSWORD:?set POSTGRES_APP_PASSWORD (the password of the blackboard role)}"
psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     --set app_password="$POSTGRES_APP_PASSWORD" --set db="$POSTGRES_DB" <<'SQL'
CREATE ROLE blackboard LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'app_password';
ALTER DATABASE :"db" OWNER TO blackboard;
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
CREATE EXTENSION IF NOT EXISTS vector;
SQL
