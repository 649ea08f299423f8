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
# yarl-root holding the quotas (the same 3-level tree as `make bench-nginx`), which runs at
# the lowest priority as if it were another machine. No variant ever rejects (huge limits):
# this measures the cost of deciding. Every variant gets the same wrk Lua script (a random
# leaf name as the path), so wrk's own cost is the same everywhere. The server runs one
# runtime thread pinned to CPU 0, wrk one thread on CPU 1. Rounds are interleaved (every
# variant once per round, the order rotated), each BENCH_SECONDS long; the table shows the
# medians over BENCH_ROUNDS rounds and, as the noise, each variant's spread (max - min) over
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

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
    for _ in $(seq 1 100); do
        local p=$((20000 + RANDOM % 40000))
        if port_free "$p" && ! grep -qx "$p" "$DIR/ports" 2>/dev/null; then
            echo "$p" >>"$DIR/ports"
            echo "$p"
            return
        fi
    done
    echo "no free port" >&2; exit 1
}

ROOT_PORT=$(free_port)
ROOT_URL="http://127.0.0.1:$ROOT_PORT"
nice -n 19 "$ROOT_BIN" --listen "127.0.0.1:$ROOT_PORT" --db "sqlite://$DIR/yarl.db" >"$DIR/root.log" 2>&1 &
ROOT_PID=$!
for _ in $(seq 1 100); do
    curl -sf "$ROOT_URL/healthz" >/dev/null 2>&1 && break
    kill -0 "$ROOT_PID" 2>/dev/null || { cat "$DIR/root.log" >&2; exit 1; }
    sleep 0.1
done

echo "loading $QUOTAS quotas into the root..."
awk -v t="$TENANTS" -v b="$BUCKETS" -v l="$LEAVES" 'BEGIN {
    q = "\"limit\":1000000,\"low_burst\":1000000000,\"high_burst\":1000000000";
    printf "[";
    for (i = 0; i < t; i++) printf "%s{\"name\":\"tenant-%d\",%s}\n", (i ? "," : ""), i, q;
    for (i = 0; i < b; i++) printf ",{\"name\":\"tenant-%d.b%d\",%s,\"parent\":\"tenant-%d\"}\n", i % t, i, q, i % t;
    for (i = 0; i < l; i++) { k = i % b; printf ",{\"name\":\"s3_bucket-%07d_read\",%s,\"parent\":\"tenant-%d.b%d\"}\n", i, q, k % t, k; }
    printf "]";
}' >"$DIR/batch.json"
start=$(date +%s.%N)
curl -sf -X POST --data-binary "@$DIR/batch.json" "$ROOT_URL/v1/quotas:batch" >/dev/null
echo "loaded in $(echo "$(date +%s.%N) - $start" | bc) s"
rm -f "$DIR/batch.json"

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
for v in $VARIANTS; do PORT[$v]=$(free_port); done

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

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
spread() { sort -g | awk '{a[NR] = $1} END {print a[NR] - a[1]}'; }
to_ms() {
    # wrk prints 123.45us, 1.23ms, 1.02s
    awk '{v = $1; if (v ~ /us$/) {sub(/us$/, "", v); v /= 1000} else if (v ~ /ms$/) {sub(/ms$/, "", v)} else if (v ~ /s$/) {sub(/s$/, "", v); v *= 1000} print v}'
}
run_wrk() { # VARIANT SECONDS [--latency]
    taskset -c 1 wrk -t1 -c"$CONNS" -d"$2s" ${3:-} -s "$DIR/bench.lua" "http://127.0.0.1:${PORT[$1]}"
}

# Warm up every variant (yarl1m touches its million counters as it goes).
for v in $VARIANTS; do run_wrk "$v" 2 >/dev/null; done
load_before=$(cut -d' ' -f1 /proc/loadavg)
for round in $(seq 1 "$ROUNDS"); do
    order=$(echo $VARIANTS | tr ' ' '\n' | awk -v r="$round" '{a[NR] = $0} END {for (i = 0; i < NR; i++) print a[(i + r - 1) % NR + 1]}')
    for v in $order; do
        out=$(run_wrk "$v" "$SECONDS_PER" --latency)
        rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
        p99=$(echo "$out" | awk '$1 == "99%" {print $2}' | to_ms)
        non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
        [ -z "$non2xx" ] || echo "  warning: $v had $non2xx non-2xx answers" >&2
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
