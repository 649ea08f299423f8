#!/usr/bin/env bash
# `make run`: a yarl-root (embedded SQLite), the S3-style application (examples/s3-app,
# yarl-s3-app: each handler accounts its own quota through yarl-tower) and the vendored nginx
# with the S3 example from nginx-conf/ in front of it (yarl_check on the bucket quotas), all
# on loopback; example quotas created with curl; a demo where one costly listing drains the
# bucket's read quota that GETs barely touch, until nginx refuses the bucket's reads; then
# everything keeps running until Ctrl-C, which stops it cleanly.
#
# Environment (set by the Makefile): NGINX_BIN, MODULE_SO, ROOT_BIN, S3_APP_BIN.
# RUN_DEMO_ONLY=1 stops after the demo instead of waiting for Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

: "${NGINX_BIN:?}" "${MODULE_SO:?}" "${ROOT_BIN:?}" "${S3_APP_BIN:?}"
RUN=$PWD/.run
ROOT_ADDR=127.0.0.1:7700
mkdir -p "$RUN/nginx/logs"

for port in 7700 8080 8081; do
    if ! port_free "$port"; then
        echo "make run: port $port on 127.0.0.1 is already in use (an earlier make run?)" >&2
        exit 1
    fi
done

root_pid=""
app_pid=""
nginx_pid=""
stop() {
    trap - INT TERM EXIT
    echo
    echo "stopping nginx, yarl-s3-app and yarl-root"
    if [ -n "$nginx_pid" ] && kill -0 "$nginx_pid" 2>/dev/null; then
        kill -QUIT "$nginx_pid" 2>/dev/null || true
        wait "$nginx_pid" 2>/dev/null || true
    fi
    # The application sends its last counts to the root before it exits.
    if [ -n "$app_pid" ] && kill -0 "$app_pid" 2>/dev/null; then
        kill -TERM "$app_pid" 2>/dev/null || true
        wait "$app_pid" 2>/dev/null || true
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
wait_healthz "http://$ROOT_ADDR" "$root_pid" "$RUN/yarl-root.log"

# The application: accounts each handler's quota; one JSON line per request in its log.
"$S3_APP_BIN" --listen 127.0.0.1:8081 --root "http://$ROOT_ADDR" --access-log \
    >"$RUN/s3-app.log" 2>"$RUN/s3-app.err" &
app_pid=$!

cp nginx-conf/s3.conf "$RUN/nginx/nginx.conf"
cp "$MODULE_SO" "$RUN/nginx/ngx_http_yarl_module.so"
"$NGINX_BIN" -p "$RUN/nginx/" -c nginx.conf -t -q
# Emptied so that what a failed start shows of it is this run's.
: >"$RUN/nginx/logs/error.log"
"$NGINX_BIN" -p "$RUN/nginx/" -c nginx.conf -g 'daemon off;' &
nginx_pid=$!

# wait_port PORT PID NAME LOG: until 127.0.0.1:PORT accepts, for at most 10 s; exits with
# the end of LOG if PID (NAME) dies first or the port never opens.
wait_port() {
    local port=$1 pid=$2 name=$3 log=$4 why
    for _ in $(seq 1 100); do
        port_free "$port" || return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        why="does not listen on 127.0.0.1:$port after 10 s"
    else
        why="exited before it listened on 127.0.0.1:$port"
    fi
    echo "make run: $name $why; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
}
wait_port 8081 "$app_pid" yarl-s3-app "$RUN/s3-app.err"
wait_port 8080 "$nginx_pid" nginx "$RUN/nginx/logs/error.log"

say() { printf '\n$ %s\n' "$*"; }
note() { printf '# %s\n' "$*"; }
json_fill() { sed -n 's/.*"fill":\([0-9.]*\).*/\1/p'; }
app_fill() { # the application's own estimate of quota $1 (what it counted, draining)
    curl -s "http://127.0.0.1:8081/_yarl/status?quota=$1" | json_fill | awk '{printf "%.1f", $1}'
}
S3=(-H 'Host: s3.example.net')
PHOTOS=(-H 'Host: photos.s3.example.net')

echo
note "Quotas: nginx checks the bucket's read quota s3_photos_read (10 units/s, bursts 20..40);"
note "the application accounts its handlers' quotas, whose parent it is."
batch='[{"name":"s3_photos_read","limit":10,"low_burst":20,"high_burst":40,"parent":null},
 {"name":"s3_photos_write","limit":1000,"low_burst":1000,"high_burst":2000,"parent":null},
 {"name":"s3_photos_get","limit":1000,"low_burst":1000,"high_burst":2000,"parent":"s3_photos_read"},
 {"name":"s3_photos_list","limit":1000,"low_burst":1000,"high_burst":2000,"parent":"s3_photos_read"},
 {"name":"s3_photos_put","limit":1000,"low_burst":1000,"high_burst":2000,"parent":"s3_photos_write"}]'
