#!/usr/bin/env bash
# Usage: scripts/bench-tower.sh   (run through `make bench-tower`, which builds the release
# binaries and installs wrk)
#
# An axum hello-world, side by side in one process and one run (tower/examples/
# bench_server.rs), every variant served the same way (into_make_service_with_connect_info):
#
#   plain      no layer
#   governor   tower-governor, its documented keyed setup (peer IP), per process
#   yarl1      yarl-tower, every request accounted to one quota (a leaf with 2 ancestors)
#   yarl1m     yarl-tower, a random leaf per request across 989,001 (1,000,001 quotas)
#
# The yarl variants limit cluster-wide: their limiter syncs every second with a release
# yarl-root holding the quotas (the same 3-level tree as `make bench-nginx`), which runs on
# wrk's CPU when it would idle, as if it were another machine. No variant ever rejects (huge limits):
# this measures the cost of deciding. Every variant gets the same wrk Lua script (a random
# leaf name as the path), so wrk's own cost is the same everywhere. The server runs one
# runtime thread pinned to CPU 0, wrk one thread on CPU 1. Rounds are interleaved (every
# variant once per round, the order rotated, reversed every other round), each
# BENCH_SECONDS long; the table shows the medians over BENCH_ROUNDS rounds and, as the noise, each variant's spread (max - min) over
# its median. Bounded: about (4 × BENCH_ROUNDS + 4) × BENCH_SECONDS plus the quota load.
#
# Then the same four services without any network (tower/examples/layer_cost.rs): called in
# a loop on CPU 0, BENCH_INPROC_REQUESTS per round, the median nanoseconds per request: the
# layers' own cost, which the HTTP figures blur on a shared machine.
#
# Env: ROOT_BIN, BENCH_SERVER, LAYER_COST (release builds), BENCH_SECONDS (5),
# BENCH_ROUNDS (5), BENCH_CONNECTIONS (16), BENCH_QUOTAS_LEAVES (989001),
# BENCH_INPROC_REQUESTS (1000000).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${ROOT_BIN:?}" "${BENCH_SERVER:?}" "${LAYER_COST:?}"
SECONDS_PER=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-5}
CONNS=${BENCH_CONNECTIONS:-16}
TENANTS=1000
BUCKETS=10000
LEAVES=${BENCH_QUOTAS_LEAVES:-989001}
QUOTAS=$((TENANTS + BUCKETS + LEAVES))
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)" >&2; exit 1; }
command -v bc >/dev/null || { echo "bc is required (apt-get install bc)" >&2; exit 1; }

DIR=$(mktemp -d /tmp/yarl-bench-tower.XXXXXX)
ROOT_PID=""
SERVER_PID=""
cleanup() {
    for pid in $SERVER_PID $ROOT_PID; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$DIR"
}
trap cleanup EXIT

# The server's ports are picked before it listens on them: free_port keeps every port
# apart through $DIR/ports.
ROOT_PORT=$(free_port "$DIR/ports")
# The root stands for another machine, as in bench-nginx.sh: on wrk's CPU (1) and only when
# that CPU would idle (SCHED_IDLE), so its work for yarl1m (every counter the variant
# changes) is not taken from the server's CPU. At nice 19 on any CPU it could be.
start_root "$DIR" "$ROOT_PORT" taskset -c 1 chrt --idle 0
load_bench_quotas "$ROOT_URL" "$DIR" "$TENANTS" "$BUCKETS" "$LEAVES"

cat >"$DIR/bench.lua" <<EOF
local leaves = $LEAVES
math.randomseed(os.time())
request = function()
    return wrk.format("GET", string.format("/s3_bucket-%07d_read", math.random(0, leaves - 1)))
end
EOF

VARIANTS="plain governor yarl1 yarl1m"
declare -A PORT LABEL=([plain]="axum hello-world, no layer"
    [governor]="tower-governor, keyed by peer IP (per process)"
    [yarl1]="yarl-tower, one quota (cluster-wide)"
    [yarl1m]="yarl-tower, random quota across 1M (cluster-wide)")
for v in $VARIANTS; do PORT[$v]=$(free_port "$DIR/ports"); done

