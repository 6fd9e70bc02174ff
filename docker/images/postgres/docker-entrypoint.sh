#!/usr/bin/env bash
# The official postgres image's entrypoint, for what the project uses (docker/images/postgres):
# on an empty data directory, initdb as POSTGRES_USER with POSTGRES_PASSWORD (or
# POSTGRES_PASSWORD_FILE) and POSTGRES_INITDB_ARGS, network connections by POSTGRES_HOST_AUTH_METHOD
# (default scram-sha-256), POSTGRES_DB created, then /docker-entrypoint-initdb.d/* run against a
# server listening on its socket only (*.sh executed, or sourced when not executable; *.sql by
# psql); then the server, listening on every address.
set -Eeo pipefail

if [ "${1:0:1}" = '-' ]; then set -- postgres "$@"; fi

# Started as root (`--user 0`, or a data directory of another owner): own it, then go on as postgres.
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 0700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

file_env() {  # VAR [default]: VAR's value, or the contents of the file VAR_FILE names
  local var=$1 file_var="${1}_FILE" def=${2:-}
  if [ -n "${!var:-}" ] && [ -n "${!file_var:-}" ]; then
    echo >&2 "error: both $var and $file_var are set (but are exclusive)"; exit 1
  fi
  local val=$def
  if [ -n "${!var:-}" ]; then val=${!var}; elif [ -n "${!file_var:-}" ]; then val=$(<"${!file_var}"); fi
  export "$var"="$val"
  unset "$file_var"
}

run_init_files() {
  local f
  for f in /docker-entrypoint-initdb.d/*; do
    case $f in
      *.sh)
        if [ -x "$f" ]; then echo "$0: running $f"; "$f"
        else echo "$0: sourcing $f"; . "$f"; fi ;;
      *.sql) echo "$0: running $f"; psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password \
               --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f" ;;
      *.sql.gz) echo "$0: running $f"; gunzip -c "$f" | psql -v ON_ERROR_STOP=1 --no-psqlrc \
               --no-password --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" ;;
      '/docker-entrypoint-initdb.d/*') ;;  # none
      *) echo "$0: ignoring $f" ;;
    esac
  done
}

init_database() {
  file_env POSTGRES_PASSWORD
  file_env POSTGRES_USER postgres
  file_env POSTGRES_DB "$POSTGRES_USER"
  local auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
  if [ -z "$POSTGRES_PASSWORD" ] && [ "$auth" != trust ]; then
    echo >&2 "error: the database is uninitialized and POSTGRES_PASSWORD is not set"
    echo >&2 "       (POSTGRES_HOST_AUTH_METHOD=trust allows connections without a password)"
    exit 1
  fi
  # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is a list of words, as in the official image
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") $POSTGRES_INITDB_ARGS
  printf '\nhost all all all %s\n' "$auth" >> "$PGDATA/pg_hba.conf"
  {
    echo "listen_addresses = '*'"
    echo "unix_socket_directories = '/var/run/postgresql'"
  } >> "$PGDATA/postgresql.conf"
  export PGPASSWORD=${PGPASSWORD:-$POSTGRES_PASSWORD}
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password --username "$POSTGRES_USER" --dbname postgres \
      --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
  fi
  run_init_files
  pg_ctl -D "$PGDATA" -m fast -w stop
  unset PGPASSWORD
  echo
  echo "PostgreSQL init process complete; ready for start up."
  echo
}

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  init_database
fi
exec "$@"