say "curl -sS --fail-with-body -X POST $ROOT_ADDR/v1/quotas:batch -d '$batch'"
if ! curl -sS --fail-with-body -X POST "$ROOT_ADDR/v1/quotas:batch" -d "$batch"; then
    echo >&2
    echo "make run: the root did not take the example quotas (above); its log: $RUN/yarl-root.log" >&2
    exit 1
fi
echo
# Limiters learn new quotas at their next sync (1 s), roots poll the database every second.
sleep 2.5

say "curl -s -X PUT -H 'Host: s3.example.net' http://127.0.0.1:8080/photos   # the bucket"
curl -s -o /dev/null -w '%{http_code}\n' -X PUT "${S3[@]}" http://127.0.0.1:8080/photos
say "for i in \$(seq 200); do curl -s -X PUT --data-binary \"photo \$i\" -H 'Host: s3.example.net' http://127.0.0.1:8080/photos/\$i.jpg; done"
for i in $(seq 200); do
    curl -s -o /dev/null -w '%{http_code}\n' -X PUT --data-binary "photo $i" "${S3[@]}" \
        "http://127.0.0.1:8080/photos/$i.jpg"
done | sort | uniq -c | awk '{printf "%s x %s\n", $1, $2}'

echo
note "Ten GETs: the application accounts 1 unit each to s3_photos_get and its parent."
say "for i in \$(seq 10); do curl -s -o /dev/null -w '%{http_code} ' -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/\$i.jpg; done"
before=$(app_fill s3_photos_read)
for i in $(seq 10); do
    curl -s -o /dev/null -w '%{http_code} ' "${PHOTOS[@]}" "http://127.0.0.1:8080/$i.jpg"
done
echo
after_gets=$(app_fill s3_photos_read)
say "curl -s 'http://127.0.0.1:8081/_yarl/status?quota=s3_photos_read'   # the application's view"
echo "s3_photos_read fill: ${before:-?} before, ${after_gets:-?} after the ten GETs"

echo
note "One listing of the bucket: the application accounts 1 unit up front, then charges"
note "the objects it returned (the Cost its handler reports) to s3_photos_list and its parent."
say "curl -s -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/"
# Into a file, then cut: piping curl into head makes it fail with a write error (23) once
# head has what it wants, and pipefail would end the demo there.
curl -s -D "$RUN/list.headers" -o "$RUN/list.body" "${PHOTOS[@]}" http://127.0.0.1:8080/
head -c 110 "$RUN/list.body"
echo ...
grep -iE '^(HTTP|X-Yarl)' "$RUN/list.headers" || true
after_list=$(app_fill s3_photos_read)
say "curl -s 'http://127.0.0.1:8081/_yarl/status?quota=s3_photos_read'   # the application's view"
echo "s3_photos_read fill: ${after_list:-?} after the listing"

# The application syncs within 1 s, nginx within the next second.
sleep 2.2
echo
note "The root keeps a counter at most at high_burst + 0.25 s of its limit (42.5 here) and"
note "feeds the rest of the listing's cost in with the application's next syncs, as it drains."
say "curl -s $ROOT_ADDR/v1/quotas/s3_photos_read"
curl -s "$ROOT_ADDR/v1/quotas/s3_photos_read"
echo

