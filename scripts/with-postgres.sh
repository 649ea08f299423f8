#!/usr/bin/env bash
# Usage: scripts/with-postgres.sh CMD [ARGS...]
#
# Runs CMD with a throwaway PostgreSQL cluster: initdb in a fresh temporary directory,
# listening on 127.0.0.1 on a free port (trust auth: loopback only, torn down afterwards),
# one database `yarl_test`. CMD sees
#   YARL_TEST_PG_URL=postgres://postgres@127.0.0.1:PORT/yarl_test
#   YARL_TEST_PG_CTL=DIR/pgctl   (`pgctl stop` / `pgctl start`: for outage tests)
# The cluster is stopped and removed when CMD exits, however it exits; every run gets its
# own cluster, so runs never interfere. Installs Debian's `postgresql` if it is missing
# (scripts/apt-install.sh: no main cluster, no service left running).
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ $# -eq 0 ]; then
    echo "usage: $0 CMD [ARGS...]" >&2
    exit 2
fi

find_bin() {
    local d
    for d in ${PG_BIN:-} /usr/lib/postgresql/15/bin $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

if ! PG_BIN=$(find_bin); then
    # Without the package's main cluster or a running service: this script makes its own.
    "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" postgresql >&2
    PG_BIN=$(find_bin) || { echo "with-postgres: no initdb after installing postgresql" >&2; exit 1; }
fi

# Run PostgreSQL binaries as `postgres` when we are root, as ourselves otherwise.
if [ "$(id -u)" -eq 0 ]; then
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

DIR=$(mktemp -d /tmp/yarl-pg.XXXXXX)
DATA="$DIR/data"
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$DIR"; fi

cleanup() {
    local rc=$?
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Below Linux's ephemeral range (32768-60999): a port an outgoing connection holds looks free
# to port_free (lib.sh) but cannot be bound. The start is retried on another port anyway.
pick_port() {
    PORT=""
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 12000))
        if port_free "$p"; then PORT=$p; return 0; fi
    done
    echo "with-postgres: no free port found" >&2
    exit 1
}
pick_port

as_pg "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log" >&2; exit 1; }
cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 200
# A throwaway test cluster: durability buys nothing here.
fsync = off
synchronous_commit = off
full_page_writes = off
CONF

cat >"$DIR/pgctl" <<CTL
#!/bin/sh
# pgctl stop|start: stops or restarts this test cluster (same port and data).
case "\$1" in
    stop) $( [ "$(id -u)" -eq 0 ] && echo "runuser -u postgres --" ) "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop ;;
    start) $( [ "$(id -u)" -eq 0 ] && echo "runuser -u postgres --" ) "$PG_BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w start ;;
    *) echo "usage: \$0 stop|start" >&2; exit 2 ;;
esac
CTL
chmod 755 "$DIR/pgctl"

started=""
for attempt in 1 2 3 4 5; do
    if "$DIR/pgctl" start >/dev/null 2>&1; then started=1; break; fi
    grep -q "Address already in use" "$DIR/server.log" 2>/dev/null || break
    echo "with-postgres: port $PORT taken meanwhile, retrying (attempt $attempt)" >&2
    pick_port
    sed -i "s/^port = .*/port = $PORT/" "$DATA/postgresql.conf"
    : >"$DIR/server.log"
done
[ -n "$started" ] || { cat "$DIR/server.log" >&2; exit 1; }
as_pg "$PG_BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres yarl_test

export YARL_TEST_PG_URL="postgres://postgres@127.0.0.1:$PORT/yarl_test"
export YARL_TEST_PG_CTL="$DIR/pgctl"
echo "with-postgres: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT ($DIR)" >&2
"$@"
