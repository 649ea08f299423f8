#!/usr/bin/env bash
# Usage: scripts/bulk-load.sh [COUNT]   (default 1000000)
#
# Starts a release yarl-root on a fresh SQLite file on a free loopback port, loads COUNT
# quotas with one `POST /v1/quotas:batch` (1 parent per 1000 quotas, the rest its
# children), checks that they all arrived, and prints the load time and the root's resident
# memory afterwards. Everything lives in a temporary directory removed at exit.
#
# The binary: $YARL_ROOT_BIN, else ${CARGO_TARGET_DIR:-target}/release/yarl-root
# (build it with `cargo build --release -p yarl-root`).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COUNT=${1:-1000000}
case "$COUNT" in ''|*[!0-9]*) echo "usage: $0 [COUNT]" >&2; exit 2 ;; esac
[ "$COUNT" -ge 1 ] && [ "$COUNT" -le 5000000 ] || { echo "COUNT must be 1..5000000" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${YARL_ROOT_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/yarl-root}
[ -x "$BIN" ] || { echo "no $BIN; run: cargo build --release -p yarl-root" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is required" >&2; exit 1; }

DIR=$(mktemp -d /tmp/yarl-bulk.XXXXXX)
PID=""
cleanup() {
    if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$DIR"
}
trap cleanup EXIT

PORT=""
for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if port_free "$p"; then PORT=$p; break; fi
done
[ -n "$PORT" ] || { echo "no free port" >&2; exit 1; }
URL="http://127.0.0.1:$PORT"

echo "generating $COUNT quotas..."
awk -v n="$COUNT" 'BEGIN {
    printf "[";
    for (i = 0; i < n; i++) {
        if (i > 0) printf ",";
        p = int(i / 1000);
        if (i % 1000 == 0)
            printf "{\"name\":\"tenant.%06d\",\"limit\":1000,\"low_burst\":2000,\"high_burst\":4000}\n", p;
        else
            printf "{\"name\":\"tenant.%06d:obj.%06d\",\"limit\":10.5,\"low_burst\":20,\"high_burst\":40,\"parent\":\"tenant.%06d\"}\n", p, i, p;
    }
    printf "]";
}' >"$DIR/batch.json"
echo "body: $(($(stat -c %s "$DIR/batch.json") / 1024 / 1024)) MiB"

RUST_LOG=${RUST_LOG:-info} "$BIN" --listen "127.0.0.1:$PORT" --db "sqlite://$DIR/yarl.db" >"$DIR/root.log" 2>&1 &
PID=$!
wait_healthz "$URL" "$PID" "$DIR/root.log"
rss() { awk '/VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$PID/status"; }
echo "root started (pid $PID), RSS $(rss)"

START=$(date +%s.%N)
HTTP=$(curl -sS --max-time 900 -o "$DIR/resp.json" -w '%{http_code}' \
    -H 'content-type: application/json' --data-binary "@$DIR/batch.json" "$URL/v1/quotas:batch")
END=$(date +%s.%N)
echo "response $HTTP: $(cat "$DIR/resp.json")"
[ "$HTTP" = 200 ] || { tail -5 "$DIR/root.log" >&2; exit 1; }

HELD=$(curl -sf "$URL/metrics" | awk '$1 == "yarl_root_quotas" {print $2}')
[ "$HELD" = "$COUNT" ] || { echo "root holds $HELD quotas, expected $COUNT" >&2; exit 1; }
curl -sf "$URL/v1/quotas/tenant.000000:obj.000001" >/dev/null || { echo "GET of a loaded quota failed" >&2; exit 1; }

echo "loaded $COUNT quotas in $(awk -v a="$START" -v b="$END" 'BEGIN {printf "%.2f", b - a}') s"
echo "root RSS after the load: $(rss) (peak $(awk '/VmHWM/ {printf "%.1f MiB", $2 / 1024}' "/proc/$PID/status"))"
echo "database file: $(du -sh "$DIR" | awk '{print $1}') (incl. the request body)"
