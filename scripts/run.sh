#!/usr/bin/env bash
# `make run`: a yarl-root (embedded SQLite) and the vendored nginx with the S3 example from
# nginx-conf/, both on loopback; example quotas created with curl; a short burst that shows
# 429s; then both keep running until Ctrl-C, which stops them cleanly.
#
# Environment (set by the Makefile): NGINX_BIN, MODULE_SO, ROOT_BIN.
# RUN_DEMO_ONLY=1 stops after the burst instead of waiting for Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${NGINX_BIN:?}" "${MODULE_SO:?}" "${ROOT_BIN:?}"
RUN=$PWD/.run
ROOT_ADDR=127.0.0.1:7700
mkdir -p "$RUN/nginx/logs"

for port in 7700 8080 8081 8082; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "make run: port $port on 127.0.0.1 is already in use (an earlier make run?)" >&2
        exit 1
    fi
done

root_pid=""
nginx_pid=""
stop() {
    trap - INT TERM EXIT
    echo
    echo "stopping nginx and yarl-root"
    if [ -n "$nginx_pid" ] && kill -0 "$nginx_pid" 2>/dev/null; then
        kill -QUIT "$nginx_pid" 2>/dev/null || true
        wait "$nginx_pid" 2>/dev/null || true
    fi
    if [ -n "$root_pid" ] && kill -0 "$root_pid" 2>/dev/null; then
        kill -TERM "$root_pid" 2>/dev/null || true
        wait "$root_pid" 2>/dev/null || true
    fi
    echo "stopped; logs are in $RUN"
}
trap stop INT TERM EXIT

"$ROOT_BIN" --listen "$ROOT_ADDR" --db "sqlite://$RUN/yarl.db" --poll-interval 1s \
    >"$RUN/yarl-root.log" 2>&1 &
root_pid=$!
for _ in $(seq 1 100); do
    curl -fs "http://$ROOT_ADDR/healthz" >/dev/null 2>&1 && break
    kill -0 "$root_pid" 2>/dev/null || { cat "$RUN/yarl-root.log" >&2; exit 1; }
    sleep 0.1
done

cp nginx-conf/s3.conf "$RUN/nginx/nginx.conf"
cp "$MODULE_SO" "$RUN/nginx/ngx_http_yarl_module.so"
"$NGINX_BIN" -p "$RUN/nginx/" -c nginx.conf -t -q
"$NGINX_BIN" -p "$RUN/nginx/" -c nginx.conf -g 'daemon off;' &
nginx_pid=$!
for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break
    sleep 0.1
done

say() { printf '\n$ %s\n' "$*"; }
say "curl -s -X PUT $ROOT_ADDR/v1/quotas/s3_photos -d '{\"limit\":20,\"low_burst\":10,\"high_burst\":20,\"parent\":null}'"
curl -s -X PUT "$ROOT_ADDR/v1/quotas/s3_photos" \
    -d '{"limit":20,"low_burst":10,"high_burst":20,"parent":null}'
echo
say "curl -s -X PUT $ROOT_ADDR/v1/quotas/s3_photos_read -d '{\"limit\":5,\"low_burst\":5,\"high_burst\":10,\"parent\":\"s3_photos\"}'"
curl -s -X PUT "$ROOT_ADDR/v1/quotas/s3_photos_read" \
    -d '{"limit":5,"low_burst":5,"high_burst":10,"parent":"s3_photos"}'
echo
# Limiters learn new quotas at their next sync (1 s), roots poll the database every second.
sleep 2.5

say "for i in \$(seq 30); do curl -s -o /dev/null -w '%{http_code} ' -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/cat.jpg; sleep 0.05; done"
for _ in $(seq 30); do
    curl -s -o /dev/null -w '%{http_code} ' -H 'Host: photos.s3.example.net' \
        http://127.0.0.1:8080/cat.jpg
    sleep 0.05
done
echo
say "curl -si -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/cat.jpg   # until a 429"
for _ in $(seq 50); do
    reply=$(curl -si -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/cat.jpg || true)
    if grep -q '^HTTP/1.1 429' <<<"$reply"; then
        grep -E '^(HTTP|Retry-After|X-Yarl)' <<<"$reply"
        break
    fi
done
say "curl -s $ROOT_ADDR/v1/quotas/s3_photos_read"
curl -s "$ROOT_ADDR/v1/quotas/s3_photos_read"
echo
say "tail -n 1 $RUN/nginx/logs/access.json   # the balancer (yarl_check)"
tail -n 1 "$RUN/nginx/logs/access.json" || true
say "tail -n 1 $RUN/nginx/logs/app.json      # the application (yarl_account)"
tail -n 1 "$RUN/nginx/logs/app.json" || true
say "grep -c 'limiting requests' $RUN/nginx/logs/error.log; grep 'limiting requests' $RUN/nginx/logs/error.log | tail -n 1"
grep -c 'limiting requests' "$RUN/nginx/logs/error.log" || true
grep 'limiting requests' "$RUN/nginx/logs/error.log" | tail -n 1 || true

cat <<TXT

yarl-root on http://$ROOT_ADDR (database $RUN/yarl.db), nginx on 127.0.0.1:8080 (S3 balancer,
yarl_check), :8081 (application, yarl_account), :8082 (object store stand-in).

A 429 comes from the balancer's yarl_check (its log says REJECTED) or, when the check let the
request through an instant before the counter crossed, from the application's yarl_account.

Send traffic and watch 429s (reads of bucket "photos" are limited to 5/s, the bucket to 20/s):
  while true; do curl -s -o /dev/null -w '%{http_code}\\n' -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/cat.jpg; done | uniq -c
  curl -s -X PUT --data-binary 'hello' -H 'Host: s3.example.net' http://127.0.0.1:8080/photos/new.jpg
Watch:
  curl -s $ROOT_ADDR/v1/quotas/s3_photos_read        # live fill, rate, drop probability
  curl -s http://127.0.0.1:8080/yarl/stats            # this worker's limiter state
  tail -f $RUN/nginx/logs/access.json                # \$yarl_status per request
  grep 'limiting requests' $RUN/nginx/logs/error.log
Change a quota (takes effect within ~2 s, no reload):
  curl -s -X PUT $ROOT_ADDR/v1/quotas/s3_photos_read -d '{"limit":50,"low_burst":50,"high_burst":100,"parent":"s3_photos"}'

Ctrl-C stops both.
TXT

if [ "${RUN_DEMO_ONLY:-}" = 1 ]; then
    exit 0
fi
wait "$nginx_pid"
