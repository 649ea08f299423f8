# Helpers shared by the scripts in scripts/: sourced, not run, with
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Bash only (/dev/tcp). Nothing here runs when sourced; the functions use only their
# arguments and the variables named in their comments.

# port_free PORT: whether nothing answers on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port [USED]: a port from 20000-59999 that nothing answers on, on stdout. With USED (a
# file), never one already listed there, and the port is added to it: for scripts that pick
# several ports before anything listens on them. Exits the script if 100 tries find none.
free_port() {
    local used=${1:-}
    for _ in $(seq 1 100); do
        local p=$((20000 + RANDOM % 40000))
        port_free "$p" || continue
        if [ -z "$used" ]; then
            echo "$p"
            return
        fi
        if ! grep -qx "$p" "$used" 2>/dev/null; then
            echo "$p" >>"$used"
            echo "$p"
            return
        fi
    done
    echo "no free port" >&2; exit 1
}

# wait_healthz URL PID LOG: until URL/healthz answers, for at most about 10 s (then it returns
# and the caller's next request tells); if PID exits first, prints LOG to stderr and exits.
wait_healthz() {
    local url=$1 pid=$2 log=$3
    for _ in $(seq 1 100); do
        curl -sf "$url/healthz" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
    done
}

# start_root DIR PORT [LAUNCHER...]: starts $ROOT_BIN on 127.0.0.1:PORT with an SQLite
# database and its log (root.log) in DIR, through LAUNCHER when given (e.g. `nice -n 19`);
# sets ROOT_URL and ROOT_PID (the caller stops it) and waits for it as wait_healthz does.
start_root() {
    local dir=$1 port=$2
    shift 2
    ROOT_URL="http://127.0.0.1:$port"
    "$@" "$ROOT_BIN" --listen "127.0.0.1:$port" --db "sqlite://$dir/yarl.db" >"$dir/root.log" 2>&1 &
    ROOT_PID=$!
    wait_healthz "$ROOT_URL" "$ROOT_PID" "$dir/root.log"
}

# load_bench_quotas URL DIR TENANTS BUCKETS LEAVES: loads the benchmarks' quota tree into the
# root at URL with one batch (DIR holds the body meanwhile) and prints how long it took:
# TENANTS "tenant-N", BUCKETS "tenant-N.bM" under them, LEAVES "s3_bucket-NNNNNNN_read"
# under the buckets, all with limits too large to ever reject. Needs curl and bc.
load_bench_quotas() {
    local url=$1 dir=$2 tenants=$3 buckets=$4 leaves=$5 start
    echo "loading $((tenants + buckets + leaves)) quotas into the root..."
    awk -v t="$tenants" -v b="$buckets" -v l="$leaves" 'BEGIN {
        q = "\"limit\":1000000,\"low_burst\":1000000000,\"high_burst\":1000000000";
        printf "[";
        for (i = 0; i < t; i++) printf "%s{\"name\":\"tenant-%d\",%s}\n", (i ? "," : ""), i, q;
        for (i = 0; i < b; i++) printf ",{\"name\":\"tenant-%d.b%d\",%s,\"parent\":\"tenant-%d\"}\n", i % t, i, q, i % t;
        for (i = 0; i < l; i++) { k = i % b; printf ",{\"name\":\"s3_bucket-%07d_read\",%s,\"parent\":\"tenant-%d.b%d\"}\n", i, q, k % t, k; }
        printf "]";
    }' >"$dir/batch.json"
    start=$(date +%s.%N)
    curl -sf -X POST --data-binary "@$dir/batch.json" "$url/v1/quotas:batch" >/dev/null
    echo "loaded in $(echo "$(date +%s.%N) - $start" | bc) s"
    rm -f "$dir/batch.json"
}

# The wrk rounds of bench-nginx.sh and bench-tower.sh.

# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# to_ms: wrk's latencies on stdin (it prints 123.45us, 1.23ms, 1.02s), in milliseconds.
to_ms() {
    awk '{v = $1; if (v ~ /us$/) {sub(/us$/, "", v); v /= 1000} else if (v ~ /ms$/) {sub(/ms$/, "", v)} else if (v ~ /s$/) {sub(/s$/, "", v); v *= 1000} print v}'
}

# rotated ROUND WORD...: the words, one a line, rotated by (ROUND - 1) / 2 and read
# backwards in even rounds (round 1 keeps their order): interleaved rounds in which each
# variant goes first in turn and follows a different one each way, so what a variant
# leaves behind (the sync agent's work on its counts) does not always fall on the same
# next one.
rotated() {
    local round=$1
    shift
    printf '%s\n' "$@" | awk -v r="$round" '{a[NR] = $0} END {
        k = int((r - 1) / 2)
        for (i = 0; i < NR; i++) { j = r % 2 ? i : NR - 1 - i; print a[(j + k) % NR + 1] } }'
}

# wrk_figures VARIANT OUT: from OUT, a report of `wrk --latency`, sets WRK_RPS (requests per
# second) and WRK_P99 (ms), empty where OUT lacks them, WRK_NON2XX and WRK_SOCKERR (socket
# errors and timeouts; 0 if none); warns on stderr, naming VARIANT, of either.
wrk_figures() {
    local non2xx sockerr
    WRK_RPS=$(echo "$2" | awk '/^Requests\/sec:/ {print $2}')
    WRK_P99=$(echo "$2" | awk '$1 == "99%" {print $2}' | to_ms)
    non2xx=$(echo "$2" | awk '/Non-2xx/ {print $NF}')
    WRK_NON2XX=${non2xx:-0}
    [ -z "$non2xx" ] || echo "  warning: $1 had $non2xx non-2xx answers" >&2
    # wrk counts a connect, read or write error or a timed-out request apart from the
    # requests it reports: a round that lost any measured a server that failed some.
    sockerr=$(echo "$2" | awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10}')
    WRK_SOCKERR=${sockerr:-0}
    [ "$WRK_SOCKERR" = 0 ] || echo "  warning: $1 had $WRK_SOCKERR socket errors or timeouts" >&2
}