echo "starting the bench server; its limiter syncs $QUOTAS quotas from the root..."
start=$(date +%s.%N)
BENCH_THREADS=1 taskset -c 0 "$BENCH_SERVER" "$ROOT_URL" "$QUOTAS" \
    "${PORT[plain]}" "${PORT[governor]}" "${PORT[yarl1]}" "${PORT[yarl1m]}" \
    >"$DIR/server.out" 2>"$DIR/server.err" &
SERVER_PID=$!
for _ in $(seq 1 2400); do
    grep -q '^ready' "$DIR/server.out" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$DIR/server.err" >&2; exit 1; }
    sleep 0.25
done
grep -q '^ready' "$DIR/server.out" || { echo "the bench server did not get ready" >&2; exit 1; }
cat "$DIR/server.err"

spread() { sort -g | awk '{a[NR] = $1} END {print a[NR] - a[1]}'; }
run_wrk() { # VARIANT SECONDS [--latency]
    taskset -c 1 wrk -t1 -c"$CONNS" -d"$2s" ${3:-} -s "$DIR/bench.lua" "http://127.0.0.1:${PORT[$1]}"
}

# Warm up every variant (yarl1m touches its million counters as it goes).
for v in $VARIANTS; do run_wrk "$v" 2 >/dev/null; done
load_before=$(cut -d' ' -f1 /proc/loadavg)
for round in $(seq 1 "$ROUNDS"); do
    order=$(rotated "$round" $VARIANTS)
    for v in $order; do
        out=$(run_wrk "$v" "$SECONDS_PER" --latency)
        wrk_figures "$v" "$out"
        rps=$WRK_RPS p99=$WRK_P99
        echo "$rps" >>"$DIR/$v.rps"
        echo "$p99" >>"$DIR/$v.p99"
        printf '  round %d %-9s %9.0f req/s  p99 %.3f ms\n' "$round" "$v" "$rps" "$p99"
    done
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
status=$(curl -s "$ROOT_URL/metrics" | awk '/^yarl_root_sync_requests_total/ {s += $2} END {print s + 0}')
kill -TERM "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
echo "in process (no network)..."
inproc=$(taskset -c 0 "$LAYER_COST" "${BENCH_INPROC_REQUESTS:-1000000}" "$ROUNDS")

echo
echo "## make bench-tower: $QUOTAS quotas, medians of $ROUNDS interleaved rounds of ${SECONDS_PER} s, wrk -t1 -c$CONNS (CPU 1), server 1 thread (CPU 0)"
echo
echo "| variant | req/s | vs no layer | p99 ms | p99 vs no layer | noise (req/s max-min / median) |"
echo "|---|---|---|---|---|---|"
plain_rps=$(median <"$DIR/plain.rps")
plain_p99=$(median <"$DIR/plain.p99")
for v in $VARIANTS; do
    rps=$(median <"$DIR/$v.rps")
    p99=$(median <"$DIR/$v.p99")
    noise=$(echo "$(spread <"$DIR/$v.rps") / $rps * 100" | bc -l)
    printf '| %s | %.0f | %.3f | %.3f | %.2f | %.1f %% |\n' "${LABEL[$v]}" "$rps" \
        "$(echo "$rps / $plain_rps" | bc -l)" "$p99" "$(echo "$p99 / $plain_p99" | bc -l)" "$noise"
    eval "RPS_$v=$rps"
done
echo
echo "Load average (1 min) before/after the rounds: $load_before / $load_after (2 CPUs; anything"
echo "above 2 means other work shared the CPUs). The root answered $status sync requests."
echo
echo "### The layers' own cost (in process, one thread on CPU 0)"
echo
echo "$inproc"
echo
echo "### Target"
# Also per round: the two variants ran within seconds of each other, so a burst of other
# work on the machine moves both; the median of those ratios is the steadier figure.
ratio=$(echo "$RPS_yarl1 / $RPS_governor" | bc -l)
per_round=$(paste "$DIR/yarl1.rps" "$DIR/governor.rps" | awk '{printf "%.3f\n", $1 / $2}')
round_ratio=$(echo "$per_round" | median)
ok=$(echo "$round_ratio >= 0.95" | bc -l)
printf -- '- yarl-tower one quota vs tower-governor: %.3f of its throughput (median of the per-round ratios %s; ratio of the medians %.3f); target >= 0.95: %s\n' \
    "$round_ratio" "$(echo $per_round | tr ' ' ',')" "$ratio" "$([ "$ok" = 1 ] && echo met || echo MISSED)"