echo
note "nginx learnt the bucket's fill from the root: it refuses most of the bucket's reads"
note "itself (yarl_check, counting nothing); the application refuses the ones it lets through."
say "curl -si -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/1.jpg   # until nginx refuses one"
for _ in $(seq 20); do
    reply=$(curl -si "${PHOTOS[@]}" http://127.0.0.1:8080/1.jpg || true)
    if grep -q '^X-Yarl-Status: REJECTED' <<<"$reply"; then
        grep -E '^(HTTP|Retry-After|RateLimit|X-Yarl)' <<<"$reply"
        break
    fi
    sleep 0.1
done
app_before=$(wc -l <"$RUN/s3-app.log")
say "for i in \$(seq 20); do curl -s -o /dev/null -w '%{http_code} %header{x-yarl-status}\\n' -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/\$i.jpg; sleep 0.1; done | sort | uniq -c"
for i in $(seq 20); do
    curl -s -o /dev/null -w '%{http_code} %header{x-yarl-status}\n' "${PHOTOS[@]}" \
        "http://127.0.0.1:8080/$i.jpg"
    sleep 0.1
done | sort | uniq -c
app_after=$(wc -l <"$RUN/s3-app.log")
echo "$((app_after - app_before)) of the 20 reached the application"
say "curl -s -o /dev/null -w '%{http_code}\\n' -X PUT --data-binary x -H 'Host: s3.example.net' http://127.0.0.1:8080/photos/new.jpg   # writes go on"
curl -s -o /dev/null -w '%{http_code}\n' -X PUT --data-binary x "${S3[@]}" \
    http://127.0.0.1:8080/photos/new.jpg
say "tail -n 1 $RUN/nginx/logs/access.json   # the balancer (yarl_check)"
tail -n 1 "$RUN/nginx/logs/access.json" || true
say "tail -n 1 $RUN/s3-app.log                # the application (handler quotas)"
tail -n 1 "$RUN/s3-app.log" || true

cat <<TXT

Ten GETs cost the bucket's read quota 10 units; one listing of 200 objects cost it 201,
five times its high_burst, so nginx refuses the bucket's reads for about
(fill - low_burst) / limit = $(awk -v f="${after_list:-20}" 'BEGIN {printf "%.0f", (f - 20) / 10}') seconds, without counting anything itself.

yarl-root on http://$ROOT_ADDR (database $RUN/yarl.db), nginx on 127.0.0.1:8080 (S3 balancer,
yarl_check), yarl-s3-app on 127.0.0.1:8081 (the application, yarl-tower; log $RUN/s3-app.log).

A 429 with X-Yarl-Status REJECTED comes from nginx; with X-Yarl-Status PASSED, from the
application's own handler quota (it counts at once, nginx learns within two seconds).

Send traffic and watch (reads of bucket "photos": 10 units/s, a listing costs 1 + objects):
  while true; do curl -s -o /dev/null -w '%{http_code} %header{x-yarl-status}\\n' -H 'Host: photos.s3.example.net' http://127.0.0.1:8080/1.jpg; done | uniq -c
  curl -s -H 'Host: photos.s3.example.net' 'http://127.0.0.1:8080/?max-keys=10'
  curl -s -X PUT --data-binary 'hello' -H 'Host: s3.example.net' http://127.0.0.1:8080/photos/new.jpg
Watch:
  curl -s $ROOT_ADDR/v1/quotas/s3_photos_read          # live fill, rate, drop probability
  curl -s http://127.0.0.1:8080/yarl/stats              # nginx's limiter
  curl -s 'http://127.0.0.1:8081/_yarl/status?quota=s3_photos_list'   # the application's
  tail -f $RUN/nginx/logs/access.json                  # \$yarl_status per request
  tail -f $RUN/s3-app.log
Change a quota (takes effect within ~2 s, no reload, no restart):
  curl -s -X PUT $ROOT_ADDR/v1/quotas/s3_photos_read -d '{"limit":100,"low_burst":200,"high_burst":400,"parent":null}'

Ctrl-C stops all three.
TXT

if [ "${RUN_DEMO_ONLY:-}" = 1 ]; then
    exit 0
fi
wait "$nginx_pid"
