#!/usr/bin/env bash
# The issue-4 measurement: 2 nginx workers, 2 roots sharing one PostgreSQL, a quota of
# LIMIT req/s hit at RATE req/s for SECONDS through yarl_account; prints the admitted rate
# per second. Everything on loopback.
#
# usage: scripts/with-postgres.sh scripts/measure-cluster.sh [LIMIT RATE SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-200} RATE=${2:-600} SECONDS_=${3:-30}
: "${YARL_TEST_PG_URL:?run me under scripts/with-postgres.sh}"
OUT=${OUT:-target/debug}
NGINX_BIN=${NGINX_BIN:-$(ls -t "$OUT"/build/nginx-sys-*/out/objs/nginx | head -n 1)}
DIR=$(mktemp -d /tmp/yarl-measure.XXXXXX)
mkdir -p "$DIR/logs" "$DIR/html"
# nginx workers run as nobody.
chmod 755 "$DIR" "$DIR/html"
echo ok >"$DIR/html/index.html"
pids=()
cleanup() {
    [ -f "$DIR/logs/nginx.pid" ] && kill -QUIT "$(cat "$DIR/logs/nginx.pid")" 2>/dev/null || true
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

for port in 7711 7712; do
    "$OUT/yarl-root" --listen "127.0.0.1:$port" --db "$YARL_TEST_PG_URL" --poll-interval 1s \
        >"$DIR/root-$port.log" 2>&1 &
    pids+=($!)
done
for port in 7711 7712; do
    for _ in $(seq 100); do curl -fs "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
done
curl -fs -X PUT 127.0.0.1:7711/v1/quotas/measured \
    -d "{\"limit\":$LIMIT,\"low_burst\":$((LIMIT * 3 / 2)),\"high_burst\":$((LIMIT * 3)),\"parent\":null}"
echo
cp "$OUT/ngx_http_yarl_module.so" "$DIR/"
cat >"$DIR/nginx.conf" <<CONF
load_module ngx_http_yarl_module.so;
worker_processes 2;
error_log logs/error.log notice;
pid logs/nginx.pid;
events { worker_connections 1024; accept_mutex off; }
http {
    access_log off;
    yarl_roots http://127.0.0.1:7711 http://127.0.0.1:7712;
    yarl_sync_interval 1s;
    server {
        # reuseport: the kernel spreads the connections over both workers.
        listen 127.0.0.1:18080 reuseport;
        root $DIR/html;
        location / { yarl_account measured; }
        location = /stats { yarl_stats; }
    }
}
CONF
"$NGINX_BIN" -p "$DIR/" -c nginx.conf
sleep 2.5
echo "quota: limit $LIMIT/s, low_burst $((LIMIT * 3 / 2)), high_burst $((LIMIT * 3)); load $RATE req/s for $SECONDS_ s"
if [ -n "${TRACE:-}" ]; then
    ( for _ in $(seq "$SECONDS_"); do
        sleep 1
        echo "A $(curl -s 127.0.0.1:7711/v1/quotas/measured | grep -o '"counter".*')"
        echo "B $(curl -s 127.0.0.1:7712/v1/quotas/measured | grep -o '"counter".*')"
        echo "W $(curl -s '127.0.0.1:18080/stats?quota=measured' | grep -o '"pid":[0-9]*\|"fill":[0-9.]*\|"rejections":[0-9]*' | tr '\n' ' ')"
      done ) &
fi
python3 scripts/loadgen.py http://127.0.0.1:18080/ "$RATE" "$SECONDS_" 12
# The page's first "pid" is the answering worker's (the agent's comes later, under "agent").
pids_seen=$(for _ in $(seq 20); do curl -s 127.0.0.1:18080/stats | grep -o '"pid":[0-9]*' | head -n 1; done | sort -u | wc -l)
echo "workers answering: $pids_seen"
