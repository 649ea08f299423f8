#!/bin/sh
# The cluster's PostgreSQL (postgres.Dockerfile): on first start a database cluster in
# $PGDATA with the role and database `yarl`; then the server in the foreground, on the
# socket in /run/postgresql only.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    initdb -D "$PGDATA" -U postgres --auth-local=trust --auth-host=reject \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    postgres --single -D "$PGDATA" postgres >/dev/null <<'SQL'
CREATE ROLE yarl LOGIN;
CREATE DATABASE yarl OWNER yarl;
SQL
    echo "postgres-entrypoint: created the database yarl in $PGDATA"
fi
exec postgres -D "$PGDATA" -c listen_addresses='' -c unix_socket_directories=/run/postgresql "$@"
