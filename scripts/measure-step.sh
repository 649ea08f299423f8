#!/usr/bin/env bash
# The issue-13 measurement on real nginx: 2 roots sharing one PostgreSQL, 2 nginx with 2
# workers each, a quota of LIMIT req/s. The load runs at LIMIT/2 for 6 s (so every host has
# a rate to run ahead of), then steps to 10 x LIMIT over both nginx; the script prints what
# was admitted per 100 ms around the step, once with `yarl_sync_early on` (the default)
# and once with it off, each on a fresh quota and fresh nginx zones. Everything on loopback.
#
# usage: scripts/with-postgres.sh scripts/measure-step.sh [LIMIT]
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-100}
: "${YARL_TEST_PG_URL:?run me under scripts/with-postgres.sh}"
OUT=${OUT:-target/debug}
NGINX_BIN=${NGINX_BIN:-$(ls -t "$OUT"/build/nginx-sys-*/out/objs/nginx | head -n 1)}
DIR=$(mktemp -d /tmp/yarl-step.XXXXXX)
chmod 755 "$DIR"
pids=()
stop_nginx() {
    local n
    for n in a b; do
        if [ -f "$DIR/$n/logs/nginx.pid" ]; then
            kill -QUIT "$(cat "$DIR/$n/logs/nginx.pid")" 2>/dev/null || true
        fi
    done
    sleep 1
}
cleanup() {
    stop_nginx
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

for port in 7731 7732; do
    "$OUT/yarl-root" --listen "127.0.0.1:$port" --db "$YARL_TEST_PG_URL" --poll-interval 1s \
        >"$DIR/root-$port.log" 2>&1 &
    pids+=($!)
done
for port in 7731 7732; do
    for _ in $(seq 100); do curl -fs "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
done

run() {
    local early=$1 quota=step_$1
    curl -fs -X PUT "127.0.0.1:7731/v1/quotas/$quota" \
        -d "{\"limit\":$LIMIT,\"low_burst\":$((LIMIT * 3 / 2)),\"high_burst\":$((LIMIT * 3)),\"parent\":null}" \
        >/dev/null
    local n port=18090
    for n in a b; do
        port=$((port + 1))
        rm -rf "${DIR:?}/$n"
        mkdir -p "$DIR/$n/logs" "$DIR/$n/html"
        chmod 755 "$DIR/$n" "$DIR/$n/html"
        echo ok >"$DIR/$n/html/index.html"
        cp "$OUT/ngx_http_yarl_module.so" "$DIR/$n/"
        cat >"$DIR/$n/nginx.conf" <<CONF
load_module ngx_http_yarl_module.so;
worker_processes 2;
error_log logs/error.log notice;
pid logs/nginx.pid;
events { worker_connections 1024; accept_mutex off; }
http {
    access_log off;
    yarl_roots http://127.0.0.1:7731 http://127.0.0.1:7732;
    yarl_sync_interval 1s;
    yarl_sync_early $early;
    server {
        listen 127.0.0.1:$port reuseport;
        root $DIR/$n/html;
        location / { yarl_account $quota; }
        location = /stats { yarl_stats; }
    }
}
CONF
        "$NGINX_BIN" -p "$DIR/$n/" -c nginx.conf
    done
    # Both nginx hold the quota before the load starts.
    # An unknown name passes every request, which would read as overshoot: stop instead.
    for port in 18091 18092; do
        held=
        for _ in $(seq 50); do
            curl -fs "127.0.0.1:$port/stats?quota=$quota" | grep -q '"limit"' && { held=1; break; }
            sleep 0.1
        done
        [ -n "$held" ] || { echo "the nginx on port $port did not get quota $quota within 5 s" >&2; exit 1; }
    done
    echo "== yarl_sync_early $early: quota $quota, limit $LIMIT/s, low_burst $((LIMIT * 3 / 2)), high_burst $((LIMIT * 3)); $((LIMIT / 2)) req/s, then $((LIMIT * 10)) req/s from 6 s"
    python3 scripts/step-load.py http://127.0.0.1:18091/,http://127.0.0.1:18092/ \
        $((LIMIT / 2)) $((LIMIT * 10)) 6 10 "$LIMIT" 16
    for port in 18091 18092; do
        printf 'nginx :%s: ' "$port"
        curl -fs "127.0.0.1:$port/stats" | grep -o '"rounds":[0-9]*,"early_rounds":[0-9]*'
    done
    stop_nginx
}

run on
run off
